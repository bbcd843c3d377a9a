"""The control panel: configure sites and links, start and stop a run, inject faults, watch it.

One row per site (name, where it runs: this machine or ssh://user@host, device, processes, link,
custom trace, speed factor; an SSH host's state as it is prepared, and the site's log) over a testbed
scenario, the run's settings (model preset, rounds, inner steps or a time budget, codec), the
regions the PS could run in ranked by the round time these sites and settings would see there
(wantrain.launch.ps_regions), Start and Stop, and fault buttons (kill a site, restart the PS, an outage
on a link now, move the PS to a ranked region). It drives
the same `Run` as `wantrain demo`: the edited rows become a scenario file in the run folder. Or it
attaches to a run that is already going (by its folder, or the PS's address and observer token)
and only watches it.
Nothing it does blocks the kernel: starting, following and stopping happen in background
threads, and the live `Dashboard` below it is fed by the PS's Watch stream.

    panel = ControlPanel("three-sites", rounds=8, inner_steps=30)
    panel              # shows it; press Start, or:
    panel.start(); panel.wait()
"""

from __future__ import annotations

import html
import sys
import threading
import time
from pathlib import Path

from ..config import CODEC_MODES, RunConfig
from ..errors import ConfigError, ProcessError, StateError, WaitTimeoutError
from ..launch.plan import RunPlan
from ..launch.round_model import Prediction
from ..telemetry.report import write_report
from ..launch import RemotePS
from ..launch.base import log_tail
from ..launch.run import Run, describe_scenario, new_run_dir
from ..telemetry.watch import Observer
from .dashboard import Dashboard
from .placement_view import PlacementView, ranked_regions
from .site_rows import WHERE, SiteRow, ps_host, remote_hosts, site_table
from .sizes import panel_config

__all__ = ["ControlPanel"]

# Attach gives up on a PS that has said nothing after this long, and says why (nothing listens
# there, a TLS mismatch); a PS that answered once and went away is waited for as a run's own is.
ATTACH_CONTACT_S = 10.0


class ControlPanel:
    """Widgets over one `Run` at a time; `start()`, `stop()` and the fault methods are what the
    buttons call, so code and clicks do the same thing."""

    def __init__(self, scenario: str | Path = "three-sites", *, preset: str | None = None, rounds: int = 8,
                 inner_steps: int = 30, round_budget_s: float | None = None, codec: str = "int8-huffman",
                 config: RunConfig | None = None, run_root: str | Path = "runs", site_threads: int = 1,
                 restart_after_s: float = 2.0, python: str = sys.executable, ssh: dict | None = None) -> None:
        import ipywidgets as W

        from ..config.presets import PRESETS

        self.base = config or panel_config()
        self.scenario, self.run_root, self.site_threads, self.python = scenario, Path(run_root), site_threads, python
        self.restart_after_s = restart_after_s
        self.ssh = dict(ssh or {})       # for every ssh:// row: key_file, known_hosts, python, reuse_site_packages ...
        self.plan = describe_scenario(str(scenario), python)
        self.run: Run | None = None
        self.dashboard: Dashboard | None = None
        self.state = "idle"          # idle, starting, running, finished, stopped, failed
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        self._restarts: list[threading.Thread] = []

        # ---- one row per site
        self.rows = [SiteRow(s) for s in self.plan.sites]
        for row in self.rows:
            row.log.on_click(lambda _, r=row: self.show_log(r.site))

        # ---- the run's settings
        # The model the config names unless told otherwise: a config's preset is never overridden unasked.
        self.preset = W.Dropdown(options=sorted(PRESETS), value=preset or self.base.model.preset, description="model")
        self.rounds = W.BoundedIntText(rounds, min=1, max=100_000, description="rounds")
        self.work = W.ToggleButtons(options=["inner steps", "time budget"],
                                    value="time budget" if round_budget_s else "inner steps")
        self.inner_steps = W.BoundedIntText(inner_steps, min=1, max=1_000_000, description="steps")
        self.budget = W.BoundedFloatText(round_budget_s or 10.0, min=0.5, max=86_400.0, description="seconds")
        self.codec = W.Dropdown(options=CODEC_MODES, value=codec, description="codec")
        self.ps_on = W.Text("", description="PS runs on", placeholder=WHERE,
                            tooltip="a cloud VM: sites dial its public address (the URL's host), this notebook "
                                    "follows the run through a port forward")
        self.work.observe(lambda _: self._show_work(), "value")
        self._show_work()

        # ---- buttons
        self.start_button = W.Button(description="Start", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.fault_site = W.Dropdown(options=self.plan.names, description="site")
        self.kill_button = W.Button(description="Kill site", button_style="warning", disabled=True,
                                    tooltip=f"SIGKILL the site's process; it is started again after {restart_after_s:g} s")
        self.outage_s = W.BoundedFloatText(5.0, min=0.5, max=200.0, description="outage s")
        self.outage_button = W.Button(description="Outage now", button_style="warning", disabled=True)
        self.ps_button = W.Button(description="Restart PS", button_style="warning", disabled=True,
                                  tooltip="SIGKILL the parameter server; it resumes from its checkpoint")
        self.clear_button = W.Button(description="Clear site", disabled=True,
                                     tooltip="count again a site the commit check excluded (robust.exclude_after)")
        for b, name in ((self.start_button, "start"), (self.stop_button, "stop"), (self.kill_button, "kill"),
                        (self.outage_button, "outage"), (self.ps_button, "restart-ps"), (self.clear_button, "clear")):
            b.add_class(f"wantrain-{name}")        # stable handles for a browser (tests, screenshots)
        self.start_button.on_click(lambda _: self._start_clicked())
        self.stop_button.on_click(lambda _: self._background(self.stop))
        self.kill_button.on_click(lambda _: self._background(self.kill_site, self.fault_site.value))
        self.outage_button.on_click(lambda _: self._background(self.outage, self.fault_site.value, self.outage_s.value))
        self.ps_button.on_click(lambda _: self._background(self.restart_ps))
        self.clear_button.on_click(lambda _: self._background(self.clear_site, self.fault_site.value))
        # ---- or watch a run that is already going (started elsewhere, or before a kernel restart)
        self.attach_to = W.Text("", description="attach to", placeholder="a run folder, or the PS's HOST:PORT")
        self.attach_to.add_class("wantrain-attach-to")
        self.attach_token = W.Password("", description="token", placeholder="observer token, or its file")
        self.attach_ca = W.Text("", description="CA", placeholder="the PS's CA file (TLS)")
        self.attach_button = W.Button(description="Attach", icon="eye", tooltip="show the run's dashboard; "
                                      "starts, stops and restarts nothing")
        self.attach_button.add_class("wantrain-attach")
        self.attach_button.on_click(lambda _: self._background(self._attach_clicked))
        # ---- where the PS could run, ranked, and the move there
        self.places = PlacementView(lambda: self._background(self.placement),
                                    lambda region: self._background(self.move_ps, region))
        # Every message of the panel, newest last, with its time: a click's result stays readable
        # after the next one (the last MAX_MESSAGES are kept).
        self.messages: list[str] = []
        self.message = W.HTML("", layout=W.Layout(max_height="9em", overflow="auto", width="100%"))
        self.message.add_class("wantrain-messages")
        self.log_view = W.HTML("")
        self.dash_box = W.VBox([])
        def line(*children):        # a line of controls that wraps in a narrow notebook, never cut off
            return W.HBox(list(children), layout=W.Layout(flex_flow="row wrap"))

        self.box = W.VBox([
            site_table(self.rows), self.log_view,
            line(self.preset, self.rounds, self.codec), self.ps_on,
            line(self.work, self.inner_steps, self.budget),
            self.places.box,
            line(self.start_button, self.stop_button),
            line(self.fault_site, self.kill_button, self.outage_s, self.outage_button, self.ps_button,
                 self.clear_button),
            line(self.attach_to, self.attach_token, self.attach_ca, self.attach_button),
            self.message, self.dash_box,
        ])
        self.box.add_class("wantrain-panel")

    # ------------------------------------------------------------ configuration

    def _show_work(self) -> None:
        budget = self.work.value == "time budget"
        self.inner_steps.layout.display = "none" if budget else None
        self.budget.layout.display = None if budget else "none"

    def config(self) -> RunConfig:
        """The run's configuration as the widgets say (a wrong value raises ConfigError naming the field)."""
        names = [r.site for r in self.rows]
        changes = {"num_sites": len(names), "sites": names, "model.preset": self.preset.value,
                   "train.rounds": self.rounds.value, "codec.mode": self.codec.value}
        if self.work.value == "time budget":
            changes["train.round_budget_s"] = float(self.budget.value)
        else:
            changes["train.inner_steps"] = self.inner_steps.value
            changes["train.round_budget_s"] = 0.0
        return self.base.replace(**changes)

    def site_plan(self) -> RunPlan:
        """The scenario's run plan with the rows' edits (names, bandwidths, traces, speed factors) applied."""
        return self.plan.replace(scenario=f"{self.plan.scenario} (edited)",
                                 sites=tuple(r.edited_plan() for r in self.rows))

    def placement(self) -> list[tuple[str, Prediction]]:
        """The regions the PS could run in, fastest first: the round time the rows' sites (their
        edits included) would see with the PS there under the panel's settings, and what sets it;
        also shown under the settings (PlacementView)."""
        ranking, source = ranked_regions(self.scenario, self.site_plan(), self.config(), self.python)
        self.places.show(ranking, source, self.plan.ps_region)
        return ranking

    # ------------------------------------------------------------ actions (what the buttons call)

    def start(self) -> Run:
        """Start a run with the panel's settings; returns at once, the run goes on in the background."""
        if self.state in ("starting", "running"):
            raise StateError("a run is already going; stop it first")
        self.error = None
        try:
            cfg, plan = self.config(), self.site_plan()        # bad settings fail before anything exists
            devices = {r.site: r.device.value for r in self.rows}
            nproc = {r.site: r.procs.value for r in self.rows if r.procs.value > 1}
            self.run = run = Run(cfg, run_dir=new_run_dir(self.run_root), plan=plan, site_threads=self.site_threads,
                                 python=self.python, devices=devices, remote=remote_hosts(self.rows, self.ssh), nproc=nproc,
                                 ps_on=self._ps_on())
        except Exception as e:          # a bad setting: say which, start nothing
            self._fail(e)
            raise
        self.dashboard = Dashboard(rounds=cfg.train.rounds)
        self.dash_box.children = (self.dashboard.box,)
        self.fault_site.options = list(cfg.sites)                # the rows may have renamed sites
        self._set_state("starting")
        self._say(f"starting: PS, link emulator and {cfg.num_sites} sites; run folder {run.run_dir}")
        self._thread = threading.Thread(target=self._drive, args=(run, self.dashboard), name="wantrain-panel", daemon=True)
        self._thread.start()
        return run

    def _start_clicked(self) -> None:
        try:
            self.start()
        except Exception:       # already on the panel's message line; a click has no caller to raise to
            pass

    def _drive(self, run: Run, dashboard: Dashboard) -> None:
        try:
            run.start()
            self._set_state("running")
            self._say(f"running: PS on {run.address}, run folder {run.run_dir}")
            dashboard.follow(run.follow()).join()
            if self.state == "stopped":
                return
            if not any(e["kind"] == "run_end" for e in dashboard.events):
                raise ProcessError(dashboard.error or "the PS's event stream ended before the run did")
            run.wait_exit(30)
            self._set_state("finished")
            self._say(f"finished; report: {write_report(run.run_dir)}")
        except Exception as e:
            if self.state != "stopped":
                self._fail(e)
        finally:
            run.stop()          # whatever happened; the link emulator runs until stopped

    def attach(self, address: str | None = None, token: str | Path = "", *, run_dir: str | Path | None = None,
               ca: str | Path | None = None, server_name: str = "") -> Dashboard:
        """Show the dashboard of a run that is already going, from its first event and then live:
        by the PS's address (HOST:PORT) and observer token (or its file; `ca` for a PS that speaks
        TLS), or by its run folder on this machine. Nothing is started, stopped or restarted: after a
        kernel restart, this is how a notebook finds a run that `wantrain demo`, a terminal or
        another notebook started. The fault buttons stay off (this panel does not own its processes)."""
        if self.state in ("starting", "running", "attached"):
            raise StateError(f"this panel is {self.state}; stop it or use another panel")
        if (address is None) == (run_dir is None):
            raise ConfigError("attach takes the PS's address (with its token) or a run folder, not both")
        who = Observer.of_run_dir(run_dir) if run_dir is not None else \
            Observer.of(str(address), token, ca, server_name)
        self.run, self.error = None, None
        self.dashboard = dash = Dashboard()
        self.dash_box.children = (dash.box,)
        self._set_state("attached")
        self._say(f"attached to {who.address}: its run so far, then live")

        def watch() -> None:
            dash.follow(who.follow(first_contact_s=ATTACH_CONTACT_S)).join()
            if any(e["kind"] == "run_end" for e in dash.events):
                self._set_state("finished")
                self._say(f"the run at {who.address} has ended")
            elif self.state == "attached":
                self._fail(ProcessError(dash.error or f"the PS at {who.address} went away"))
        self._thread = threading.Thread(target=watch, name="wantrain-attach", daemon=True)
        self._thread.start()
        return dash

    def _attach_clicked(self) -> None:
        where, token, ca = self.attach_to.value.strip(), self.attach_token.value.strip(), self.attach_ca.value.strip()
        if where and Path(where).is_dir():
            self.attach(run_dir=where)
        else:
            self.attach(where, token, ca=ca or None)

    def stop(self) -> None:
        """Stop every process of the run (the run folder keeps what happened)."""
        if self.run is None:
            return
        self._set_state("stopped")
        if self.dashboard is not None:
            self.dashboard.stopped_by_user = True
        self.run.stop()
        self._say(f"stopped; run folder {self.run.run_dir}")
        self._redraw()              # the sites read "stopped", not the round they were in

    def wait(self, timeout_s: float = 1800.0) -> str:
        """Block until the run ends (for scripts and tests; a notebook need not call it)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise WaitTimeoutError(f"the run did not end within {timeout_s:.0f} s")
        for t in list(self._restarts):
            t.join(timeout_s)
        if self.state == "failed":
            raise ProcessError(self.error)
        return self.state

    def kill_site(self, name: str, restart_after_s: float | None = None) -> None:
        """SIGKILL a site, as a crash would, then start it again after `restart_after_s` (it rejoins)."""
        run = self._running()
        delay = self.restart_after_s if restart_after_s is None else restart_after_s
        run.kill_site(name)
        self._say(f"killed site {name}; restarting it in {delay:g} s")
        self._redraw()

        def later() -> None:
            time.sleep(delay)
            if self.state == "running" and self.run is run:
                try:
                    run.start_site(name)
                    self._say(f"site {name} started again")
                except Exception as e:          # e.g. the run ended meanwhile
                    self._say(f"site {name} not restarted: {e}")
        t = threading.Thread(target=later, daemon=True)
        self._restarts.append(t)
        t.start()

    def restart_ps(self) -> None:
        """SIGKILL the PS; it comes back on the same port from its checkpoint, the sites reconnect."""
        run = self._running()
        self._say("restarting the parameter server")
        run.restart_ps()
        self._say("the parameter server is back (from its checkpoint)")
        self._redraw()

    def outage(self, name: str, seconds: float) -> None:
        """Take a site's emulated link down now."""
        self._running().outage(name, seconds)
        self._say(f"link of {name} down for {seconds:g} s")
        self._redraw()

    def clear_site(self, name: str) -> None:
        """Count again a site the commit check excluded (Run.clear_site)."""
        self._running().clear_site(name)
        self._say(f"cleared site {name}: the commit check counts its deltas again")

    def move_ps(self, region: str | None) -> None:
        """Move the running PS to `region` (Run.move_ps): from its checkpoint, the links with that
        region's RTTs, the sites following by themselves."""
        if not region:
            raise ConfigError("choose the region to move the PS to (Rank PS regions lists them)")
        self._running().move_ps(region)
        self._say(f"PS moved to {region}")
        self._redraw()

    def _ps_on(self) -> RemotePS | None:
        options = {k: v for k, v in self.ssh.items() if k not in ("gpus",)}
        return ps_host(self.ps_on.value, options, lambda m: self._say(f"PS host: {m}"))

    def show_log(self, site: str, lines: int = 30) -> str:
        """The end of a site's log (a remote site's comes back here as it runs), under the table."""
        path = self.run.run_dir / f"site-{site}.log" if self.run is not None else None
        text = log_tail(path, lines) if path is not None else ""
        self.log_view.value = f"<b>{html.escape(site)}</b><pre>{html.escape(text or '(no log yet)')}</pre>"
        return text

    # ------------------------------------------------------------ plumbing

    def _running(self) -> Run:
        if self.state != "running" or self.run is None:
            raise StateError(f"no run is going (state: {self.state})")
        return self.run

    def _background(self, fn, *args) -> None:
        """Run a button's action off the kernel's thread; its error goes to the message line."""
        def go() -> None:
            try:
                fn(*args)
            except Exception as e:
                self._say(f"<b>{type(e).__name__}</b>: {html.escape(str(e))}", raw=True)
        threading.Thread(target=go, daemon=True).start()

    def _redraw(self) -> None:
        if self.dashboard is not None:
            self.dashboard.redraw()

    def _set_state(self, state: str) -> None:
        self.state = state
        live = state in ("starting", "running")
        self.start_button.disabled = live or state == "attached"
        self.attach_button.disabled = live or state == "attached"
        self.stop_button.disabled = not live
        for b in (self.kill_button, self.outage_button, self.ps_button, self.clear_button, self.places.move_button):
            b.disabled = state != "running"

    def _fail(self, e: BaseException) -> None:
        self.error = f"{type(e).__name__}: {e}"
        self._set_state("failed")
        self._say(f"<b>failed</b>: {html.escape(self.error)}", raw=True)

    MAX_MESSAGES = 200

    def _say(self, text: str, raw: bool = False) -> None:
        line = f"<span style='color:#666'>{time.strftime('%H:%M:%S')}</span> {text if raw else html.escape(text)}"
        self.messages = [*self.messages, line][-self.MAX_MESSAGES:]
        self.message.value = "<br>".join(self.messages)

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(self.box)

