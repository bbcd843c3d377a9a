"""The tutorials' size switch: `WANTRAIN_QUICK=1` shrinks rounds and steps for CI.

Every tutorial picks its sizes with `sized(full, quick)`, so CI (nbmake) runs the very same
cells and code paths as a reader does, only with fewer rounds and steps (in 03, on smaller
batches; in 07 and 08, only the arms their later cells read). Any value other than empty or "0" turns quick mode on.
"""

from __future__ import annotations

import os

__all__ = ["QUICK_ENV", "quick_mode", "sized"]

QUICK_ENV = "WANTRAIN_QUICK"


def quick_mode() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def sized(full, quick):
    """`quick` under WANTRAIN_QUICK=1 (CI), else `full`."""
    return quick if quick_mode() else full
