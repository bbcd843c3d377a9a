"""Fault injection: SIGKILL a site (real processes) in every phase; reset a link (a run in this
process, tests/harness.py: nothing dies in it). The PS killed is tests/test_recovery.py's.

After each fault the run completes, every committed round is committed exactly once, and
every replica that reports a hash agrees with the PS bit for bit. Stalls (`--stall PHASE=S`)
hold a process at a precise point of its protocol so that the kill lands there.
"""

import time

import pytest

from wantrain.telemetry import rows

from .cluster import Cluster, check_run
from .harness import reset_b_while_it_pushes
from .helpers import small_config

ROUNDS = 6


def config(**changes):
    # About 2 s per round on 2 cores, so a restarted process (about 3 s) rejoins mid-run.
    base = {"sites": ["a", "b", "c"], "train.rounds": ROUNDS, "train.inner_steps": 20, "schedule.quorum_wait_s": 1.0,
            "schedule.deadline_min_s": 15.0, "schedule.deadline_initial_s": 60.0}
    base.update(changes)
    return small_config(**base)



@pytest.mark.timeout(300)
def test_a_site_killed_in_each_phase_rejoins(tmp_path):
    """Site b is killed three times in one run and started again at once each time: while it
    trains (round 1), after the first chunk of its round-3 push, and halfway through the download
    of the model when it rejoins (both held there by --stall). Each time it resumes its shard and
    trains again."""
    # A long quorum wait holds each round after a kill until b is back (it was in the last round),
    # so the run cannot end before the restarted process (3-5 s to start, more under load) trains:
    # with 1 s, a busy machine once finished all 10 rounds first. Rounds 5 and 6 check that the
    # run goes on with it.
    rounds = 7
    c = Cluster(tmp_path, config(**{"train.rounds": rounds, "schedule.quorum_wait_s": 120.0}))
    kills: dict[str, float] = {}
    try:
        c.start_ps().wait_for("listening on")
        for name in ("a", "b", "c"):
            c.start_site(name)
        c.wait_event("round_end", round=0)
        c.sites["b"].wait_for("round 1 starts")
        time.sleep(0.3)
        kills["train"] = c.kill(c.sites["b"])
        c.start_site("b", "--stall", "push@3=60").wait_for("stalling", timeout=180)
        kills["push"] = c.kill(c.sites["b"])
        c.start_site("b", "--stall", "download=60").wait_for("stalling", timeout=120)
        kills["download"] = c.kill(c.sites["b"])
        c.start_site("b")
        events = c.finish()
    finally:
        c.close()
    check_run(events, rounds)
    for phase, killed in kills.items():
        back = [e for e in rows(events, "join") if e["site"] == "b" and e["t"] > killed]
        assert back and back[0]["resumed"] and back[0]["data_position"] > 0, phase    # its shard resumes
        trained = [e for e in rows(events, "site_round") if e["site"] == "b" and e["t"] > killed]
        assert trained, f"killed in {phase}, the restarted site never trained again"
        e = trained[0]
        began = e["t"] - e["compute_s"] - e["encode_s"] - e["send_s"]      # its first inner step after the restart
        print(f"\n{phase}: site b restarted at once; rejoined {back[0]['t'] - killed:.1f} s, training again "
              f"{began - killed:.1f} s, first delta in {e['t'] - killed:.1f} s after its kill")


@pytest.mark.timeout(300)
def test_link_reset_mid_transfer(tmp_path):
    """A site's connection is reset while its delta is half sent: it reconnects and the run goes on.
    The next round waits for it (a long quorum wait): with the default 1 s, a busy machine once let
    a and c finish every round before b was back."""
    events, t_reset = reset_b_while_it_pushes(config(**{"schedule.quorum_wait_s": 60.0}), tmp_path / "run", "push@2", 3.0)
    check_run(events, ROUNDS)
    left = [e for e in rows(events, "leave") if e["site"] == "b" and e["t"] >= t_reset - 1]
    back = [e for e in rows(events, "join") if e["site"] == "b" and e["t"] > t_reset]
    assert left and back, "the reset did not break and restore b's session"
    assert any(e["site"] == "b" for e in rows(events, "site_round") if e["t"] > t_reset)
