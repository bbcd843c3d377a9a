"""The control panel's site table: one row of widgets per site of the scenario.

A row is a dict of widgets by role (name, runs_on, device, procs, link, bandwidth, trace, speed,
log, status); the panel reads and writes them by role. Each widget that a browser test or a
screenshot needs to find has a stable CSS class (`wantrain-runs-on`, `wantrain-host`, `wantrain-log`).
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable

from ..errors import ConfigError
from ..launch import RemotePS, RemoteSite
from ..plan import SitePlan

__all__ = ["DEVICES", "site_row", "site_table", "remote_hosts", "ps_host"]

DEVICES = ("auto", "cpu", "cuda")
WHERE = "this machine, or ssh://user@host[:port]"
COLUMNS = (("name", "site", "130px"), ("runs_on", "runs on", "230px"), ("device", "device", "80px"),
           ("procs", "procs", "60px"), ("link", "link (scenario)", "200px"), ("bandwidth", "Mbit/s", "90px"),
           ("trace", "link trace", "220px"), ("speed", "speed x", "80px"), ("log", "log", "40px"),
           ("status", "host", "300px"))


def site_row(s: SitePlan) -> dict:
    """The widgets of one site's row, from its scenario entry."""
    import ipywidgets as W

    width = {role: W.Layout(width=w) for role, _, w in COLUMNS}
    row = dict(
        name=W.Text(s.name, layout=width["name"]),
        runs_on=W.Text("", placeholder=WHERE, layout=width["runs_on"]),
        device=W.Dropdown(options=DEVICES, value="auto", layout=width["device"]),
        procs=W.BoundedIntText(1, min=1, max=64, tooltip="processes (GPUs) of the site: a torch.distributed group",
                               layout=width["procs"]),
        link=W.HTML(f"{html.escape(s.region)}, {s.rtt_ms:.0f} ms RTT", layout=width["link"]),
        bandwidth=W.BoundedFloatText(s.bandwidth_mbps or 0.0, min=0.0, max=100_000.0, step=1.0,
                                     tooltip="Mbit/s each way; 0: unlimited", layout=width["bandwidth"]),
        trace=W.Text(s.trace or "", placeholder="scenario trace (or a CSV path)", layout=width["trace"]),
        speed=W.BoundedFloatText(s.speed_factor, min=1.0, max=100.0, step=0.25, layout=width["speed"]),
        log=W.Button(icon="file-text", tooltip="show the end of this site's log", layout=width["log"]),
        status=W.HTML("", layout=width["status"]),
    )
    for role, css in (("runs_on", "runs-on"), ("status", "host"), ("log", "log")):
        row[role].add_class(f"wantrain-{css}")
    return row


def site_table(rows: list[dict]):
    """The header and the rows, in COLUMNS order."""
    import ipywidgets as W

    head = W.HBox([W.HTML(f"<b>{title}</b>", layout=W.Layout(width=w)) for _, title, w in COLUMNS])
    return W.VBox([head] + [W.HBox([r[role] for role, _, _ in COLUMNS]) for r in rows])


def _here(where: str) -> bool:
    return where in ("", "this machine", "local")


def remote_hosts(rows: list[dict], ssh: dict) -> dict[str, RemoteSite | str]:
    """The SSH hosts of the rows that run on one (`ssh`: the options for every one of them); each
    row's host column follows its host's preparation. ConfigError names a row's bad "runs on"."""
    hosts: dict[str, RemoteSite | str] = {}
    for r in rows:
        name, where = r["name"].value.strip(), r["runs_on"].value.strip()
        r["status"].value = ""
        if _here(where):
            continue
        if not where.startswith("ssh://"):
            raise ConfigError(f"site {name}: runs on {where!r}: give 'this machine' or ssh://user@host[:port]")
        hosts[name] = RemoteSite(where, progress=functools.partial(_host_said, r), **ssh)
        r["status"].value = html.escape(f"connecting to {where}")
    return hosts


def _host_said(row: dict, message: str) -> None:     # inspecting, installing, its GPUs: on the row
    row["status"].value = html.escape(message.split(": ", 1)[-1])


def ps_host(where: str, ssh: dict, progress: Callable[[str], None]) -> RemotePS | None:
    """The PS's SSH host, or None for this machine."""
    where = where.strip()
    if _here(where):
        return None
    if not where.startswith("ssh://"):
        raise ConfigError(f"the PS runs on {where!r}: give 'this machine' or ssh://user@host[:port]")
    return RemotePS(where, progress=progress, **ssh)
