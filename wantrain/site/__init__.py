"""A site: dials the parameter server, trains inner steps, pushes its delta, applies updates.

    session.py   Site and SiteOptions: the stream to the PS and what it does with each message
    retry.py     when a session fails: retry with backoff, stop, or give up
    train.py     the inner loop (AdamW steps, LR schedule, speed emulation), also used by study.py
    progress.py  how a model download shows its progress
"""

from .session import Site, SiteOptions, default_device
from .train import InnerLoop

__all__ = ["Site", "SiteOptions", "InnerLoop", "default_device"]
