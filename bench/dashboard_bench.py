"""Dashboard redraw cost as a run grows: what one live redraw of the notebook dashboard takes.

Writes the logs of a synthetic three-site run (events.jsonl's kinds and links.jsonl's rows at
the rates a real run has: a link row per site per second, a Ping batch per site every 5 s, a
round every 30 s) for 5, 30 and 60 minutes, then times what one live redraw builds and sends,
the new way (`current_charts`: read what the link log gained, build the report's figures with
every series thinned to 400 points, serialize) against the baseline of the way it was done before
(`previous_charts`: re-read the whole link log, build the full figures, thin their traces after
plotly has validated every point, serialize; its outages are drawn the new, cheaper way, so the
baseline is if anything flattered). Also one whole `Dashboard.redraw()` (charts plus the status
line, progress bar and widget updates). Best of 3, one core.

    python bench/dashboard_bench.py [--minutes 5 30 60]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save, single_core

single_core()

import numpy as np  # noqa: E402
import plotly.io as pio  # noqa: E402

from wantrain.telemetry.charts import figures  # noqa: E402
from wantrain.studies.compression import best_of  # noqa: E402
from wantrain.ui import Dashboard  # noqa: E402

SITES = ("us-west", "eu-west", "ap-southeast")
ROUND_S = 30.0


def synthetic_run(minutes: float, seed: int = 0) -> list[dict]:
    """The telemetry events of a run of `minutes` as Watch sends them: the PS's, and the link
    emulator's relayed into the same stream."""
    rng = np.random.default_rng(seed)
    t0, end = 1.7e9, 1.7e9 + 60 * minutes
    events: list[dict] = [{"kind": "run_start", "t": t0, "elapsed_s": 0.0, "val_loss": 5.5}]
    links: list[dict] = [{"kind": "links_start", "t": t0, "sites": [{"name": s} for s in SITES]}]
    sent = {s: [0, 0] for s in SITES}
    for i, t in enumerate(np.arange(t0, end, 1.0)):
        for k, s in enumerate(SITES):
            sent[s][0] += int(rng.integers(0, 2_000_000))
            sent[s][1] += int(rng.integers(0, 2_000_000))
            links.append({"kind": "link", "t": float(t), "site": s, "trace_rtt_ms": 70.0 + 80 * k,
                          "bytes_up": sent[s][0], "bytes_down": sent[s][1]})
            if i % 5 == k:
                probes = [float(t) + j for j in range(5)]
                events.append({"kind": "link_rtt", "t": probes[-1], "times": probes, "site": s,
                               "rtt_ms": list(70.0 + 80 * k + rng.exponential(5, 5))})
        if i % int(ROUND_S) == int(ROUND_S) - 1:
            r = i // int(ROUND_S)
            events.append({"kind": "round_start", "t": float(t) - ROUND_S + 1, "round": r})
            for s in SITES:
                events.append({"kind": "site_round", "t": float(t), "elapsed_s": float(t - t0), "site": s, "round": r,
                               "train_loss": 4.0 - r / 100, "wire_bytes": 790_000, "raw_bytes": 3_500_000,
                               "huffman_bits_per_symbol": 6.8})
            events.append({"kind": "round_end", "t": float(t), "elapsed_s": float(t - t0), "round": r,
                           "val_loss": 3.0 - r / 200, "wire_bytes": 800_000, "round_s": ROUND_S})
        if i % 600 == 300:
            links.append({"kind": "outage_start", "t": float(t), "site": SITES[2]})
            links.append({"kind": "outage_end", "t": float(t) + 5, "site": SITES[2]})
    return sorted(events + links, key=lambda e: e["t"])


def previous_charts(events: list[dict], max_points: int = 400) -> None:
    """The redraw's charts before: built whole, thinned afterwards."""
    for fig in figures(events):
        for tr in fig.data:
            if tr.x is not None and len(tr.x) > max_points:
                keep = np.unique(np.linspace(0, len(tr.x) - 1, max_points).round().astype(int))
                tr.x, tr.y = [tr.x[i] for i in keep], [tr.y[i] for i in keep]
        pio.to_json(fig, validate=False)


def current_charts(events: list[dict], max_points: int = 400) -> None:
    """The redraw's charts now: every series thinned before plotly."""
    for fig in figures(events, max_points=max_points):
        pio.to_json(fig, validate=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[5, 30, 60])
    args = ap.parse_args()
    out = []
    for minutes in args.minutes:
        events = synthetic_run(minutes)
        links = [e for e in events if e["kind"] in ("link", "links_start", "outage_start", "outage_end")]
        dash = Dashboard(min_interval_s=1e9)
        for e in events:
            dash.add(e)
        t_base = best_of(lambda ev=events: previous_charts(ev), repeats=3)
        t_new = best_of(lambda ev=events: current_charts(ev), repeats=3)
        t_redraw = best_of(dash.redraw, repeats=3)
        sent_kb = sum(len(s) for s in dash._sent.values()) / 1e3
        row = {"minutes": minutes, "events": len(events), "link_rows": len(links),
               "previous_charts_s": round(t_base, 4), "current_charts_s": round(t_new, 4),
               "current_over_previous": round(t_new / t_base, 3), "whole_redraw_s": round(t_redraw, 4),
               "sent_kb": round(sent_kb, 1)}
        out.append(row)
        print(f"{minutes:5.0f} min: {len(events):5d} events, {len(links):5d} link rows | charts: previous "
              f"{t_base * 1e3:6.1f} ms, now {t_new * 1e3:6.1f} ms ({t_new / t_base:.2f}x) | whole redraw "
              f"{t_redraw * 1e3:6.1f} ms | {sent_kb:.0f} kB sent")
    print("saved", save("dashboard", {"rows": out}))


if __name__ == "__main__":
    main()
