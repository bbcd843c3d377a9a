"""The PS's journal: each committed round made durable in milliseconds, not a checkpoint's seconds.

A full checkpoint (checkpoint.py: parameters, outer momentum, downlink residual) costs seconds at
real model sizes, and a round is committed only once it is durable. So the commit point is a
small record instead, and the full state is written in the background every
`train.checkpoint_every` rounds. Recovery is the last full state plus the journal's rounds
replayed: the same deltas, weights and clip factors through the same aggregation, which is
deterministic, so the replayed state is bit-identical (each round's parameter hash is checked).

Replaying the update that was sent would give the parameters but not the outer momentum or the
downlink residual, so the journal keeps what the aggregation consumed:
  delta-<round>-<site>.npz   a site's checked delta (int8 symbols + scales), written as soon as it
                             is checked, while other sites still train: off the critical path
  delta-<round>-<site>.part.npz   the chunks of it a round counted before the rest came
                             (recovery.partial_deltas), written at that commit
  commit-<round>.json        which deltas counted with what weight and clip factor, the hash they
                             gave, and the small state (registry, data positions, screen history)
Each file is written to a temporary name, fsync'ed and renamed; a commit record also fsyncs the
folder, so the deltas it names are durable before it is.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codec import Extracted
from ..errors import CheckpointError

__all__ = ["Journal", "JOURNAL_DIR"]

JOURNAL_DIR = "journal"
_COMMIT = re.compile(r"commit-(\d{6,})\.json")
_DELTA = re.compile(r"delta-(\d{6,})-([0-9a-f]+)(\.part)?\.npz")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """One run's journal folder."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _delta_path(self, round_: int, site: str, partial: bool = False) -> Path:
        # Site names are checked text, but never trusted as a path: hex-encode them.
        return self.folder / f"delta-{round_:06d}-{site.encode().hex()}{'.part' if partial else ''}.npz"

    def write_delta(self, round_: int, site: str, parts: Sequence[Extracted | None], partial: bool = False) -> None:
        """A site's checked delta for `round_` (`partial`: the chunks of it a round counted, None where
        one was not in), durable when this returns (call it off the loop)."""
        arrays: dict[str, np.ndarray] = {"blocks": np.array([x.block if x else 0 for x in parts], np.int64),
                                         "scaled": np.array([x is not None and x.scales is not None for x in parts]),
                                         "present": np.array([x is not None for x in parts])}
        for i, x in enumerate(parts):
            if x is None:
                continue
            arrays[f"d{i}"] = x.data
            if x.scales is not None:
                arrays[f"s{i}"] = x.scales
        path = self._delta_path(round_, site, partial)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def read_delta(self, round_: int, site: str, partial: bool = False) -> list[Extracted | None]:
        path = self._delta_path(round_, site, partial)
        try:
            with np.load(path, allow_pickle=False) as z:
                blocks, scaled = z["blocks"], z["scaled"]
                present = z["present"] if "present" in z else np.ones(len(blocks), bool)
                return [Extracted(z[f"d{i}"], z[f"s{i}"] if scaled[i] else None, int(blocks[i])) if present[i] else None
                        for i in range(len(blocks))]
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: the journal's delta of {site!r} for round {round_} cannot be read "
                                  f"({e})") from None

    def commit(self, record: dict[str, Any]) -> None:
        """Write round record["round"]'s commit record; the round is durable when this returns."""
        path = self.folder / f"commit-{int(record['round']):06d}.json"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.folder)

    def commits_from(self, round_: int) -> list[dict[str, Any]]:
        """The commit records of rounds round_, round_ + 1, ... up to the first one missing."""
        have = {int(m.group(1)): p for p in self.folder.iterdir() if (m := _COMMIT.fullmatch(p.name))}
        out = []
        while round_ in have:
            try:
                out.append(json.loads(have[round_].read_text()))
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{have[round_]}: unreadable commit record ({e})") from None
            round_ += 1
        return out

    def trim(self, checkpointed_round: int, keep_deltas_from: int) -> None:
        """Forget what a full checkpoint at `checkpointed_round` holds: its earlier commit records,
        and the deltas of rounds before `keep_deltas_from` (a late delta may count rounds later)."""
        for p in self.folder.iterdir():
            m = _COMMIT.fullmatch(p.name) or _DELTA.fullmatch(p.name)
            if m is None:
                continue
            limit = checkpointed_round if p.name.startswith("commit-") else keep_deltas_from
            if int(m.group(1)) < limit:
                p.unlink(missing_ok=True)

    def clear(self) -> None:
        """A new run in this folder: nothing of an earlier one may be replayed into it."""
        for p in self.folder.iterdir():
            if p.name.startswith(("commit-", "delta-")):
                p.unlink(missing_ok=True)
