"""The tutorials' size switch: `WANTRAIN_QUICK=1` shrinks rounds, steps and batches for CI.

Every tutorial picks its sizes with `sized(full, quick)` and starts from `tutorial_config()`, so
CI (nbmake) runs the very same cells and code paths as a reader does, only with fewer rounds and
steps of less work each. Any value other than empty or "0" turns quick mode on.
"""

from __future__ import annotations

import os

from ..config import RunConfig

__all__ = ["QUICK_ENV", "QUICK_BATCHES", "quick_mode", "sized", "tutorial_config"]

QUICK_ENV = "WANTRAIN_QUICK"
# A quick step: 4 sequences of 64 tokens, a quarter of the default step's 8 of 128 (the model is the same).
QUICK_BATCHES = {"train.batch_size": 4, "model.block_size": 64}


def quick_mode() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def sized(full, quick):
    """`quick` under WANTRAIN_QUICK=1 (CI), else `full`."""
    return quick if quick_mode() else full


def tutorial_config() -> RunConfig:
    """The configuration a tutorial starts from: RunConfig()'s defaults, with QUICK_BATCHES under
    WANTRAIN_QUICK=1."""
    return RunConfig().replace(**sized({}, QUICK_BATCHES))
