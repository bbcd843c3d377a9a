"""Faults on purpose through the Run object (what notebook fault buttons call): kill a site, restart the PS."""

import pytest

from wantrain.run import Run
from wantrain.telemetry import read_events, rows

from .cluster import check_run
from .helpers import pid_alive, small_config


@pytest.mark.timeout(300)
def test_kill_a_site_and_restart_the_ps_through_run(tmp_path):
    cfg = small_config(num_sites=2, **{"train.rounds": 6, "train.inner_steps": 20, "train.quorum_wait_s": 1.0})
    with Run(cfg, run_dir=tmp_path / "run") as run:
        victim = run.sites[0]
        old_site, old_ps = run.workers[victim], run.ps
        for ev in run.follow(timeout_s=240):         # follow() goes on through both faults
            if ev["kind"] == "round_end" and ev["round"] == 1:
                run.kill_site(victim)
                run.start_site(victim)
            if ev["kind"] == "round_end" and ev["round"] == 3:
                run.restart_ps()
        codes = run.wait_exit(60)
    assert not pid_alive(old_site.pid) and not pid_alive(old_ps.pid)
    assert all(c == 0 for c in codes.values()), codes
    events = read_events(run.run_dir)                                  # all of them, after run_end too
    check_run(events, 6)
    assert [e["round"] for e in rows(run.events, "restart")] == [4]   # follow() saw the PS come back
    rejoins = [e for e in rows(events, "join") if e["site"] == victim and e["resumed"]]
    assert len(rejoins) >= 2                                           # after its kill, after the PS restart
