"""A site whose link goes dark for several deadlines comes back on its own stream: no disconnect,
no model download, its delta handled by `late_policy`, its log saying what became of it.

Real processes: the PS, three sites and the link emulator, the dark site's link taken down with
`Run.outage` for 2.5, 5 and 10 times the deadline in force (one run, "drop"), and 2.5 times
under "zero-outside", the default (a second run). The PS's side of it (who is counted on, what a late delta
becomes) is unit-tested without a network in test_rounds.py and test_round_state.py.
"""

from __future__ import annotations

import re

import pytest

from wantrain.launch.run import Run, describe_scenario
from wantrain.telemetry import read_events, rows

from .cluster import check_run
from .helpers import small_config

DEADLINE_S = 2.0


def dark_run(tmp_path, policy: str, outages: list[float], rounds: int) -> tuple[list[dict], str, str]:
    """Three unshaped sites, rounds of a 1 s budget and a fixed 2 s deadline; the third site's link
    goes dark once per factor in `outages` (x the deadline), each time once it is back in a round.
    Returns the run's events, the dark site's name and its log."""
    plan = describe_scenario("loopback").replace(time_scale=1.0)
    for name in plan.names:
        # A quarter of each budget computing, the rest waiting: rounds pass the same time, and the
        # three sites leave most of the CPU to whatever else runs (this test is mostly waiting).
        plan = plan.with_site(name, speed_factor=4.0)
    dark = plan.names[2]
    cfg = small_config(**{"train.rounds": rounds, "train.inner_steps": 10, "train.round_budget_s": 1.0,
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


def check_dark_site(events: list[dict], dark: str, log: str, rounds: int, actions: set[str]) -> None:
    check_run(events, rounds)                          # every round once, every replica check equal
    # No disconnect and no model download: each site joined once, and nobody left or resynced.
    assert sorted(e["site"] for e in rows(events, "join")) == sorted({e["site"] for e in rows(events, "join")})
    end = rows(events, "run_end")[0]["t"]
    trouble = [e for e in events if e["kind"] in ("leave", "catchup", "error") and e["t"] < end]
    assert not trouble, trouble
    outages = [e for e in rows(events, "outage_start") if e["site"] == dark]
    lates = [e for e in rows(events, "late_delta") if e["site"] == dark]
    assert len(outages) >= 1 and len(lates) >= len(outages), (outages, lates)
    for out in outages:
        # The round the site was in when its link went dark: its delta is handled by the policy.
        owed = max(e["round"] for e in rows(events, "round_start") if e["t"] <= out["t"])
        late = next(e for e in lates if e["round"] >= owed)
        assert late["action"] in actions and late["reason"], late
        # Once it owed that delta, no round started counting on it until it was back.
        back = next(e for e in rows(events, "round_end") if e["round"] > late["round"] and dark in e["sites"])
        during = [e for e in rows(events, "round_start") if late["round"] < e["round"] <= back["round"]
                  and e["t"] < late["t"]]
        assert during and all(dark not in e["sites"] and dark in e["dark"] for e in during), during
        # Its log names what became of that round's delta, and why.
        said = [ln for ln in log.splitlines() if re.search(rf"round {late['round']}\b", ln)
                and ("committed without this site's delta" in ln or "the delta of round" in ln)]
        assert said and any("late_policy" in ln or "deadline" in ln for ln in said), (late, said)


@pytest.mark.timeout(600)
@pytest.mark.xdist_group("heavy")     # never beside another heavy test (Makefile)
def test_a_site_dark_for_2_5_5_and_10_deadlines_comes_back_on_its_stream(tmp_path):
    # Rounds take at least their 1 s budget, so the outages (5, 10 and 20 s) span at most 35 rounds:
    # from round 2, with a round between them, the dark site is back by round 40 (measured: 30).
    rounds = 44
    events, dark, log = dark_run(tmp_path, "drop", [2.5, 5.0, 10.0], rounds)
    check_dark_site(events, dark, log, rounds, {"dropped", "kept"})
    assert len([e for e in rows(events, "outage_start") if e["site"] == dark]) == 3


@pytest.mark.timeout(400)
@pytest.mark.xdist_group("heavy")     # never beside another heavy test (Makefile)
def test_under_the_default_policy_a_dark_site_pushes_what_it_has(tmp_path):
    rounds = 16
    events, dark, log = dark_run(tmp_path, "zero-outside", [2.5], rounds)
    check_dark_site(events, dark, log, rounds, {"deferred", "dropped", "kept"})
    # What it pushed late went outside the outer momentum of the next commit, once.
    deferred = [e for e in rows(events, "late_delta") if e["site"] == dark and e["action"] == "deferred"]
    reconciled = [k for e in rows(events, "round_end") for k in e["reconciled"]]
    assert all(reconciled.count(f"{dark}@{e['round']}") == 1 for e in deferred), (deferred, reconciled)
