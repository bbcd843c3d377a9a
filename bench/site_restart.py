"""Site restart benchmark: a site SIGKILLed mid-run, started again, until it is ready to train.

A real run (`wantrain.launch.run.Run`: a PS and two site processes, `tiny` by default) trains with
time-budgeted rounds; site b is killed after round 1 and started again, `--restarts` times. Per
restart, from the PS's telemetry (one clock, this machine):

    start -> join     process start, imports, dial and Join
    join -> ready     Welcome, setup (data, model, optimizer) and the model download, to the
                      site's Ready: from then on it trains in the next round

Its first inner step is in the first round that starts after `ready` (how long that is depends on
the round in progress, not on the site). Side by side, in the same run: the floor, a bare process
that imports torch and creates the same AdamW (`python -c ...`).

    python bench/site_restart.py [--preset tiny] [--restarts 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save

FLOOR = ("import torch; m = torch.nn.Linear(8, 8); "
         "torch.optim.AdamW(m.parameters(), lr=1e-3, fused=False)")


def floor_s() -> float:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", FLOOR], check=True)
    return time.time() - t0


def restarts(preset: str, count: int) -> list[dict]:
    from wantrain.config import RunConfig
    from wantrain.launch.run import Run

    cfg = RunConfig().replace(**{"num_sites": 2, "model.preset": preset, "train.rounds": 4 + 3 * count,
                                 "train.round_budget_s": 1.0, "train.batch_size": 4, "train.eval_batches": 1})
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, Run(cfg, run_dir=tmp, sites=["a", "b"], tls=False) as run:
        started, want = 0.0, "round_end"
        for ev in run.follow(timeout_s=600):
            if want == "round_end" and ev["kind"] == "round_end" and ev["round"] >= 1 + 3 * len(rows):
                run.kill_site("b")
                started, want = time.time(), "join"
                run.start_site("b")
            elif want == "join" and ev["kind"] == "join" and ev.get("site") == "b" and ev["t"] > started:
                joined, want = ev["t"], "ready"
            elif want == "ready" and ev["kind"] == "ready" and ev.get("site") == "b" and ev["t"] > joined:
                rows.append({"start_to_join_s": joined - started, "join_to_ready_s": ev["t"] - joined,
                             "start_to_ready_s": ev["t"] - started})
                print(f"restart {len(rows)}: start -> join {joined - started:.2f} s, join -> ready "
                      f"{ev['t'] - joined:.2f} s, start -> ready {ev['t'] - started:.2f} s", flush=True)
                want = "round_end" if len(rows) < count else "done"
            if want == "done":
                break
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--restarts", type=int, default=3)
    args = ap.parse_args()
    rows = restarts(args.preset, args.restarts)
    floors = [floor_s() for _ in range(3)]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    floor = statistics.median(floors)
    print(f"site restart ({args.preset}), median of {len(rows)}: start -> ready {med['start_to_ready_s']:.2f} s "
          f"(join {med['start_to_join_s']:.2f} + {med['join_to_ready_s']:.2f}); floor (import torch + AdamW in a "
          f"fresh process) {floor:.2f} s; ratio {med['start_to_ready_s'] / floor:.2f}")
    save("site_restart", {"preset": args.preset, "restarts": rows, "median": med, "floor_s": floor,
                          "ratio_to_floor": med["start_to_ready_s"] / floor})


if __name__ == "__main__":
    main()
