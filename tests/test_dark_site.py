"""A site whose link goes dark for several deadlines comes back on its own stream: no disconnect,
no model download, its delta handled by `late_policy`, its log saying what became of it.

Real processes: the PS, three sites and the link emulator, the dark site's link taken down with
`Run.outage` for 2.5, 5 and 10 times the deadline in force, under "drop". The same run under
"zero-outside", the default, with one outage of 2.5 deadlines, is tutorial 03's: tests/claims.py
checks its run with `check_dark_site` as well, and that what the site pushed late was reconciled
once. The PS's side of it (who is counted on, what a late delta becomes) is unit-tested without a
network in test_rounds.py and test_round_state.py.
"""

from __future__ import annotations


import pytest

from wantrain.launch.run import Run, describe_scenario
from wantrain.telemetry import read_events, rows

from .cluster import check_dark_site
from .helpers import slowed, small_config

DEADLINE_S = 2.0


def dark_run(tmp_path, policy: str, outages: list[float], rounds: int,
             preset: str = "micro") -> tuple[list[dict], str, str]:
    """Three unshaped sites, rounds of a 1 s budget and a fixed 2 s deadline; the third site's link
    goes dark once per factor in `outages` (x the deadline), each time once it is back in a round.
    Returns the run's events, the dark site's name and its log. (bench/dark_site.py runs it with
    the `tiny` model its figures were measured with.)"""
    plan = describe_scenario("loopback").replace(time_scale=1.0)
    plan = slowed(plan)              # rounds pass the same time; this test is mostly waiting
    dark = plan.names[2]
    cfg = small_config(**{"model.preset": preset, "train.rounds": rounds, "train.inner_steps": 10,
                          "train.round_budget_s": 1.0,
                          "schedule.deadline_s": DEADLINE_S, "recovery.late_policy": policy, "schedule.quorum_wait_s": 1.0})
    pending, back_after = list(outages), 2          # the first outage once round 2 committed with everyone
    with Run(cfg, run_dir=tmp_path / policy, plan=plan) as run:
        for ev in run.follow(timeout_s=120 + 4 * rounds):
            if ev["kind"] == "round_end" and pending and ev["round"] >= back_after and dark in ev["sites"]:
                run.outage(dark, pending.pop(0) * DEADLINE_S)
                back_after = ev["round"] + 1
        codes = run.wait_exit(60)
    assert not pending, f"the run ended before every outage ({pending} left): too few rounds"
    assert all(c == 0 for name, c in codes.items() if name != "link emulator"), codes
    return read_events(run.run_dir), dark, (run.run_dir / f"site-{dark}.log").read_text()


@pytest.mark.timeout(600)
@pytest.mark.xdist_group("heavy")     # never beside another heavy test (Makefile)
def test_a_site_dark_for_2_5_5_and_10_deadlines_comes_back_on_its_stream(tmp_path):
    # Rounds take at least their 1 s budget, so the outages (5, 10 and 20 s) span at most 35 rounds:
    # from round 2, with a round between them, the dark site is back by round 40 (measured: 30).
    rounds = 44
    events, dark, log = dark_run(tmp_path, "drop", [2.5, 5.0, 10.0], rounds)
    check_dark_site(events, dark, log, rounds, {"dropped", "kept"})
    assert len([e for e in rows(events, "outage_start") if e["site"] == dark]) == 3
