"""The downlink's order: which chunks of a round's update a site needs before it trains again.

A site waits for the whole update before its next round, so on a slow downlink every byte of it
is on the round's critical path. Most of an update's energy sits in a few tensors, though, and a
round started without the rest drifts by little (Weintraub's bounded-drift rule). With
recovery.downlink_budget, the PS sends the update in two parts (docs/protocol.md 6):

    head   every critical chunk (norms, biases, small tensors: transport/roles.py) and the most
           energetic others, until what is left holds at most the budget's share of the energy;
           then the RoundResult (its `tail_chunks` says how many follow) and the next RoundStart
    tail   the rest, the most energetic first: the site trains meanwhile and adds each chunk to its
           replica and to the parameters it trains as it lands (site/schedule.py), so its delta is
           still the steps it took; its hash report waits for the last chunk

The energy is that of each chunk as every replica decodes it (sum of squares, float64).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codec import Codec
from ..transport.messages import TensorChunk
from ..outer.screening import sum_of_squares

__all__ = ["update_energies", "split_update"]


def update_energies(update: Sequence[TensorChunk]) -> list[float]:
    """Each update chunk's energy as the sites decode it."""
    return [sum_of_squares(x) for x in Codec.extract_many([c.data for c in update])]


def split_update(update: Sequence[TensorChunk], energies: Sequence[float], roles: dict[str, str],
                 budget: float) -> tuple[list[TensorChunk], list[TensorChunk]]:
    """(head, tail) of `update` (see the module's doc): the tail holds at most `budget` of the
    energy and no critical chunk, most energetic first; the head keeps the update's order."""
    total = sum(energies)
    # Candidates for the tail: the least energetic non-critical chunks, as long as they fit.
    by_energy = sorted((i for i, c in enumerate(update) if roles[c.spec.tensor] != "critical"),
                       key=lambda i: (energies[i], -i))
    tail: list[int] = []
    left = budget * total
    for i in by_energy:
        if energies[i] > left:
            break
        left -= energies[i]
        tail.append(i)
    in_tail = set(tail)
    return ([c for i, c in enumerate(update) if i not in in_tail],
            [update[i] for i in reversed(tail)])
