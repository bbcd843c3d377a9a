"""The charts of a run, from its events: what the live dashboard (wantrain.ui) redraws and the HTML
report (report.py) embeds, the same figures in both.

Training loss per site and validation loss of the global model against wall time; wire MB per
round (each site's uplink, the downlink update) and compression ratio per round; where each
site's round goes (round_time.py); links' RTT and throughput with the trace in force; a timeline
of joins, leaves, deadlines, loss-recovery decisions, restarts, outages and faults. Every series
can be thinned to a number of points (`thin`), for the dashboard's redraws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .palette import run_start_time, site_colours
from .round_time import LABELS as ROUND_PARTS
from .round_time import PARTS, round_splits
from .tables import describe
from . import LINK_KINDS, on_wire, rows

__all__ = ["split", "thin", "rtt_samples", "figures", "links_figure", "throughput_figure", "round_time_figure",
           "recovery_marks", "timeline_figure"]


def split(events: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(the PS's events, the link emulator's, the faults injected on purpose) of one run's events."""
    ps: list[dict] = []
    links: list[dict] = []
    faults: list[dict] = []
    for e in events:
        (links if e["kind"] in LINK_KINDS else faults if e["kind"] == "fault" else ps).append(e)
    return ps, links, faults


def thin(y, max_points: int | None) -> np.ndarray:
    """Indices of at most max_points points of the series y that keep its shape: the first and
    the last, and the lowest and the highest point of each of the equal runs between them (a delay
    spike or an outage stays visible, where evenly spaced picks would step over it). All indices
    when max_points is None or y is short enough."""
    n = len(y)
    if max_points is None or n <= max_points:
        return np.arange(n)
    if max_points < 4:
        return np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
    y = np.asarray(y, dtype=float)
    edges = np.linspace(1, n - 1, (max_points - 2) // 2 + 1).astype(int)
    keep = [0, n - 1]
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            keep += [a + int(np.argmin(y[a:b])), a + int(np.argmax(y[a:b]))]
    return np.unique(keep)


def _xy(x, y, max_points: int | None) -> tuple[list, list]:
    """The series (x, y) thinned to max_points, as lists for plotly (which validates them)."""
    idx = thin(y, max_points)
    return np.asarray(x)[idx].tolist(), np.asarray(y)[idx].tolist()


def rtt_samples(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for e in rows(events, "link_rtt"):
        out.setdefault(e["site"], []).extend(zip(e["times"], e["rtt_ms"]))
    return out


@dataclass(frozen=True)
class _Frame:
    """What every chart of one run shares, worked out once per drawing: the run's clock (t0), the
    x range over the whole run, and each site's colour."""

    t0: float
    span: list[float]
    colour: dict[str, str]

    @classmethod
    def of(cls, events: list[dict]) -> _Frame:
        t0 = run_start_time(events)
        return cls(t0, [0.0, max((e["t"] for e in events), default=t0 + 1.0) - t0], site_colours(events))


def links_figure(events: list[dict], links: list[dict], frame: _Frame, max_points: int | None = None
                 ) -> go.Figure | None:
    samples = rtt_samples(events)
    if not samples:
        return None
    t0, colour = frame.t0, frame.colour
    fig = go.Figure()
    for site in sorted(samples):
        t, rtt = np.array(samples[site], dtype=float).reshape(-1, 2).T      # (2, probes)
        x, y = _xy(t - t0, rtt, max_points)
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=f"measured RTT {site}",
                                 marker=dict(size=5, color=colour[site])))
        trace = [ln for ln in links if ln["kind"] == "link" and ln["site"] == site]
        if trace:
            x, y = _xy([ln["t"] - t0 for ln in trace], [ln["trace_rtt_ms"] for ln in trace], max_points)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(dash="dot", width=1, color=colour[site]),
                                     name=f"trace RTT in force {site}"))
    # Outages shaded as plain layout shapes (plotly's add_vrect costs ~20 ms each, and the dashboard
    # redraws); an outage still on ends "now".
    now = max([ln["t"] for ln in links] + [e["t"] for e in events])
    shapes, notes = [], []
    for ln in links:
        if ln["kind"] == "outage_start":
            end = next((m["t"] for m in links if m["kind"] == "outage_end" and m["site"] == ln["site"] and m["t"] > ln["t"]),
                       now)
            shapes.append(dict(type="rect", xref="x", yref="paper", x0=ln["t"] - t0, x1=end - t0, y0=0, y1=1,
                               fillcolor="red", opacity=0.12, line_width=0, layer="below"))
            notes.append(dict(x=ln["t"] - t0, xref="x", y=1, yref="paper", text=f"outage {ln['site']}",
                              showarrow=False, xanchor="left", yanchor="top"))
    fig.update_layout(shapes=shapes, annotations=notes,
                      title="Links: RTT measured by the sites (Ping) and the trace in force", height=420,
                      xaxis_title="seconds since start", yaxis_title="RTT (ms)", xaxis_range=frame.span)
    # A log axis labels its minor ticks ("2", "5" between the decades), which read as RTTs: label
    # 1-2-5 steps in milliseconds, and nothing else.
    fig.update_yaxes(type="log", tickvals=RTT_TICKS_MS, ticktext=[f"{v:g}" for v in RTT_TICKS_MS], minor_showgrid=False)
    return fig


RTT_TICKS_MS = [v * 10 ** k for k in range(0, 6) for v in (1, 2, 5)]


def throughput_figure(links: list[dict], frame: _Frame, max_points: int | None = None) -> go.Figure | None:
    rows_ = [ln for ln in links if ln["kind"] == "link"]
    if not rows_:
        return None
    t0, colour = frame.t0, frame.colour
    fig = go.Figure()
    for site in sorted({ln["site"] for ln in rows_}):
        mine = [ln for ln in rows_ if ln["site"] == site]
        t = np.array([ln["t"] for ln in mine])
        dt = np.diff(t)
        ok = dt > 0
        for key, label in (("bytes_up", "up"), ("bytes_down", "down")):
            sent = np.array([ln[key] for ln in mine], dtype=float)
            mbps = np.diff(sent)[ok] * 8 / dt[ok] / 1e6                # between consecutive samples
            x, y = _xy(t[1:][ok] - t0, mbps, max_points)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{site} {label} Mbit/s",
                                     line=dict(dash="solid" if label == "up" else "dot", color=colour[site])))
    fig.update_layout(title="Links: throughput through the emulator", height=380, xaxis_title="seconds since start",
                      yaxis_title="Mbit/s", xaxis_range=frame.span)
    return fig


def figures(events: list[dict], max_points: int | None = None) -> list[go.Figure]:
    """The report's charts of one run's events. max_points thins every series to about that many
    points, keeping each one's shape (`thin`): the live dashboard's bound on what one redraw
    builds and sends."""
    everything = events
    events, links, _ = split(events)
    sites = rows(events, "site_round")
    ends = rows(events, "round_end")
    start = rows(events, "run_start")
    names = sorted({e["site"] for e in sites})
    frame = _Frame.of(everything)
    colour = frame.colour

    loss = go.Figure()
    for name in names:
        mine = [e for e in sites if e["site"] == name]
        x, y = _xy([e["elapsed_s"] for e in mine], [e["train_loss"] for e in mine], max_points)
        loss.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"train loss {name} (round mean)",
                                  line=dict(color=colour[name])))
    val_x = ([start[0]["elapsed_s"]] if start and start[0].get("val_loss") is not None else []) + [e["elapsed_s"] for e in ends]
    val_y = ([start[0]["val_loss"]] if val_x and len(val_x) > len(ends) else []) + [e["val_loss"] for e in ends]
    x, y = _xy(val_x, val_y, max_points)
    loss.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name="validation loss (global model)",
                              line=dict(width=3, color="black")))
    loss.update_layout(title="Loss against wall time", xaxis_title="seconds since start", yaxis_title="loss",
                       height=420, xaxis_range=frame.span)

    wire = make_subplots(specs=[[{"secondary_y": True}]])
    for name in names:
        mine = [e for e in sites if e["site"] == name]
        x, y = _xy([e["round"] for e in mine], [on_wire(e) / 1e6 for e in mine], max_points)
        wire.add_trace(go.Bar(x=x, y=y, name=f"uplink MB {name}", marker_color=colour[name]), secondary_y=False)
    x, y = _xy([e["round"] for e in ends], [on_wire(e) / 1e6 for e in ends], max_points)
    wire.add_trace(go.Bar(x=x, y=y, name="downlink MB (update, per site)", marker_color="#7f7f7f"), secondary_y=False)
    by_round: dict[int, list[dict]] = {}
    for e in sites:
        by_round.setdefault(e["round"], []).append(e)
    rounds = sorted(by_round)
    x, y = _xy(rounds, [sum(e["raw_bytes"] for e in by_round[r]) / max(1, sum(on_wire(e) for e in by_round[r]))
                        for r in rounds], max_points)
    wire.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name="uplink: times smaller than fp32",
                              line=dict(color="black")), secondary_y=True)
    # (Huffman's bits per symbol have a unit of their own: in the report's summary, not on this axis.)
    wire.update_layout(title="Bytes on the wire and compression per round", barmode="group", height=420,
                       xaxis_title="round")
    wire.update_yaxes(title_text="MB", secondary_y=False)
    wire.update_yaxes(title_text="times smaller than fp32", secondary_y=True, rangemode="tozero")
    extra = [round_time_figure(events, max_points), controller_figure(events, frame, max_points),
             links_figure(events, links, frame, max_points),
             throughput_figure(links, frame, max_points)]
    return [loss, wire] + [f for f in extra if f is not None] + [timeline_figure(everything, max_points, frame)]


# The parts of a round (round_time.py), as drawn: the site's work in warm colours, the wire in
# blues, waiting in grey.
_PART_COLOURS = {"latency": "#9ecae1", "download": "#4292c6", "apply": "#fdae6b", "compute": "#e6550d",
                 "encode": "#fd8d3c", "other": "#d9d9d9", "upload": "#08519c", "waiting": "#969696",
                 "ps": "#756bb1"}


def round_time_figure(events: list[dict], max_points: int | None = None) -> go.Figure | None:
    """Where each site's round goes (round_time.py): per site, a stacked bar a round, its parts
    adding up to the round's wall time. With more rounds than max_points, evenly spaced rounds."""
    splits = round_splits(events)
    if not splits:
        return None
    names = list(dict.fromkeys(s["site"] for s in splits))
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=names)
    for i, name in enumerate(names):
        mine = [s for s in splits if s["site"] == name]
        if max_points and len(mine) > max_points:
            mine = [mine[j] for j in np.linspace(0, len(mine) - 1, max_points).round().astype(int)]
        for part in PARTS:
            label = ROUND_PARTS[part]
            fig.add_trace(go.Bar(x=[s["round"] for s in mine], y=[s[f"{part}_s"] for s in mine], name=label,
                                 marker_color=_PART_COLOURS[part], legendgroup=part, showlegend=i == 0,
                                 hovertemplate=f"{name}, round %{{x}}: {label} %{{y:.2f}} s<extra></extra>"),
                          row=i + 1, col=1)
        fig.update_yaxes(title_text="s", row=i + 1, col=1)
    fig.update_xaxes(title_text="round", row=len(names), col=1)
    fig.update_layout(title="Where each site's round goes (seconds of the round's wall time)", barmode="relative",
                      height=160 + 170 * len(names), bargap=0.15)
    return fig


def controller_figure(events: list[dict], frame: _Frame, max_points: int | None = None) -> go.Figure | None:
    """The controller's decisions (schedule.controller, ps/controller.py): per site and round, the
    compute budget it gave and what it measured the site's link to cost a round; the reason in the
    hover. None where the run had no controller events."""
    decisions = rows(events, "controller")
    if not decisions:
        return None
    fig = go.Figure()
    colour = frame.colour
    for name in sorted({d["site"] for d in decisions}):
        mine = [d for d in decisions if d["site"] == name]
        if max_points and len(mine) > max_points:
            mine = [mine[j] for j in np.linspace(0, len(mine) - 1, max_points).round().astype(int)]
        fig.add_trace(go.Scatter(x=[d["round"] for d in mine], y=[d["budget_s"] for d in mine], mode="lines+markers",
                                 name=f"budget {name}", line=dict(color=colour.get(name)),
                                 customdata=[d["reason"] for d in mine],
                                 hovertemplate=f"{name}, round %{{x}}: %{{y:.2f}} s<br>%{{customdata}}<extra></extra>"))
        measured = [d for d in mine if d.get("comm_s") is not None]
        fig.add_trace(go.Scatter(x=[d["round"] for d in measured], y=[d["comm_s"] for d in measured],
                                 mode="lines", name=f"link cost {name}", line=dict(color=colour.get(name), dash="dot"),
                                 hovertemplate=f"{name}, round %{{x}}: its link costs %{{y:.2f}} s a round"
                                               "<extra></extra>"))
    fig.update_layout(title="Controller: each site's compute budget and its link's cost per round",
                      xaxis_title="round", yaxis_title="seconds", height=380)
    return fig


# Markers of the timeline: event kind -> (label, colour, symbol).
_MARKERS = {
    "join": ("join", "green", "triangle-up"), "leave": ("leave", "grey", "triangle-down"),
    "deadline": ("deadline missed", "orange", "x"), "late_delta": ("late delta", "orange", "circle-open"),
    "restart": ("PS restart", "red", "star"), "quarantine": ("quarantined", "purple", "square"),
    "error": ("error", "red", "x-thin"), "outage_start": ("outage", "red", "line-ns"),
    "fault": ("fault injected", "black", "hexagram"), "alert": ("alert", "crimson", "diamond"),
}


# The loss-recovery decisions in round_end (docs/telemetry.md), marked where the round committed.
_RECOVERY_MARKERS = {
    "closed_early": ("round closed early", "goldenrod", "triangle-right"),
    "extended": ("round waited past its deadline", "darkorange", "triangle-left"),
    "counted_in_part": ("delta counted in part", "teal", "circle"),
    "reconciled": ("late chunks reconciled", "teal", "diamond-open"),
    "rebuilt": ("chunks rebuilt from parity", "seagreen", "square-open"),
    "hedged": ("chunks hedged on another lane", "slateblue", "star-triangle-up-open"),
}


def recovery_marks(events: list[dict]) -> list[dict]:
    """The recovery decisions of each round_end as timeline marks: a round closed early (the PS's
    row), the deltas it counted in part and the late ones it reconciled (their sites' rows); and
    each site_round whose delta's chunks the PS rebuilt from parity, or its site hedged on another
    lane (its site's row)."""
    marks = [{"kind": "rebuilt", "t": e["t"], "site": e["site"],
              "text": f"round {e['round']}: {e['rebuilt']} chunk(s) of {e['site']}'s delta rebuilt from parity"}
             for e in rows(events, "site_round") if e.get("rebuilt")]
    marks += [{"kind": "hedged", "t": e["t"], "site": e["site"],
               "text": f"round {e['round']}: {e['hedged']} protected chunk(s) of {e['site']}'s delta sent again on "
                       f"another lane (not acknowledged in time)"}
              for e in rows(events, "site_round") if e.get("hedged")]
    for e in rows(events, "round_end"):
        r, t = e["round"], e["t"]
        if e.get("close") == "early":
            marks.append({"kind": "closed_early", "t": t, "text": f"round {r} closed early: what was missing was "
                                                                  f"within the loss budget"})
        elif e.get("close") == "extended":
            marks.append({"kind": "extended", "t": t, "text": f"round {r} waited past its deadline until what was "
                                                              f"missing was within recovery.extend_above"})
        for site, n in e.get("partial", {}).items():
            marks.append({"kind": "counted_in_part", "t": t, "site": site,
                          "text": f"round {r}: {n} chunk(s) of {site}'s delta counted; zeros for the rest, to come"})
        for key, n in e.get("reconciled", {}).items():
            site, _, of = key.rpartition("@")
            marks.append({"kind": "reconciled", "t": t, "site": site,
                          "text": f"round {r}: {n} chunk(s) of {site}'s delta of round {of} applied outside the "
                                  f"outer momentum"})
    return marks


def timeline_figure(events: list[dict], max_points: int | None = None, frame: _Frame | None = None) -> go.Figure:
    """Joins, leaves, deadlines missed, late deltas, restarts, outages, injected faults and the
    loss-recovery decisions as markers, one row per site."""
    frame = frame or _Frame.of(events)
    t0 = frame.t0
    marks = [e for e in events if e["kind"] in _MARKERS] + recovery_marks(events)
    fig = go.Figure()
    for kind, (label, colour, symbol) in {**_MARKERS, **_RECOVERY_MARKERS}.items():
        mine = [e for e in marks if e["kind"] == kind]
        mine = [mine[i] for i in thin([e["t"] for e in mine], max_points)]
        fig.add_trace(go.Scatter(
            x=[e["t"] - t0 for e in mine], y=[e.get("site") or "PS" for e in mine], mode="markers", name=label,
            marker=dict(color=colour, symbol=symbol, size=12, line=dict(width=2, color=colour)),
            text=[mark["text"] if kind in _RECOVERY_MARKERS else describe(mark) for mark in mine],
            hoverinfo="text+x"))
    fig.update_layout(title="Timeline: joins, leaves, deadlines, recovery, restarts, outages, faults", height=300,
                      xaxis_title="seconds since start", yaxis_type="category", xaxis_range=frame.span)
    return fig
