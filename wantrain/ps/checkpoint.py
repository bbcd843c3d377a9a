"""PS checkpoints: everything needed to resume a run exactly, written atomically.

A checkpoint holds the global parameters, the outer optimizer's momentum, the downlink
error-feedback residual, the committed round, the parameter hashes, the site registry and the
run's config. It is written to a temporary file in the same folder, flushed and fsync'ed, then
renamed over the old one (and the folder fsync'ed), so a kill at any moment leaves either the
old checkpoint or the new one, never a torn file. The PS writes it before it announces a round,
so a round is committed exactly when its checkpoint exists.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "CHECKPOINT_NAME", "CHECKPOINT_VERSION"]

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_VERSION = 1


def _tensors(d: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in d.items()}


def save_checkpoint(path: str | Path, state: dict[str, Any], before_rename: Callable[[], None] | None = None) -> None:
    """Write `state` atomically; numpy arrays in the dicts named *_np become tensors.

    `before_rename` runs once the temporary file is on disk (fault-injection tests kill the
    process there)."""
    path = Path(path)
    payload: dict = {"version": CHECKPOINT_VERSION}
    for k, v in state.items():
        payload[k] = _tensors(v) if k.endswith("_np") else v
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path) -> dict[str, Any] | None:
    """The state saved at `path` (dicts named *_np back as numpy), or None if there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {payload.get('version')}, this wantrain reads "
                         f"{CHECKPOINT_VERSION}")
    return {k: ({n: t.numpy() for n, t in v.items()} if k.endswith("_np") else v) for k, v in payload.items()}
