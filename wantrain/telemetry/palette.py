"""One colour per site, the same in every chart of a run: the report, the live dashboard and the
tutorials' own figures.

A site's colour follows its place in the run's site list (the config in `run_start`), then the
order in which other names first appear; black, red and grey stay free for what is not a site
(the global model's validation loss, outages, the downlink).
"""

from __future__ import annotations

__all__ = ["SITE_COLOURS", "site_colours", "run_start_time"]

# Plotly's qualitative "D3" palette without its red and grey (those mean outage and downlink here).
SITE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")


def site_colours(events: list[dict], names: list[str] | None = None) -> dict[str, str]:
    """Site name -> colour, for every site the events (or `names`) mention."""
    order: list[str] = []
    for e in events:
        if e.get("kind") == "run_start":
            order += [s for s in (e.get("config") or {}).get("sites") or [] if s not in order]
        site = e.get("site")
        if isinstance(site, str) and site not in order:
            order.append(site)
    order += [n for n in names or [] if n not in order]
    return {name: SITE_COLOURS[i % len(SITE_COLOURS)] for i, name in enumerate(order)}


def run_start_time(events: list[dict]) -> float:
    """The Unix time the run's clock starts at (elapsed_s 0): every chart's x axis counts from it."""
    for e in events:
        if "elapsed_s" in e:
            return e["t"] - e["elapsed_s"]
    return min((e["t"] for e in events), default=0.0)
