"""`wantrain report RUN_DIR`: one self-contained HTML page of a run.

The run's settings, its headline figures with their units, where each site's time went, its
links, a row per round (run_tables.py), what happened besides the rounds, and the charts the live
dashboard draws too (charts.py).
"""

from __future__ import annotations

import html
from pathlib import Path

from .charts import figures, rtt_samples, split
from .round_time import summary_lines
from .tables import incidents, round_rows, settings
from . import on_wire, read_events, rows

__all__ = ["write_report", "summarize", "link_summary"]


def link_summary(events: list[dict]) -> list[str]:
    """One line per site link: measured RTT against the published one, outages, stalls."""
    events, links, _ = split(events)
    plan = next((ln for ln in links if ln["kind"] == "links_start"), None)
    samples = rtt_samples(events)
    lines = []
    for site in sorted(samples) if plan is None else [s["name"] for s in plan["sites"]]:
        rtts = sorted(r for _, r in samples.get(site, []))
        med = f"{rtts[len(rtts) // 2]:.0f} ms (max {rtts[-1]:.0f})" if rtts else "no probes"
        text = f"link {site}: measured RTT median {med}"
        if plan:
            info = next(s for s in plan["sites"] if s["name"] == site)
            outages = sum(1 for ln in links if ln["kind"] == "outage_start" and ln["site"] == site)
            spikes = sum(1 for ln in links if ln["kind"] == "spike" and ln["site"] == site)
            last = [ln for ln in links if ln["kind"] == "link" and ln["site"] == site]
            stalled = last[-1]["stalled_s"] if last else 0.0
            text += (f", published {info['rtt_ms']:.0f} ms ({info['region']} - {plan['ps_region']}); "
                     f"{outages} outage(s), {spikes} spike(s), {stalled:.1f} s stalled")
        lines.append(text)
    return lines


def summarize(events: list[dict]) -> dict:
    """Headline figures of a run, from its events."""
    start = rows(events, "run_start")
    ends = rows(events, "round_end")
    sites = rows(events, "site_round")
    checks = rows(events, "hash_check")
    up_raw = sum(e["raw_bytes"] for e in sites)
    up_wire = sum(on_wire(e) for e in sites)            # every byte of every delta (telemetry.on_wire)
    up_delta = sum(e["wire_bytes"] for e in sites)       # of which the encoded delta's own
    up_protection = sum(e.get("protection_bytes", 0) for e in sites)
    down_raw = sum(e["raw_bytes"] for e in ends)
    down_wire = sum(on_wire(e) for e in ends)
    hb = [e["huffman_bits_per_symbol"] for e in sites if e.get("huffman_bits_per_symbol")]
    return {
        "run_id": start[0]["run_id"] if start else "?",
        "num_params": start[0].get("num_params") if start else None,
        "rounds": len(ends),
        "initial_val_loss": start[0].get("val_loss") if start else None,
        "final_val_loss": ends[-1]["val_loss"] if ends else None,
        "wall_s": (events[-1]["elapsed_s"] - events[0]["elapsed_s"]) if events else 0.0,
        "uplink_mb": up_wire / 1e6,
        "uplink_ratio": up_raw / up_wire if up_wire else 0.0,
        "uplink_delta_mb": up_delta / 1e6,
        "uplink_protection_mb": up_protection / 1e6,
        "uplink_framing_mb": max(0, up_wire - up_delta - up_protection) / 1e6,
        "downlink_mb": down_wire / 1e6,
        "downlink_ratio": down_raw / down_wire if down_wire else 0.0,
        "huffman_bits_per_symbol": sum(hb) / len(hb) if hb else 0.0,
        "hash_checks": len(checks),
        "hash_mismatches": sum(1 for c in checks if not c["ok"]),
        "errors": len(rows(events, "error")),
        "commit_checks": len(rows(events, "check")),
        "deltas_left_out": sum(len(e["left_out"]) for e in rows(events, "check")),
    }


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write report.html (self-contained: plotly.js inlined) into the run folder or `out`: the run's
    settings and headline figures, where each site's time went, its links, a row per round, what
    happened besides the rounds, then the charts."""
    run_dir = Path(run_dir)
    everything = read_events(run_dir)
    events = split(everything)[0]
    s = summarize(events)
    figs = figures(everything)
    charts = "".join(f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs))
    headline = _table([(_SUMMARY_LABELS.get(k, k), _fmt(v)) for k, v in s.items()])
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(events) + link_summary(everything))
    columns = [("round", "{:d}"), ("val_loss", "{:.4f}"), ("round_s", "{:.2f}"), ("counted", "{:d}"), ("late", "{:d}"),
               ("missed", "{:d}"), ("uplink_mb", "{:.3f}"), ("uplink_ratio", "{:.2f}"), ("huffman_bits", "{:.3f}"),
               ("downlink_mb", "{:.3f}"), ("close", "{}")]
    heads = ["round", "validation loss", "round s (start to commit)", "sites counted", "late deltas applied",
             "sites missed", "uplink MB (all sites)", "uplink x smaller than fp32", "Huffman bits/symbol",
             "downlink MB (per site)", "closed"]
    per_round = ("<table class=rounds><tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>"
                 + "".join("<tr>" + "".join(f"<td>{html.escape(fmt.format(r[k]))}</td>" for k, fmt in columns) + "</tr>"
                           for r in round_rows(events)) + "</table>")
    happened = "".join(f"<li>{t:.1f} s: {html.escape(text)}</li>" for t, text in incidents(everything)) or "<li>none</li>"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>wantrain run {html.escape(str(s['run_id']))}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}} th{{text-align:left;padding-right:2em}}
table.rounds th,table.rounds td{{text-align:right;padding:0 0.6em;font-variant-numeric:tabular-nums}}</style>
</head><body>
<h1>wantrain run {html.escape(str(s['run_id']))}</h1>
<h2>Settings</h2>{_table([(k, html.escape(v)) for k, v in settings(events)])}
<h2>Summary</h2>{headline}<ul>{lines}</ul>
<h2>Rounds</h2>{per_round}
<h2>What happened besides the rounds</h2><ul>{happened}</ul>
<h2>Charts</h2>{charts}
</body></html>
"""
    path = Path(out) if out else run_dir / "report.html"
    path.write_text(page)
    return path


# summarize()'s keys, as the report's summary shows them: with their units.
_SUMMARY_LABELS = {
    "run_id": "run", "num_params": "parameters", "rounds": "rounds committed",
    "initial_val_loss": "validation loss before training", "final_val_loss": "validation loss at the end",
    "wall_s": "wall time (s)", "uplink_mb": "uplink, all sites (MB)", "uplink_ratio": "uplink: x smaller than fp32 (every byte)",
    "uplink_delta_mb": "of the uplink: the encoded deltas (MB)",
    "uplink_protection_mb": "of the uplink: critical copies, hedges, parity (MB)",
    "uplink_framing_mb": "of the uplink: manifests, chunk headers, metrics, gRPC framing (MB)",
    "downlink_mb": "downlink, per site (MB)", "downlink_ratio": "downlink: x smaller than fp32",
    "huffman_bits_per_symbol": "Huffman bits per symbol (uplink mean)", "hash_checks": "replica hash checks",
    "hash_mismatches": "hash mismatches", "errors": "errors",
    "commit_checks": "commits checked on held-out data (robust.check)",
    "deltas_left_out": "deltas the commit check left out (each also under what happened)",
}


def _table(pairs: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in pairs) + "</table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))
