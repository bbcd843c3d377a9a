"""A live dashboard: the report's figures, redrawn as telemetry events come.

Events arrive from the PS's Watch stream (`Run.follow()`, `Dashboard.attach(address)`, or any
iterable of event dicts): the PS's own events, the link emulator's and injected faults are one
stream (telemetry schema 2), so the dashboard shows everything whether the PS runs next to the
notebook or far away. Redraws are
rate-capped (`min_interval_s`, stretched so that redrawing takes at most a tenth of the
kernel's time however long the run), wait until the page has drawn the last batch (a browser on a
loaded machine draws slower than a kernel sends: `wantrain.ui.page_ack`), and every series is
thinned to about `max_points`, keeping its
spikes (`wantrain.telemetry.charts.thin`), before a figure is built: each redraw sends whole figures to
the browser, and plotly validates every point it is given. `follow()` runs in a background thread, so the kernel
stays free while training runs; `static_figures()` gives plain figures of the final state for
a saved or rendered notebook (a saved notebook keeps no widget state).
"""

from __future__ import annotations

import html
import json
import math
import threading
import time
from collections.abc import Iterable

import plotly.graph_objects as go

from ..errors import ProcessError, WaitTimeoutError
from ..telemetry.charts import figures
from ..telemetry import on_wire

__all__ = ["Dashboard", "site_states", "progress_text", "CHART_ORDER"]

# Title prefixes of the charts (wantrain.telemetry.charts.figures), in their order.
CHART_ORDER = ("Loss", "Bytes on the wire", "Where each site", "Controller", "Links: RTT", "Links: throughput", "Timeline")


def site_states(events: list[dict], ended: str | None = None) -> dict[str, str]:
    """What each site is doing, as the PS's events tell it: downloading, ready, training, left.
    `ended`: what the run's end was, when it did not end with its last round (stopped by the user,
    followed no further): every site still in it reads so, not the last thing it was doing."""
    states: dict[str, str] = {}
    for e in events:
        k, site = e["kind"], e.get("site") or ""
        if k == "join":
            states[site] = "downloading the model" + (" (rejoined)" if e.get("resumed") else "")
        elif k == "download" and site in states and states[site].startswith("downloading"):
            rejoined = " (rejoined)" if states[site].endswith("(rejoined)") else ""
            states[site] = f"downloading the model: {100 * e['chunks'] // e['of']} % of {e['of']} chunks " \
                           f"({e['mb']:.1f} MB sent){rejoined}"
        elif k == "ready":
            states[site] = f"model loaded in {e['since_join_s']:.1f} s"
        elif k == "round_start":
            for name, st in states.items():
                if not st.startswith(("left", "downloading")):
                    states[name] = f"training round {e['round']}"
        elif k == "site_round":
            states[site] = f"sent its delta of round {e['round']} ({on_wire(e) / 1e6:.2f} MB)"
        elif k == "leave":
            states[site] = f"left: {e['reason']}"
        elif k == "fault" and e.get("action") == "SSH connection lost":
            states[site] = "lost its SSH connection: starting it again"
        elif k == "run_end":
            states = {name: "finished" if not st.startswith("left") else st for name, st in states.items()}
            ended = None
    if ended is not None:
        states = {name: st if st.startswith(("left", "finished")) else ended for name, st in states.items()}
    return states


def progress_text(events: list[dict], rounds: int, now: float) -> str:
    """"3 / 8 rounds, about 40 s left": left from the mean time of the rounds committed so far."""
    ends = [e for e in events if e["kind"] == "round_end"]
    done = len(ends)
    text = f"{done} / {rounds} rounds"
    if any(e["kind"] == "run_end" for e in events):
        return text + ", done"
    starts = [e["t"] for e in events if e["kind"] == "round_start"]
    if not ends or not starts:
        return text
    per_round = (ends[-1]["t"] - starts[0]) / done
    left = max(0.0, per_round * (rounds - done) - (now - ends[-1]["t"]))
    return text + f", about {_duration(left)} left ({_duration(per_round)} a round)"


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


CHECKS_SHOWN = 5         # the commit check's latest decisions that left a delta out, shown above the charts

class Dashboard:
    """Live charts of one run: loss, wire and compression, links, timeline; rounds progress."""

    def __init__(self, max_points: int = 400, min_interval_s: float = 1.0, rounds: int | None = None) -> None:
        import ipywidgets as widgets  # the notebook extra; imported here so `wantrain` does not need it

        from .page_ack import PageAck

        self.max_points, self.min_interval_s = max_points, min_interval_s
        self.events: list[dict] = []
        self.redraws = 0
        self._last = -math.inf                 # never drawn: the first event draws (monotonic() starts at boot)
        self._cost = 0.0                       # CPU seconds the last redraw took (the kernel's GIL)
        self._lock = threading.Lock()          # guards self.events
        self._draw_lock = threading.Lock()     # one redraw at a time (the follow thread, fault buttons)
        # One fixed Output per chart, in the report's order. A redraw replaces its one output (a
        # plotly figure for JupyterLab's plotly renderer) in a single state update: the browser
        # always draws the latest figure, however late its view was created. (FigureWidget views
        # render from the widget's initial state and then depend on every later message; a view
        # created while the browser was busy showed empty axes for the whole run.)
        self._slots = {prefix: widgets.Output() for prefix in CHART_ORDER}
        self._page = PageAck(on_drawn=self._page_drew)   # which batch of charts the page has drawn
        self._drawn_events = 0                 # how many events the last redraw drew
        self._shown: dict[str, go.Figure] = {}
        self._sent: dict[str, str] = {}
        self.status = widgets.HTML("waiting for the run's first events")
        self.rounds = rounds
        self.progress = widgets.IntProgress(value=0, min=0, max=rounds or 1, description="rounds",
                                            bar_style="info", layout=widgets.Layout(width="50%"))
        self.progress_text = widgets.HTML("")      # "3 / 8 rounds, about 40 s left"
        self.progress_text.add_class("wantrain-progress")
        bar = widgets.HBox([self.progress, self.progress_text])
        bar.layout.display = None if rounds else "none"
        self.header = widgets.VBox([bar, self.status])
        self.box = widgets.VBox([self.header, *self._slots.values()])
        self.thread: threading.Thread | None = None
        # Set by the follow thread once its source is exhausted: a thread that exists but has not
        # started yet is not alive either, and must not read as a run that is over.
        self.source_ended = threading.Event()
        self.error: str | None = None       # why following stopped early, if it did
        self.stopped_by_user = False        # set before stopping a run on purpose: not an error

    # ------------------------------------------------------------ feeding

    def add(self, event: dict) -> None:
        """Take one event; redraw if the last redraw is older than min_interval_s (or ten times
        what it took, when that is longer: the kernel keeps 90% of its time) and the page has
        drawn the last one (`wantrain.ui.page_ack`)."""
        with self._lock:
            self.events.append(event)
        if event["kind"] == "run_end" or (self._due() and self._page_ready()):
            self.redraw()

    def _due(self) -> bool:
        return time.monotonic() - self._last >= max(self.min_interval_s, 10 * self._cost)

    def _page_ready(self) -> bool:
        return self._page.ready()

    def _page_drew(self) -> None:
        """The page drew the last batch: events that came while it drew are drawn now, if due
        (otherwise the next event draws them). Called on the kernel's main thread; it never waits
        for a redraw the follow thread is doing."""
        with self._lock:
            behind = len(self.events) > self._drawn_events
        if behind and self._due() and self._draw_lock.acquire(blocking=False):
            try:
                self._redraw()
            finally:
                self._draw_lock.release()

    def follow(self, source: Iterable[dict]) -> threading.Thread:
        """Consume `source` (e.g. `run.follow()`) in a background thread; returns the thread."""
        def pump() -> None:
            try:
                for ev in source:
                    self.add(ev)
            except Exception as e:        # shown in the panel, never raised into the kernel
                if not self.stopped_by_user:
                    self.error = f"{type(e).__name__}: {e}"
            finally:
                self.source_ended.set()
                self.redraw()

        self.thread = threading.Thread(target=pump, name="wantrain-dashboard", daemon=True)
        self.thread.start()
        return self.thread

    @classmethod
    def attach(cls, address: str, token: str, tls=None, server_name: str = "", **kw) -> Dashboard:
        """A dashboard of the run of the PS at `address` (HOST:PORT), from the start of its log: all
        it needs is the address and the observer token (and the CA, for a PS that speaks TLS)."""
        from ..telemetry.watch import follow_events

        dash = cls(**kw)
        dash.follow(follow_events(address, token, tls, server_name))
        return dash

    # ------------------------------------------------------------ drawing

    def static_figures(self, max_points: int | None = None) -> list[go.Figure]:
        """The charts of the current state, every point kept unless max_points is given."""
        with self._lock:
            events = list(self.events)
        return figures(events, max_points) if events else []

    def show_static(self) -> None:
        """Display plain figures of the current state: what a saved or rendered notebook keeps."""
        for fig in self.static_figures():
            fig.show()

    def wait_for(self, kind: str, site: str | None = None, timeout_s: float = 300.0, after: dict | None = None,
                 **fields) -> dict:
        """Block until an event of `kind` (for `site`, with these field values, later than the
        event `after`) has arrived; returns it. For notebooks that script a scenario."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            seen = 0 if after is None else next(i + 1 for i, e in enumerate(self.events) if e is after)
        while True:
            with self._lock:
                new, seen = self.events[seen:], len(self.events)
            for e in new:
                if e["kind"] == kind and (site is None or e.get("site") == site) and \
                        all(e.get(k) == v for k, v in fields.items()):
                    return e
            if self.source_ended.is_set() and seen == len(self.events):
                raise ProcessError(f"the run's events ended without a {kind!r} event ({self.error or 'run over'})")
            if time.monotonic() > deadline:
                raise WaitTimeoutError(f"no {kind!r} event within {timeout_s:.0f} s")
            time.sleep(0.1)

    def redraw(self) -> None:
        """Bring every chart up to date (the follow thread and fault buttons both call this)."""
        with self._draw_lock:
            self._redraw()

    @property
    def charts(self) -> list[go.Figure]:
        """The charts shown so far (thinned, as sent to the browser), in the report's order."""
        return [self._shown[p] for p in self._slots if p in self._shown]

    def _redraw(self) -> None:
        import ipywidgets as widgets
        import plotly.io as pio

        self._last, cpu0 = time.monotonic(), time.thread_time()
        with self._lock:
            self._drawn_events = len(self.events)
        figs = self.static_figures(self.max_points)     # thinned before plotly validates a point
        if figs:
            self.redraws += 1
        changed = False
        for fig in figs:
            title = fig.layout.title.text
            prefix = next((p for p in CHART_ORDER if title.startswith(p)), title)
            if prefix not in self._slots:             # a chart the report gained later: a slot at the end
                self._slots[prefix] = widgets.Output()
                self.box.children = (*self.box.children, self._slots[prefix])
            self._shown[prefix] = fig
            spec = pio.to_json(fig, validate=False)    # serialized once: compared, then sent
            if self._sent.get(prefix) != spec:         # unchanged charts are not sent again
                self._sent[prefix] = spec
                bundle = {"application/vnd.plotly.v1+json": json.loads(spec)}   # plotly's Jupyter renderer
                self._slots[prefix].outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)
                changed = True
        if changed:
            self._page.batch_sent()
        self.status.value = self._summary()
        with self._lock:
            self.progress.value = min(self.progress.max, sum(1 for e in self.events if e["kind"] == "round_end"))
            if self.rounds:
                self.progress_text.value = html.escape(progress_text(self.events, self.rounds, time.time()))
        self._cost = time.thread_time() - cpu0

    def _summary(self) -> str:
        with self._lock:
            events = list(self.events)
        ends = [e for e in events if e["kind"] == "round_end"]
        done = any(e["kind"] == "run_end" for e in events)
        head = (f"{len(events)} events, no round committed yet" if not ends else
                f"{'finished' if done else 'running'}: {len(ends)} rounds, validation loss "
                f"{ends[-1]['val_loss']:.4f}, last round {ends[-1]['round_s']:.1f} s")
        ended = (f"stopped: {self.error}" if self.error else
                 "stopped by the user" if self.stopped_by_user and not done else None)
        rows = "".join(f"<tr><td><b>{html.escape(site)}</b></td><td>{html.escape(st)}</td></tr>"
                       for site, st in sorted(site_states(events, ended).items()))
        # The screen's alerts (wantrain.outer.screening): who is out of line, since when, what was done.
        alerts = "".join(f"<div style='color:#b00020'><b>alert</b> (round {e.get('round', 0)}): "
                         f"{html.escape(e.get('message', ''))}</div>" for e in events if e["kind"] == "alert")
        # The commit check's last decisions that left a delta out (wantrain.outer.checking), and the losses
        # they compared.
        checks = "".join(_check_line(e) for e in [e for e in events if e["kind"] == "check" and e.get("left_out")]
                         [-CHECKS_SHOWN:])
        if self.error:
            head = f"stopped: {self.error}"
        elif self.stopped_by_user and not done:
            head = f"stopped by the user after {len(ends)} rounds"
        return f"{html.escape(head)}{alerts}{checks}<table>{rows}</table>"

    def _ipython_display_(self) -> None:   # `dashboard` as the last line of a cell shows it
        from IPython.display import display
        display(self.box)


def _check_line(e: dict) -> str:
    """A commit check that left deltas out, as the dashboard shows it."""
    without = ", ".join(f"{e['without'][k]:.4f}" for k in e["left_out"] if k in e["without"])
    return (f"<div style='color:#6a1b9a'><b>check</b> (round {e['round']}): left out "
            f"{html.escape(', '.join(e['left_out']))}: check loss {e['candidate']:.4f} with, {without} without "
            f"(the model before: {e['base']:.4f})</div>")
