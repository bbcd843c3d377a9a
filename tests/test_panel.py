"""The control panel with real processes: buttons start a run, kill a site, force an outage."""

import json
import os
import signal
import time

import pytest

from wantrain.errors import ConfigError, ProcessError, StateError
from wantrain.telemetry import read_events
from wantrain.telemetry.round_time import round_splits
from wantrain.ui import ControlPanel, site_states

from .helpers import small_config


def _wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_panel_settings_become_the_config_and_bad_ones_name_the_problem(tmp_path):
    panel = ControlPanel("three-sites", config=small_config(), run_root=tmp_path, rounds=3, inner_steps=7)
    cfg = panel.config()
    assert (cfg.train.rounds, cfg.train.inner_steps, cfg.num_sites) == (3, 7, 3)
    assert cfg.model.preset == "micro"          # the config's model unless the panel is told another
    assert ControlPanel("three-sites", config=small_config(), preset="tiny").config().model.preset == "tiny"
    assert cfg.sites == ("us-west", "eu-west", "ap-southeast") or list(cfg.sites) == ["us-west", "eu-west", "ap-southeast"]
    panel.work.value = "time budget"
    panel.budget.value = 4.5
    assert panel.config().train.round_budget_s == 4.5
    panel.rows[2].speed.value = 3.0
    panel.rows[0].bandwidth.value = 40.0
    plan = panel.site_plan()
    assert plan.sites[2].speed_factor == 3.0 and plan.sites[0].bandwidth_mbps == 40.0
    assert plan.sites[1] == panel.plan.sites[1]          # rows left alone are the scenario's
    panel.rows[0].bandwidth.value = 0.0
    assert panel.site_plan().sites[0].bandwidth_mbps is None     # 0: unlimited
    panel.rows[1].trace.value = str(tmp_path / "missing.csv")
    with pytest.raises(ConfigError, match="missing.csv"):
        panel.start()
    assert panel.state == "failed" and "missing.csv" in panel.message.value
    assert not list(tmp_path.iterdir())                 # a bad setting leaves no run folder behind
    panel.rows[1].trace.value = ""
    panel.rows[1].name.value = "us-west"            # two sites with one name
    with pytest.raises(ConfigError, match="sites"):
        panel.start()
    assert panel.run is None and "failed" in panel.message.value
    said = len(panel.messages)
    panel.start_button.click()                          # a click reports on the message log, raises nothing
    assert "sites" in panel.messages[-1] and len(panel.messages) == said + 1 and panel.state == "failed"
    assert "missing.csv" in panel.message.value         # the log keeps the earlier messages


def test_the_panel_ranks_where_the_ps_could_run_for_its_sites_and_settings(tmp_path):
    """The placement the panel shows: every region, fastest first, from the rows as edited."""
    panel = ControlPanel("three-sites", config=small_config(), run_root=tmp_path, rounds=3, inner_steps=7)
    panel.work.value, panel.budget.value = "time budget", 2.0       # every site computes 2 s: links decide
    ranking = panel.placement()
    times = [p.round_s for _, p in ranking]
    assert len(ranking) >= 3 and times == sorted(times) and all(t > 2.0 for t in times)
    shown = panel.places.table.value
    assert [shown.index(region) for region, _ in ranking] == sorted(shown.index(region) for region, _ in ranking)
    assert "the scenario&#39;s" in shown and "2 s budget" in shown
    assert list(panel.places.move_to.options) == [region for region, _ in ranking]      # what Move PS offers
    with pytest.raises(StateError):                       # no run to move (Run.move_ps: test_recovery.py)
        panel.move_ps(ranking[0][0])
    panel.rows[2].bandwidth.value = 0.5          # ap-southeast's link narrowed: every region's round is slower
    slower = dict((region, p.round_s) for region, p in panel.placement())
    assert all(slower[region] > p.round_s + 1.0 for region, p in ranking), (slower, ranking)


def test_site_states_follow_the_events():
    ev = [{"kind": "join", "site": "a"}, {"kind": "ready", "site": "a", "since_join_s": 1.5},
          {"kind": "round_start", "round": 0}, {"kind": "join", "site": "b", "resumed": True},
          {"kind": "leave", "site": "a", "reason": "stream broke"}]
    assert site_states(ev) == {"a": "left: stream broke", "b": "downloading the model (rejoined)"}
    lost = ev + [{"kind": "fault", "action": "SSH connection lost", "site": "b"}]
    assert site_states(lost)["b"] == "lost its SSH connection: starting it again"
    # A run stopped mid-round: no site reads "training round 0" any more; one that left says why.
    stopped = [{"kind": "join", "site": s} for s in "ab"] + [{"kind": "ready", "site": s, "since_join_s": 1.0}
                                                              for s in "ab"] + [{"kind": "round_start", "round": 0},
               {"kind": "leave", "site": "b", "reason": "killed"}]
    assert site_states(stopped) == {"a": "training round 0", "b": "left: killed"}
    assert site_states(stopped, "stopped by the user") == {"a": "stopped by the user", "b": "left: killed"}
    assert site_states(stopped + [{"kind": "run_end"}], "stopped by the user")["a"] == "finished"


def test_progress_says_how_many_rounds_and_how_long_is_left():
    from wantrain.ui.dashboard import progress_text

    ev = [{"kind": "round_start", "t": 100.0, "round": 0}]
    assert progress_text(ev, 8, 101.0) == "0 / 8 rounds"
    ev += [{"kind": "round_end", "t": 110.0, "round": 0}, {"kind": "round_start", "t": 110.0, "round": 1},
           {"kind": "round_end", "t": 120.0, "round": 1}]
    assert progress_text(ev, 8, 124.0) == "2 / 8 rounds, about 56 s left (10 s a round)"    # 6 x 10 - 4
    assert progress_text(ev, 8, 500.0).startswith("2 / 8 rounds, about 0 s left")
    assert progress_text([*ev, {"kind": "run_end", "t": 121.0}], 2, 130.0) == "2 / 2 rounds, done"


@pytest.mark.timeout(240)
def test_buttons_drive_a_real_run(tmp_path):
    cfg = small_config(**{"train.inner_steps": 20})
    panel = ControlPanel("three-sites", config=cfg, run_root=tmp_path, rounds=6, inner_steps=20,
                         restart_after_s=0.5)
    assert panel.kill_button.disabled and not panel.start_button.disabled
    panel.rows[1].speed.value = 1.0                  # edits in the widgets (the scenario says 1.25 and
    panel.rows[0].bandwidth.value = 80.0             # 1000 Mbit/s) reach the site's process and its link
    panel.start_button.click()
    assert panel._thread.is_alive()                     # the click returned while the run goes on: the kernel is free
    _wait(lambda: panel.state == "running", 60, "the run to start")
    assert panel.start_button.disabled and not panel.kill_button.disabled
    dash = panel.dashboard
    _wait(lambda: any(e["kind"] == "round_end" for e in dash.events), 90, "a first round")

    panel.fault_site.value = "eu-west"
    panel.kill_button.click()
    _wait(lambda: any(e["kind"] == "join" and e["site"] == "eu-west" and e["resumed"] for e in dash.events),
          60, "eu-west to rejoin")
    panel.fault_site.value = "us-west"
    panel.outage_s.value = 1.5
    panel.outage_button.click()
    assert panel.wait(180) == "finished", panel.message.value

    run_dir = panel.run.run_dir
    # Faults and link events reached the PS's one log (and the dashboard, through Watch).
    logged = read_events(run_dir)
    faults = [e for e in logged if e["kind"] == "fault"]
    assert [(f["action"], f["site"]) for f in faults] == [("kill site", "eu-west"), ("link outage", "us-west")]
    assert [(f["action"], f["site"]) for f in dash.events if f["kind"] == "fault"] == \
        [(f["action"], f["site"]) for f in faults]
    assert any(e["kind"] == "outage_start" and e["site"] == "us-west" and e.get("forced") for e in logged)
    links = [json.loads(ln) for ln in (run_dir / "links.jsonl").read_text().splitlines()]
    forced = [ln for ln in links if ln["kind"] in ("outage_start", "outage_end") and ln["site"] == "us-west"]
    assert [ln["kind"] for ln in forced] == ["outage_start", "outage_end"] and forced[0]["forced"]
    assert forced[1]["t"] - forced[0]["t"] >= 1.4        # the link stayed down for the outage asked for
    ends = [e["round"] for e in dash.events if e["kind"] == "round_end"]
    assert ends == list(range(6))
    assert any(e["kind"] == "leave" and e["site"] == "eu-west" for e in dash.events)
    timeline = next(w for w in dash.charts if w.layout.title.text.startswith("Timeline"))
    marks = {tr.name: list(tr.y) for tr in timeline.data}
    assert marks["fault injected"] == ["eu-west", "us-west"] and "us-west" in marks["outage"]
    assert dash.progress.value == 6 and "finished" in dash.status.value
    assert (run_dir / "report.html").is_file() and "report" in panel.message.value
    assert all(p.poll() is not None for p in panel.run.processes())
    rounds = [e for e in logged if e["kind"] == "site_round"]
    assert all(e["emulated_s"] > 0 for e in rounds if e["site"] == "ap-southeast")   # the scenario's 1.5
    assert all(e["emulated_s"] == 0 for e in rounds if e["site"] == "eu-west")        # the edited 1.0
    samples = [e for e in logged if e["kind"] == "link" and e["site"] == "us-west"]
    up = [e["bandwidth_mbps"] for e in samples if not e["down"]]          # (the forced outage reads 0)
    assert up and set(up) == {80.0}                                          # the link shapes at 80 Mbit/s
    # The headline counts every byte: recounted from the events, the uplink ratio is fp32 bytes over
    # every message of every delta as gRPC carried it, protection included; and what the emulated
    # links carried up (TLS, HTTP/2, the Join, probes, hash reports, a killed site's lost upload
    # besides) is at least that, and not much more.
    from wantrain.telemetry.report import summarize

    s = summarize(logged)
    assert s["uplink_ratio"] == pytest.approx(sum(e["raw_bytes"] for e in rounds) / sum(e["framed_bytes"] for e in rounds))
    assert all(e["framed_bytes"] > e["received_wire_bytes"] + e["protection_bytes"] for e in rounds)
    assert s["uplink_mb"] == pytest.approx(s["uplink_delta_mb"] + s["uplink_protection_mb"] + s["uplink_framing_mb"])
    for site in {e["site"] for e in rounds}:
        framed = sum(e["framed_bytes"] for e in rounds if e["site"] == site)
        carried = max(ln["bytes_up"] for ln in links if ln["kind"] == "link" and ln["site"] == site)
        assert framed <= carried <= 1.1 * framed + 500_000, (site, framed, carried)   # 1.007-1.008x seen


@pytest.mark.timeout(400)     # the install on the "host" takes a minute on a loaded machine
def test_a_row_and_the_ps_that_run_on_an_ssh_host(tmp_path, venvs):
    """A row's "runs on" takes ssh://user@host: the host's state (its Python, torch and GPUs, the
    install) shows on the row, the site trains there, and its log comes back here. The PS runs on
    that host too (a cloud VM: the panel follows it through a forward). A "runs on" that is neither
    this machine nor an SSH address is refused by name, before anything starts."""
    import sys

    from .sshd import SshServer

    server = SshServer(tmp_path / "sshd")
    ssh = {"key_file": server.key_file, "known_hosts": str(server.known_hosts), "python": sys.executable,
           "reuse_site_packages": True, "venvs": venvs}
    # Every round waits for the SSH site (a busy machine may slow its install, join or delivery).
    cfg = small_config(**{"schedule.quorum_wait_s": 120.0, "schedule.deadline_min_s": 120.0})
    panel = ControlPanel("three-sites", config=cfg, run_root=tmp_path, rounds=3, inner_steps=10, ssh=ssh)
    try:
        panel.rows[2].runs_on.value = "ftp://elsewhere"
        with pytest.raises(ConfigError, match="site ap-southeast: runs on 'ftp://elsewhere'"):
            panel.start()
        assert panel.run is None
        panel.rows[2].runs_on.value = server.url
        panel.ps_on.value = "http://elsewhere"
        with pytest.raises(ConfigError, match="the PS runs on 'http://elsewhere'"):
            panel.start()
        panel.ps_on.value = server.url
        run = panel.start()
        assert panel.wait(300) == "finished", panel.message.value
        assert run.address != run.site_address and run.address.startswith("127.0.0.1:")   # through a forward
        status = panel.rows[2].status.value
        assert "installed" in status or "already installed" in status, status
        assert panel.rows[0].status.value == ""                            # a row on this machine
        assert "finished after 3 rounds" in panel.show_log("ap-southeast")    # its log, from the host
        assert "<pre>" in panel.log_view.value
        ends = [e for e in panel.dashboard.events if e["kind"] == "round_end"]
        assert len(ends) == 3 and all("ap-southeast" in e["sites"] for e in ends)
    finally:
        panel.stop()
        server.close()


KERNEL_ATTACH = """
from wantrain.ui import ControlPanel
panel = ControlPanel()
{attach}
{wait}
ends = [e["round"] for e in panel.dashboard.events if e["kind"] == "round_end"]
print("RESULT", panel.state, ends, [e["kind"] for e in panel.dashboard.events].count("restart"),
      panel.kill_button.disabled, panel.start_button.disabled)
"""


@pytest.mark.timeout(400)
def test_after_a_kernel_restart_a_panel_attaches_to_the_run_that_is_going(tmp_path):
    """A run started outside the notebook (`wantrain demo` in a terminal) is watched from a real
    Jupyter kernel, by its run folder; the kernel restarts; a new panel attaches by the PS's address,
    observer token file and CA, sees the run from its first round, live to its end. Nothing was
    restarted: the demo ends normally, and the PS never restarted."""
    import subprocess
    import sys

    from jupyter_client.manager import KernelManager

    run_dir = tmp_path / "run"
    # Small batches (a third of the default's CPU a step) and more rounds: the run lasts as long.
    demo = subprocess.Popen([sys.executable, "-m", "wantrain", "demo", "--rounds", "12", "--inner-steps", "10",
                             "--set", "train.batch_size=4", "--set", "model.block_size=64",
                             "--run-dir", str(run_dir), "--tensorboard", str(tmp_path / "tb")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def run_cell(code: str) -> str:
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=120)
            out: list[str] = []

            def hook(msg) -> None:
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])
                elif msg["msg_type"] == "error":
                    out.append("\n".join(msg["content"]["traceback"]))
            kc.execute_interactive(code, timeout=300, output_hook=hook)
            return "".join(out)
        finally:
            kc.stop_channels()

    try:
        _wait(lambda: (run_dir / "ps.port").is_file() and (run_dir / "observer-token").is_file(), 120, "the demo's PS")
        first = run_cell(KERNEL_ATTACH.format(attach=f"panel.attach(run_dir={str(run_dir)!r})",
                                              wait='panel.dashboard.wait_for("round_end", round=1, timeout_s=200)'))
        assert "RESULT attached [0, 1" in first and " 0 True True" in first, first   # no faults, no Start
        km.restart_kernel(now=False)                     # what the Kernel menu's Restart does
        assert demo.poll() is None                       # the run goes on without its watcher
        port = int((run_dir / "ps.port").read_text())
        again = run_cell(KERNEL_ATTACH.format(
            attach=f"panel.attach('127.0.0.1:{port}', {str(run_dir / 'observer-token')!r}, "
                   f"ca={str(run_dir / 'tls' / 'ca.pem')!r})", wait="panel.wait(300)"))
        assert f"RESULT finished {list(range(12))} 0" in again, again     # from round 0, to the end
        assert demo.wait(120) == 0
        # The demo wrote its telemetry as TensorBoard event files as it went (--tensorboard), and
        # TensorBoard's own reader reads them: the loss from before training to the end, and where
        # every site's every round went.
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
        acc.Reload()
        assert [s.step for s in acc.Scalars("loss/validation")] == list(range(13))
        # Each site's split of each round it took part in (a delta that missed its round under load
        # has none), as the run's own log gives them.
        computing = {t.rsplit("/", 1)[1]: [s.step for s in acc.Scalars(t)]
                     for t in acc.Tags()["scalars"] if t.startswith("time/compute/")}
        took_part = {site: sorted(s["round"] + 1 for s in round_splits(read_events(run_dir)) if s["site"] == site)
                     for site in computing}
        assert len(computing) == 3 and computing == took_part, (computing, took_part)
        assert all(len(steps) >= 4 for steps in computing.values()), computing
        # The recorded run, asked what if its PS sat beside its slowest site (ap-southeast, speed
        # factor 1.5): the model reproduces the recorded round, and the move takes time off it.
        r = subprocess.run([sys.executable, "-m", "wantrain", "whatif", str(run_dir), "--ps-region", "Southeast Asia",
                            "--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        said = json.loads(r.stdout.splitlines()[-1])
        assert abs(said["predicted_round_s"] / said["measured_round_s"] - 1) < 0.25, said
        assert said["whatif_round_s"] < said["predicted_round_s"], said
    finally:
        km.shutdown_kernel(now=True)
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)


def test_attach_names_what_is_wrong(tmp_path):
    panel = ControlPanel()
    with pytest.raises(ConfigError, match="HOST:PORT, got 'nowhere'"):
        panel.attach("nowhere", "token")
    with pytest.raises(ConfigError, match="not the folder of a run started on this machine .no ps.port, observer-token"):
        panel.attach(run_dir=tmp_path)
    with pytest.raises(ConfigError, match="CA file '/no/ca.pem' does not exist"):
        panel.attach("127.0.0.1:1", "token", ca="/no/ca.pem")
    with pytest.raises(ConfigError, match="not both"):
        panel.attach("127.0.0.1:1", "token", run_dir=tmp_path)
    assert panel.state == "idle" and panel.dashboard is None


@pytest.mark.timeout(60)
def test_attach_to_an_address_where_nothing_listens_fails_and_says_why(monkeypatch):
    import socket

    import wantrain.ui.panel as panel_module

    monkeypatch.setattr(panel_module, "ATTACH_CONTACT_S", 0.5)
    with socket.socket() as s:            # a port that was free a moment ago, now closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    panel = ControlPanel()
    panel.attach(f"127.0.0.1:{port}", "token")
    with pytest.raises(ProcessError) as failed:
        panel.wait(30)
    assert panel.state == "failed"
    assert f"nothing listens on 127.0.0.1:{port} (connection refused)" in str(failed.value)
    assert "nothing listens on" in panel.message.value
