"""A site: dials the parameter server, trains inner steps, pushes its delta, applies updates.

    session.py   Site and SiteOptions: the stream to the PS and what it does with each message
    replica.py   the global model as the site holds it
    uplink.py    its deltas: error feedback, pushed, settled
    retry.py     when a session fails: retry with backoff, stop, or give up
    train.py     the inner loop (AdamW steps, LR schedule, speed emulation), also used by studies/compression.py
    progress.py  how a model download shows its progress

Imported on first use, as `wantrain`'s own names are: `wantrain worker` (commands/worker.py)
declares its options without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"Site": "wantrain.site.session", "SiteOptions": "wantrain.site.session",
         "default_device": "wantrain.site.session", "InnerLoop": "wantrain.site.train"}

__all__ = ["Site", "SiteOptions", "InnerLoop", "default_device"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'wantrain.site' has no attribute {name!r}")
