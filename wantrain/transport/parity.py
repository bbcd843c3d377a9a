"""XOR parity over a group of chunk payloads: any one lost member is rebuilt from the others.

A group's payloads differ in length; each is padded with zeros to the longest, and the parity is
their XOR. The receiver knows every member's length from the manifest, so a lost member is the
XOR of the parity and the members that arrived, cut to its length. One parity per group of k
costs 1/k of the group's bytes (loss recovery spends it on the chunks that carry the most energy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import WantrainError

__all__ = ["xor_parity", "rebuild"]


def xor_parity(payloads: Sequence[bytes]) -> bytes:
    """The XOR of `payloads`, each padded with zeros to the longest."""
    if not payloads:
        raise WantrainError("a parity group needs at least one member")
    acc = np.zeros(max(len(p) for p in payloads), np.uint8)
    for p in payloads:
        acc[:len(p)] ^= np.frombuffer(p, np.uint8)
    return acc.tobytes()


def rebuild(parity: bytes, present: Sequence[bytes], length: int) -> bytes:
    """The one missing member of a group, `length` bytes long, from its parity and every other member."""
    if length > len(parity) or any(len(p) > len(parity) for p in present):
        raise WantrainError(f"a parity of {len(parity)} bytes cannot cover a member of "
                            f"{max([length, *map(len, present)])} bytes")
    acc = np.frombuffer(parity, np.uint8).copy()
    for p in present:
        acc[:len(p)] ^= np.frombuffer(p, np.uint8)
    if acc[length:].any():
        raise WantrainError("the parity does not match the members that arrived")
    return acc[:length].tobytes()
