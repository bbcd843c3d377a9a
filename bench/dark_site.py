"""A site dark for 200 s, unscaled, in a long run: it comes back on its own stream.

The same run as tests/test_dark_site.py (three sites, rounds of a 1 s compute budget, a fixed 2 s
deadline, real processes and the link emulator), with one outage of 200 s, the longest the
testbed models and 100 times the deadline. It checks what the test checks (no disconnect, no
model download, every round once, every replica check equal, the dark site's delta handled by
`late_policy` and named in its log) and measures what the outage cost:

    rounds without the site    rounds that committed while it owed its delta
    backlog MB                 the updates it received after its link came back (its catch-up,
                               on its own stream)
    back after s               from the link's return to the first round it was counted in
    model download MB          what a model download (fp32) would have cost instead: with a model this
                               small and rounds this short, the backlog is the dearer way back; with
                               a 1B model (rounds of minutes, a 4.9 GB download) it is the cheaper

    python bench/dark_site.py [--outage 200] [--policy drop]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import save  # noqa: E402

from tests.test_dark_site import DEADLINE_S, check_dark_site, dark_run  # noqa: E402
from wantrain.telemetry import rows  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outage", type=float, default=200.0, help="seconds the third site's link is dark")
    ap.add_argument("--policy", default="drop", choices=["drop", "stale"], help="recovery.late_policy")
    args = ap.parse_args()
    # Rounds last a little over their 1 s budget: enough for the outage and about 30 after it.
    rounds = int(args.outage / 1.0) + 40
    with tempfile.TemporaryDirectory() as tmp:
        events, dark, log = dark_run(Path(tmp), args.policy, [args.outage / DEADLINE_S], rounds, preset="tiny")
        check_dark_site(events, dark, log, rounds, {"dropped", "kept", "deferred"})
    start = next(e for e in rows(events, "outage_start") if e["site"] == dark)
    end = next(e for e in rows(events, "outage_end") if e["site"] == dark and e["t"] > start["t"])
    owed = max(e["round"] for e in rows(events, "round_start") if e["t"] <= start["t"])   # its round when it went dark
    late = next(e for e in rows(events, "late_delta") if e["site"] == dark and e["round"] >= owed)
    without = [e for e in rows(events, "round_end") if dark not in e["sites"] and e["round"] >= late["round"]
               and e["t"] < end["t"] + 60]
    back = next(e for e in rows(events, "round_end") if e["round"] > late["round"] and dark in e["sites"])
    backlog_mb = sum(e["wire_bytes"] for e in rows(events, "round_end")
                     if late["round"] <= e["round"] < back["round"]) / 1e6
    model_mb = 4 * rows(events, "run_start")[0]["num_params"] / 1e6
    result = {"outage_s": end["t"] - start["t"], "deadline_s": DEADLINE_S, "policy": args.policy, "rounds": rounds,
              "rounds_without_the_site": len(without), "late_delta": late["action"],
              "backlog_mb": backlog_mb, "back_after_s": back["t"] - end["t"], "model_download_mb": model_mb,
              "joins": len(rows(events, "join")), "leaves_before_the_end": 0}
    path = save("dark_site", result)
    print(f"a {result['outage_s']:.0f} s outage ({result['outage_s'] / DEADLINE_S:.0f}x the {DEADLINE_S:g} s deadline), "
          f"late_policy {args.policy}: {len(without)} rounds committed without the site; its delta of round "
          f"{late['round']} {late['action']}; after its link came back it applied {backlog_mb:.1f} MB of updates on "
          f"its stream (a model download would have been {model_mb:.1f} MB) and was counted again "
          f"{result['back_after_s']:.1f} s "
          f"later; {result['joins']} joins, no disconnect")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
