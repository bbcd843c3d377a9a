"""Streaming DiLoCo's fragments (train.fragments): which tensors a round synchronizes.

With train.fragments = P > 1 the model's tensors are cut, in their order, into P fragments of about
equal size, and round r synchronizes fragment r mod P alone: the sites send that fragment's delta,
the PS takes its outer step on those tensors (their momentum moves only then), and every other
tensor trains on at each site from where it was, its delta zero and its error feedback untouched.
Run with P times the rounds of 1/P the inner steps, each fragment is synchronized every H steps, as
in DiLoCo, while a round carries a P-th of the model's change (Douillard et al., "Streaming DiLoCo
with overlapping communication", 2025; the overlap of a fragment's sync with the next steps, and
its mixing factor, are not built: under wantrain's sync schedule a site waits for each update).

The PS and every site cut the same model's tensor sizes in the same order, so they agree on the
fragments without a message; the replay of a round takes the same fragment from its round number.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["fragments", "synced"]


def fragments(sizes: dict[str, int], n: int) -> list[frozenset[str]]:
    """The tensors of `sizes` (name -> elements, in the model's order) cut into `n` contiguous
    fragments of about equal elements, none empty."""
    if not 1 <= n <= len(sizes):
        raise ConfigError(f"train.fragments must be 1 to the model's {len(sizes)} tensors, got {n}")
    total = sum(sizes.values())
    names = list(sizes)
    cuts: list[frozenset[str]] = []
    start, seen = 0, 0
    for i, name in enumerate(names):
        seen += sizes[name]
        left_tensors, left_cuts = len(names) - i - 1, n - len(cuts) - 1
        # cut once this fragment has its share, or when each fragment still to come needs a tensor
        if left_cuts > 0 and (seen >= total * (len(cuts) + 1) / n or left_tensors == left_cuts):
            cuts.append(frozenset(names[start:i + 1]))
            start = i + 1
    cuts.append(frozenset(names[start:]))
    return cuts


def synced(sizes: dict[str, int], n: int, round_: int) -> frozenset[str] | None:
    """The tensors round `round_` synchronizes; None: all of them (n = 1, plain DiLoCo)."""
    return None if n <= 1 else fragments(sizes, n)[round_ % n]
