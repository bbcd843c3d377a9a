"""Names of a run's things: its sites' default names and a fresh run folder."""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["SITE_NAMES", "default_site_names", "new_run_dir"]

SITE_NAMES = ("us-east", "eu-west", "ap-southeast", "us-west", "sa-east", "eu-north", "ap-northeast", "af-south")


def default_site_names(n: int) -> list[str]:
    return [SITE_NAMES[i] if i < len(SITE_NAMES) else f"site-{i}" for i in range(n)]


def new_run_dir(root: str | Path = "runs") -> Path:
    # mkdir itself decides which name is free: two runs started in the same second (two notebooks,
    # two test workers) must not both pass an exists() check and then collide.
    stamp = time.strftime("%Y%m%d-%H%M%S")
    Path(root).mkdir(parents=True, exist_ok=True)
    for k in range(1, 10_000):
        d = Path(root) / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run folder name under {root} for {stamp}")
