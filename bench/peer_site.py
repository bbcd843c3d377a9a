"""What a namespaced peer's site leaves for bench/peers.py (torchft's and hivemind's sites alike).

A site writes its events to `events-SITE.jsonl` in the run's folder, waits there for every site to
have joined before round 0 (as a wantrain PS opens round 0 once its sites have joined), and writes
the global parameters after each round it committed (`snap-R.pt`, the first site to get there),
stamped with the time: bench/peers.py evaluates them off the sites' critical path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class SiteRecord:
    def __init__(self, out: str | Path, site: str) -> None:
        self.out, self.site = Path(out), site
        self._events = open(self.out / f"events-{site}.jsonl", "a", buffering=1)

    def log(self, kind: str, **fields) -> None:
        self._events.write(json.dumps({"kind": kind, "t": time.time(), "site": self.site, **fields}) + "\n")

    def join_and_wait(self, sites: int) -> None:
        """Say this site is ready, then wait until `sites` sites have said so."""
        self.log("join")
        while sum('"join"' in f.read_text() for f in self.out.glob("events-*.jsonl")) < sites:
            time.sleep(0.05)

    def save_committed(self, round_: int, model) -> None:
        """The global model after a committed round, unless another site has written it."""
        import torch

        snap = self.out / f"snap-{round_}.pt"
        if snap.exists():
            return
        tmp = self.out / f".snap-{round_}-{self.site}.pt"
        torch.save({"t": time.time(), "round": round_, "site": self.site,
                    "model": {k: v.detach().clone() for k, v in model.state_dict().items()}}, tmp)
        tmp.rename(snap)
