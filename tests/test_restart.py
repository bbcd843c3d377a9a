"""The PS killed with SIGKILL and restarted resumes from its checkpoint and journal; sites reconnect alone."""

import os
import signal
import time

import pytest

from wantrain.telemetry import read_events, rows
from wantrain.launch.argv import ps_args, site_args

from .helpers import Proc, free_port, small_config


def wait_rounds(path, n, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(rows(read_events(path), "round_end")) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{n} rounds not reached")


@pytest.mark.timeout(300)
def test_ps_kill_and_restart_loses_no_committed_round(tmp_path):
    cfg = small_config(num_sites=2, sites=["a", "b"], **{"train.rounds": 6})
    (tmp_path / "c.json").write_text(cfg.to_json())
    port = free_port()
    run_dir = tmp_path / "run"
    ps_argv = ps_args(tmp_path / "c.json", port=port, run_dir=run_dir)
    ps = Proc(*ps_argv, log=tmp_path / "ps1.log")
    sites = [Proc(*site_args(f"127.0.0.1:{port}", s, threads=1), log=tmp_path / f"{s}.log")
             for s in ("a", "b")]
    procs = [ps, *sites]
    try:
        wait_rounds(run_dir / "events.jsonl", 2)
        os.killpg(ps.p.pid, signal.SIGKILL)                 # no goodbye, mid-run
        ps.p.wait(10)
        # Each round_end follows its commit record; one more may have committed unannounced.
        committed = len(rows(read_events(run_dir), "round_end"))
        t_restart = time.time()
        ps2 = Proc(*ps_argv, log=tmp_path / "ps2.log")
        procs.append(ps2)
        for s in sites:
            assert s.p.wait(200) == 0, s.text()[-2000:]
        assert ps2.p.wait(60) == 0
    finally:
        for p in procs:
            p.kill()
    events = read_events(run_dir)
    restart = rows(events, "restart")
    assert len(restart) == 1 and committed <= restart[0]["round"] <= committed + 1 and committed >= 2
    ends = [e["round"] for e in rows(events, "round_end")]
    assert ends == sorted(set(ends)) and ends[-1] == 5                       # none applied twice
    assert set(range(committed, 6)) <= set(ends)                             # none lost after the restart
    checks = rows(events, "hash_check")
    assert checks and all(c["ok"] for c in checks)
    assert {c["round"] for c in checks if c["t"] > t_restart} >= {5}
    rejoins = [e for e in rows(events, "join") if e["t"] > t_restart]
    assert {e["site"] for e in rejoins} == {"a", "b"} and all(e["resumed"] for e in rejoins)
    # The run's config is the run's: a different one refuses to resume.
    other = small_config(num_sites=2, sites=["a", "b"], **{"train.rounds": 7})
    (tmp_path / "c2.json").write_text(other.to_json())
    from .helpers import wantrain
    r = wantrain(*ps_args(tmp_path / "c2.json", port="0", run_dir=run_dir))
    assert r.returncode == 2 and "different config" in r.stderr
