"""The round controller's decisions (wantrain/ps/controller.py), pure, on telemetry recorded from a
real run: `make demo`'s three sites (three-sites scenario, 3 rounds), each delta's arrival after its
round's start and its compute, as the PS logged them in site_round."""

import pytest

from wantrain.ps.controller import MAX_EXTRA, BudgetController

# (round, site, arrived_s, compute_s) of a recorded run (wantrain demo --rounds 3, 2026-12-05)
RECORDED = [(0, "us-west", 5.792, 5.081), (0, "eu-west", 7.887, 7.113), (0, "ap-southeast", 10.342, 8.944),
            (1, "us-west", 5.689, 5.344), (1, "eu-west", 7.627, 7.153), (1, "ap-southeast", 9.391, 8.562),
            (2, "us-west", 5.939, 5.452), (2, "eu-west", 7.772, 7.390), (2, "ap-southeast", 9.420, 8.525)]
SITES = {"us-west", "eu-west", "ap-southeast"}


def fed(adaptive: bool, budget_s: float = 3.0) -> BudgetController:
    c = BudgetController(budget_s, adaptive)
    for _, site, arrived, compute in RECORDED:
        c.observe(site, arrived, compute)
    return c


def test_fixed_gives_every_site_the_configured_budget():
    plan = fed(adaptive=False).plan(SITES)
    assert {s: d.budget_s for s, d in plan.items()} == dict.fromkeys(SITES, 3.0)


def test_adaptive_gives_each_site_what_the_costliest_link_leaves_it():
    plan = fed(adaptive=True).plan(SITES)
    comm = {s: d.comm_s for s, d in plan.items()}
    # the medians of arrival less compute: ap-southeast's far link costs most
    assert comm == pytest.approx({"us-west": 0.487, "eu-west": 0.474, "ap-southeast": 0.895}, abs=1e-3)
    assert plan["ap-southeast"].budget_s == 3.0 and "costliest link" in plan["ap-southeast"].reason
    for s in ("us-west", "eu-west"):
        assert 3.0 < plan[s].budget_s <= MAX_EXTRA * 3.0 and "more delivers with it" in plan[s].reason
    # planned so that every delta arrives together: budget + what its link costs, the same for all
    assert len({round(d.budget_s + d.comm_s, 9) for d in plan.values()}) == 1


def test_a_site_not_measured_yet_and_a_huge_gap_are_bounded():
    c = fed(adaptive=True, budget_s=0.2)
    plan = c.plan(SITES | {"new"})
    assert plan["new"].budget_s == 0.2 and plan["new"].comm_s is None
    assert plan["us-west"].budget_s == MAX_EXTRA * 0.2          # 0.2 + 0.41 s more, capped at twice the budget
    empty = BudgetController(3.0, adaptive=True).plan(SITES)
    assert all(d.budget_s == 3.0 and d.comm_s is None for d in empty.values())


def test_only_the_last_rounds_count():
    c = BudgetController(3.0, adaptive=True)
    for arrived in (20.0, 4.0, 4.0, 4.0):          # one outage-long round, then three ordinary ones
        c.observe("a", arrived, 3.0)
    assert c.comm_s("a") == 1.0


@pytest.mark.timeout(240)
def test_a_run_under_the_adaptive_controller_trains_each_site_for_its_own_budget(tmp_path):
    """Real processes: the PS plans each round's budgets, tells them (a `controller` event and the
    site's RoundStart), and each site computes for its own."""
    from wantrain.run import Run
    from wantrain.telemetry import read_events, rows

    from .helpers import small_config

    cfg = small_config(**{"train.rounds": 4, "train.round_budget_s": 0.6, "train.controller": "adaptive"})
    with Run(cfg, run_dir=tmp_path / "run") as run:
        for _ in run.follow(timeout_s=200):
            pass
    events = read_events(tmp_path / "run")
    decisions = {(e["round"], e["site"]): e for e in rows(events, "controller")}
    assert len(decisions) == 3 * 4 and len(rows(events, "round_end")) == 4
    assert all(e["comm_s"] is None and e["budget_s"] == 0.6 for (r, _), e in decisions.items() if r == 0)
    later = [e for (r, _), e in decisions.items() if r >= 2]
    assert all(e["comm_s"] is not None and 0.6 <= e["budget_s"] <= 1.2 for e in later), later
    assert min(e["budget_s"] for e in later) == 0.6          # each round, the costliest link's site: the budget
    for s in rows(events, "site_round"):                      # and each site computed for its own budget
        assert s["compute_s"] >= decisions[s["round"], s["site"]]["budget_s"] - 0.01, s
