"""The control panel's site table: a `SiteRow` of widgets per site of the scenario.

A row owns its widgets (name, runs_on, device, procs, link, bandwidth, trace, speed, log, status)
and what they say: the site's name, where it runs, its scenario entry with the row's edits, and the
state of its SSH host as the host is prepared. The table is one CSS grid, headers included, so the
headers and the columns line up, and its columns shrink to fit JupyterLab's output area (about
820 px in a 1,000 px window): fixed widths for the short fields, fractions of the rest for the others,
full texts in tooltips where a placeholder would be cut. Each widget a browser test or a screenshot
needs to find has a stable CSS class (`wantrain-runs-on`, `wantrain-host`, `wantrain-log`).
"""

from __future__ import annotations

import dataclasses
import functools
import html
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError
from ..launch import RemotePS, RemoteSite
from ..launch.plan import SitePlan

__all__ = ["DEVICES", "COLUMNS", "SiteRow", "site_table", "remote_hosts", "ps_host"]

DEVICES = ("auto", "cpu", "cuda")
WHERE = "this machine, or ssh://user@host[:port]"
# (role, header, grid track): the tracks' minimums and gaps add up to 790 px, under the ~820 px of
# JupyterLab's output area in a 1,000 px window (sidebar closed); wider, the named columns grow.
COLUMNS = (("name", "site", "minmax(92px, 1fr)"), ("runs_on", "runs on", "minmax(110px, 2fr)"),
           ("device", "device", "74px"), ("procs", "procs", "56px"), ("link", "link (scenario)", "minmax(96px, 1.4fr)"),
           ("bandwidth", "Mbit/s", "76px"), ("trace", "link trace", "minmax(70px, 1fr)"), ("speed", "speed x", "64px"),
           ("log", "log", "36px"), ("status", "host", "minmax(80px, 1.4fr)"))


class SiteRow:
    """The widgets of one site's row, from its scenario entry."""

    def __init__(self, s: SitePlan) -> None:
        import ipywidgets as W

        fill = functools.partial(W.Layout, width="auto", min_width="0")     # as wide as its grid column
        self.plan = s
        self.name = W.Text(s.name, layout=fill())
        self.runs_on = W.Text("", placeholder="this machine", tooltip=WHERE, layout=fill())
        self.device = W.Dropdown(options=DEVICES, value="auto", layout=fill())
        self.procs = W.BoundedIntText(1, min=1, max=64, tooltip="processes (GPUs) of the site: a torch.distributed "
                                      "group", layout=fill())
        self.link = W.HTML(f"{html.escape(s.region)}, {s.rtt_ms:.0f} ms RTT", layout=fill())
        self.bandwidth = W.BoundedFloatText(s.bandwidth_mbps or 0.0, min=0.0, max=100_000.0, step=1.0,
                                            tooltip="Mbit/s each way; 0: unlimited", layout=fill())
        self.trace = W.Text(s.trace or "", placeholder="scenario's", tooltip="a CSV trace of the link (empty: the "
                            "scenario's trace)", layout=fill())
        self.speed = W.BoundedFloatText(s.speed_factor, min=1.0, max=100.0, step=0.25, layout=fill())
        self.log = W.Button(icon="file-text", tooltip="show the end of this site's log", layout=fill())
        self.status = W.HTML("", layout=fill())
        for widget, css in ((self.runs_on, "runs-on"), (self.status, "host"), (self.log, "log")):
            widget.add_class(f"wantrain-{css}")

    @property
    def site(self) -> str:
        return self.name.value.strip()

    @property
    def where(self) -> str:
        return self.runs_on.value.strip()

    def widgets(self) -> list:
        return [getattr(self, role) for role, _, _ in COLUMNS]

    def edited_plan(self) -> SitePlan:
        """The scenario's entry with this row's edits (name, bandwidth, trace, speed factor)."""
        trace = self.trace.value.strip() or None
        if trace and not Path(trace).is_file():
            raise ConfigError(f"site {self.name.value}: trace file {trace!r} does not exist")
        return dataclasses.replace(self.plan, name=self.site, speed_factor=float(self.speed.value),
                                   bandwidth_mbps=float(self.bandwidth.value) or None,
                                   trace=str(Path(trace).resolve()) if trace else None)

    def host_said(self, message: str) -> None:
        """Where its SSH host's preparation stands (inspecting, installing, its GPUs)."""
        self.status.value = html.escape(message.split(": ", 1)[-1])


def site_table(rows: list[SiteRow]):
    """The header and the rows in one grid, in COLUMNS order."""
    import ipywidgets as W

    head = [W.HTML(f"<b>{title}</b>", layout=W.Layout(min_width="0")) for _, title, _ in COLUMNS]
    cells = head + [w for r in rows for w in r.widgets()]
    grid = W.GridBox(cells, layout=W.Layout(grid_template_columns=" ".join(track for _, _, track in COLUMNS),
                                            grid_gap="2px 4px", width="100%", min_width="790px", align_items="center"))
    return W.Box([grid], layout=W.Layout(overflow="auto", width="100%"))   # narrower (a sidebar open): it scrolls


def _here(where: str) -> bool:
    return where in ("", "this machine", "local")


def remote_hosts(rows: list[SiteRow], ssh: dict) -> dict[str, RemoteSite | str]:
    """The SSH hosts of the rows that run on one (`ssh`: the options for every one of them); each
    row's host column follows its host's preparation. ConfigError names a row's bad "runs on"."""
    hosts: dict[str, RemoteSite | str] = {}
    for r in rows:
        r.status.value = ""
        if _here(r.where):
            continue
        if not r.where.startswith("ssh://"):
            raise ConfigError(f"site {r.site}: runs on {r.where!r}: give 'this machine' or ssh://user@host[:port]")
        hosts[r.site] = RemoteSite(r.where, progress=r.host_said, **ssh)
        r.status.value = html.escape(f"connecting to {r.where}")
    return hosts


def ps_host(where: str, ssh: dict, progress: Callable[[str], None]) -> RemotePS | None:
    """The PS's SSH host, or None for this machine."""
    where = where.strip()
    if _here(where):
        return None
    if not where.startswith("ssh://"):
        raise ConfigError(f"the PS runs on {where!r}: give 'this machine' or ssh://user@host[:port]")
    return RemotePS(where, progress=progress, **ssh)
