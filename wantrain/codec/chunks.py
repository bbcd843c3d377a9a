"""Cutting named tensors into chunks that each fit one wire message, and back.

A chunk is a contiguous run of one flattened tensor (tensor name, element offset, length),
so it can be decoded and placed on its own, in any order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CodecError

__all__ = ["ChunkSpec", "plan_chunks", "join_chunks", "check_fits", "check_coverage"]


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


def join_chunks(specs: list[ChunkSpec], values: list[np.ndarray], sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Place decoded chunks into one flat float32 array per tensor.

    Every tensor of `sizes` must be covered exactly once (no gap, no overlap, nothing outside);
    otherwise CodecError names the first tensor that is not.
    """
    out = {k: np.empty(n, np.float32) for k, n in sizes.items()}
    for spec, v in zip(specs, values):
        check_fits(spec, v, sizes)
        out[spec.tensor][spec.offset: spec.offset + spec.length] = v
    check_coverage(specs, sizes)
    return out


def check_fits(spec: ChunkSpec, values: np.ndarray, sizes: dict[str, int]) -> None:
    n = sizes.get(spec.tensor)
    if n is None or spec.offset + spec.length > n or values.size != spec.length:
        raise CodecError(f"chunk [{spec.offset}, {spec.offset + spec.length}) does not fit tensor {spec.tensor!r}")


def check_coverage(specs: list[ChunkSpec], sizes: dict[str, int]) -> None:
    """Every tensor of `sizes` covered exactly once by `specs`; CodecError names the first that is not."""
    spans: dict[str, list[tuple[int, int]]] = {k: [] for k in sizes}
    for spec in specs:
        if spec.tensor not in spans:
            raise CodecError(f"chunk names unknown tensor {spec.tensor!r}")
        spans[spec.tensor].append((spec.offset, spec.offset + spec.length))
    for name, n in sizes.items():
        end = 0
        for a, b in sorted(spans[name]):
            if a != end:
                raise CodecError(f"tensor {name!r} is not covered exactly once (at element {min(a, end)})")
            end = b
        if end != n:
            raise CodecError(f"tensor {name!r} is not covered exactly once (at element {end})")
