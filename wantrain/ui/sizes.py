"""The tutorials' size switch: `WANTRAIN_QUICK=1` shrinks rounds and steps for CI.

Every tutorial picks its sizes with `sized(full, quick)`, so CI (nbmake) runs the very same
cells and code paths as a reader does, only with fewer rounds and steps, their runs on smaller batches (4
sequences of 64 tokens instead of 8 of 128: a quarter of the CPU a step) of a smaller model where the
cells' claims do not depend on its size (`micro`, 2 layers of 64, instead of `tiny`: a quarter again;
a `ControlPanel` given no config gets both from `panel_config`), and in 07 and 08 only the arms their
later cells read. Any value other than empty or "0" turns quick mode on.
"""

from __future__ import annotations

import os

from ..config import RunConfig

__all__ = ["QUICK_ENV", "panel_config", "quick_mode", "sized"]

QUICK_ENV = "WANTRAIN_QUICK"


def quick_mode() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def sized(full, quick):
    """`quick` under WANTRAIN_QUICK=1 (CI), else `full`."""
    return quick if quick_mode() else full


def panel_config() -> RunConfig:
    """The config a `ControlPanel` starts from when given none: the defaults, on smaller batches of
    the `micro` model under WANTRAIN_QUICK=1."""
    return RunConfig().replace(**sized({}, {"train.batch_size": 4, "model.block_size": 64, "model.preset": "micro"}))
