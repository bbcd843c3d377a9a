"""Faults on purpose through the Run object (what notebook fault buttons call): kill a site, restart the PS."""

import pytest

from wantrain.run import Run
from wantrain.telemetry import read_events, rows

from .cluster import check_run
from .helpers import pid_alive, small_config


@pytest.mark.timeout(300)
def test_kill_a_site_and_restart_the_ps_through_run(tmp_path):
    # Rounds are 2 s compute budgets, so the killed site (a new process: seconds on a busy machine)
    # is back before the run ends however fast the machine is; the PS restarts once it is.
    cfg = small_config(num_sites=2, **{"train.rounds": 8, "train.round_budget_s": 2.0, "train.quorum_wait_s": 1.0})
    restarted_after = None
    with Run(cfg, run_dir=tmp_path / "run") as run:
        victim = run.sites[0]
        old_site, old_ps = run.workers[victim], run.ps
        killed = back = False
        for ev in run.follow(timeout_s=240):         # follow() goes on through both faults
            if ev["kind"] == "round_end" and ev["round"] == 1 and not killed:
                run.kill_site(victim)
                run.start_site(victim)
                killed = True
            back = back or (killed and ev["kind"] == "join" and ev["site"] == victim)
            if ev["kind"] == "round_end" and ev["round"] >= 3 and back and restarted_after is None:
                run.restart_ps()
                restarted_after = ev["round"]
        codes = run.wait_exit(60)
    assert not pid_alive(old_site.pid) and not pid_alive(old_ps.pid)
    assert all(c == 0 for c in codes.values()), codes
    events = read_events(run.run_dir)                                  # all of them, after run_end too
    check_run(events, 8)
    assert restarted_after is not None and restarted_after <= 6, "the killed site was not back in time"
    restarts = [e["round"] for e in rows(run.events, "restart")]       # follow() saw the PS come back ...
    assert len(restarts) == 1 and restarted_after + 1 <= restarts[0] <= restarted_after + 2   # ... losing nothing
    rejoins = [e for e in rows(events, "join") if e["site"] == victim and e["resumed"]]
    assert len(rejoins) >= 2                                           # after its kill, after the PS restart
