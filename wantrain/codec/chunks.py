"""Cutting named tensors into chunks that each fit one wire message, and back.

A chunk is a contiguous run of one flattened tensor (tensor name, element offset, length),
so it can be decoded and placed on its own, in any order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CodecError

__all__ = ["ChunkSpec", "plan_chunks"]


@dataclass(frozen=True)
class ChunkSpec:
    tensor: str
    offset: int
    length: int


def plan_chunks(sizes: dict[str, int], chunk_elements: int) -> list[ChunkSpec]:
    """Chunks covering every tensor in order; each at most `chunk_elements` long."""
    if chunk_elements <= 0:
        raise CodecError(f"chunk_elements must be positive, got {chunk_elements}")
    plan = []
    for name, n in sizes.items():
        for off in range(0, n, chunk_elements):
            plan.append(ChunkSpec(name, off, min(chunk_elements, n - off)))
    return plan
