"""What a loss-recovery run's rows say (bench/loss_recovery.py): each arm against B0, and plots.

`summary` pairs every arm's run with the reliable arm's run of the same condition and seed, so
that a gap is measured within one seed's data order and one stretch of the machine's load:

    final     final validation loss (mean of the last three rounds), its gap to B0's, in %
    speed-up  B0's time to the target / the arm's (an arm that never got there counts as never)
    p50, p99  round times past the warm-up (every arm waits for every chunk in it alike)
    up        megabytes the links carried up, as a ratio to B0's

Each figure is the mean over the seeds (± the sample standard deviation where there are two or
more). With several outer learning rates, each arm is shown at the one with its lowest mean final
loss, as issue 28 asks ("each arm at its best outer learning rate"), B0 too.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

CONDITION = ("chunk_loss", "burst", "blackout_every_s", "blackout_s", "spikes_per_min", "packet_loss", "region",
             "bandwidth_mbps")


def condition_name(row: dict) -> str:
    """'5 %', '5 % bursts 4, blackouts 5 s / 30 s', ... (what differs from a plain chunk loss)."""
    parts = [f"{row['chunk_loss'] * 100:g} %"]
    if row["burst"] != 1:
        parts.append(f"bursts {row['burst']:g}")
    if row["blackout_every_s"]:
        parts.append(f"blackouts {row['blackout_s']:g} s / {row['blackout_every_s']:g} s")
    if row["spikes_per_min"]:
        parts.append(f"spikes {row['spikes_per_min']:g}/min")
    if row["packet_loss"] or row["region"]:
        parts.append(f"packet loss {row['packet_loss']:.1%} {row['region']}".strip())
    if row["bandwidth_mbps"]:
        parts.append(f"{row['bandwidth_mbps']:g} Mbit/s")
    return ", ".join(parts)


def _key(row: dict) -> tuple:
    return tuple(row[k] for k in CONDITION)


def best_rates(rows: list[dict]) -> dict[tuple, float]:
    """(condition, arm) -> the outer learning rate with the lowest mean final loss."""
    finals: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        finals[(_key(r), r["arm"])][r["outer_lr"]].append(r["final_val_loss"])
    return {k: min(by_lr, key=lambda lr: statistics.mean(by_lr[lr])) for k, by_lr in finals.items()}


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def summary(rows: list[dict]) -> list[dict]:
    """One entry per condition and arm (at its best outer learning rate), in the rows' order."""
    best = best_rates(rows)
    chosen = [r for r in rows if r["outer_lr"] == best[(_key(r), r["arm"])]]
    base = {(_key(r), r["seed"]): r for r in chosen if r["arm"] == "reliable"}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in chosen:
        groups[(_key(r), r["arm"])].append(r)
    out = []
    for (key, arm), runs in groups.items():
        paired = [(r, base[(key, r["seed"])]) for r in runs if (key, r["seed"]) in base]
        entry = {"condition": condition_name(runs[0]), "arm": arm, "outer_lr": runs[0]["outer_lr"],
                 "seeds": len(runs), "final": _mean_sd([r["final_val_loss"] for r in runs]),
                 "p50": statistics.mean(r["p50_after_warmup_s"] for r in runs),
                 "p99": statistics.mean(r["p99_after_warmup_s"] for r in runs),
                 "never": sum(not r["reached"] for r in runs), "paired": len(paired),
                 "closes": {c: statistics.mean(r["closes"][c] for r in runs)
                            for c in ("complete", "early", "deadline", "extended")}}
        if paired:
            entry["gap_pct"] = _mean_sd([100 * (r["final_val_loss"] / b["final_val_loss"] - 1) for r, b in paired])
            ratios = [b["time_to_target_s"] / r["time_to_target_s"] for r, b in paired
                      if r["reached"] and b["reached"]]
            entry["speedup"] = _mean_sd(ratios) if ratios else None
            entry["p99_ratio"] = statistics.mean(b["p99_after_warmup_s"] / r["p99_after_warmup_s"] for r, b in paired)
            entry["up_ratio"] = statistics.mean(r["link_up_mb"] / b["link_up_mb"] for r, b in paired)
        out.append(entry)
    return out


def _pm(ms: tuple[float, float] | None, fmt: str, unit: str = "") -> str:
    if ms is None:
        return "-"
    mean, sd = ms
    return f"{mean:{fmt}}{unit} ±{sd:{fmt.lstrip('+')}}" if sd else f"{mean:{fmt}}{unit}"


def markdown(rows: list[dict], target: float) -> str:
    """The summary as a markdown table (B0: the reliable arm of the same condition and seed)."""
    lines = [f"| condition | arm | outer lr | seeds | final | gap to B0 | speed-up to {target:g} | p50 / p99 s "
             f"| p99 B0 / arm | up MB / B0 | closes c/e/d/x |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in summary(rows):
        never = f" ({e['never']} never)" if e["never"] else ""
        c = e["closes"]
        lines.append(
            f"| {e['condition']} | {e['arm']} | {e['outer_lr']:g} | {e['seeds']} | {_pm(e['final'], '.4f')} "
            f"| {_pm(e.get('gap_pct'), '+.2f', ' %')} | {_pm(e.get('speedup'), '.2f', 'x')}{never} "
            f"| {e['p50']:.2f} / {e['p99']:.2f} | {e['p99_ratio']:.2f}x | {e['up_ratio']:.3f} "
            f"| {c['complete']:.3g}/{c['early']:.2g}/{c['deadline']:.2g}/{c['extended']:.2g} |"
            if "gap_pct" in e else
            f"| {e['condition']} | {e['arm']} | {e['outer_lr']:g} | {e['seeds']} | {_pm(e['final'], '.4f')} "
            f"| - | -{never} | {e['p50']:.2f} / {e['p99']:.2f} | - | - "
            f"| {c['complete']:.3g}/{c['early']:.2g}/{c['deadline']:.2g}/{c['extended']:.2g} |")
    return "\n".join(lines)


def figure(rows: list[dict], target: float):
    """Validation loss against seconds, one panel per condition, one line per arm and seed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(dict.fromkeys(condition_name(r) for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig = make_subplots(rows=len(names), cols=1, subplot_titles=names, vertical_spacing=0.08 / max(1, len(names)))
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
    shown: set[str] = set()
    for r in rows:
        t, loss = zip(*r["curve"]) if r["curve"] else ((), ())
        colour = palette[arms.index(r["arm"]) % len(palette)]
        fig.add_trace(go.Scatter(x=t, y=loss, mode="lines", line={"color": colour, "width": 1.5},
                                 name=r["arm"], legendgroup=r["arm"], showlegend=r["arm"] not in shown,
                                 hovertext=f"{r['arm']}, seed {r['seed']}, outer lr {r['outer_lr']:g}"),
                      row=names.index(condition_name(r)) + 1, col=1)
        shown.add(r["arm"])
    for i in range(len(names)):
        fig.add_hline(y=target, line_dash="dot", line_color="grey", row=i + 1, col=1)
        fig.update_xaxes(title_text="seconds", row=i + 1, col=1)
        fig.update_yaxes(title_text="validation loss", row=i + 1, col=1)
    fig.update_layout(height=320 * len(names), title=f"Validation loss against time (target {target:g}, dotted)")
    return fig


def write(folder: Path, rows: list[dict], target: float, header: str) -> None:
    """`folder`/table.md (the summary under `header`) and `folder`/curves.html (the figure; plotly's
    script beside it, so the page opens offline)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.md").write_text(f"{header}\n\n{markdown(rows, target)}\n")
    figure(rows, target).write_html(folder / "curves.html", include_plotlyjs="directory")


def main() -> None:
    """Summarise one or more result files of bench/loss_recovery.py (several conditions run apart)."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("results", nargs="+", type=Path, help="bench/loss_recovery.py's JSON files")
    p.add_argument("--out", type=Path, required=True, help="the folder for table.md and curves.html")
    args = p.parse_args()
    loaded = [json.loads(path.read_text()) for path in args.results]
    targets = {r["target"] for r in loaded}
    if len(targets) != 1:
        p.error(f"the files were measured against different targets {sorted(targets)}")
    rows = [row for r in loaded for row in r["rows"]]
    write(args.out, rows, targets.pop(), "\n".join(f"- {path}" for path in args.results))
    print(markdown(rows, loaded[0]["target"]))


if __name__ == "__main__":
    main()
