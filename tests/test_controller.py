"""The round controller's decisions (wantrain/ps/controller.py), pure, on telemetry recorded from a
real run: `make demo`'s three sites (three-sites scenario, 3 rounds), each delta's arrival after its
round's start and its compute, as the PS logged them in site_round."""

import pytest

from wantrain.ps.controller import LINK_BOUND, MAX_EXTRA, SMALL_CODEC, BudgetController

# (round, site, arrived_s, compute_s) of a recorded run (wantrain demo --rounds 3, 2026-12-05)
RECORDED = [(0, "us-west", 5.792, 5.081), (0, "eu-west", 7.887, 7.113), (0, "ap-southeast", 10.342, 8.944),
            (1, "us-west", 5.689, 5.344), (1, "eu-west", 7.627, 7.153), (1, "ap-southeast", 9.391, 8.562),
            (2, "us-west", 5.939, 5.452), (2, "eu-west", 7.772, 7.390), (2, "ap-southeast", 9.420, 8.525)]
SITES = {"us-west", "eu-west", "ap-southeast"}


def fed(adaptive: bool, budget_s: float = 3.0, codec_mode: str = "int8-huffman") -> BudgetController:
    c = BudgetController(budget_s, adaptive, codec_mode)
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


def test_a_link_bound_site_sends_its_deltas_in_the_small_codec_to_the_end():
    """ap-southeast's link costs 0.895 s a round: with a 1.5 s budget it is link-bound (more than
    LINK_BOUND of it), the others' (0.47-0.49 s) are not."""
    assert 0.49 < LINK_BOUND * 1.5 < 0.895
    c = fed(adaptive=True, budget_s=1.5)
    plan = c.plan(SITES)
    assert plan["ap-southeast"].codec == SMALL_CODEC and SMALL_CODEC in plan["ap-southeast"].reason
    assert plan["us-west"].codec == plan["eu-west"].codec == ""
    for _ in range(3):                          # in the small codec its link looks cheap: it stays in it
        c.observe("ap-southeast", 1.6, 1.5)
    again = c.plan(SITES)
    assert again["ap-southeast"].codec == SMALL_CODEC and SMALL_CODEC not in again["ap-southeast"].reason
    assert c.update_mode() == SMALL_CODEC             # and the update, one for every site, goes small too
    roomy = fed(adaptive=True, budget_s=3.0)
    roomy.plan(SITES)
    assert not roomy.link_bound and roomy.update_mode() == ""          # no link-bound site: the run's
    # never where the run's deltas are not int8 (fp32 baselines, a codec already smaller), nor "fixed"
    for mode, adaptive in (("fp32", True), ("int4-huffman", True), ("topk", True), ("int8-huffman", False)):
        assert all(d.codec == "" for d in fed(adaptive, 1.5, mode).plan(SITES).values()), mode


@pytest.mark.timeout(240)
def test_a_run_under_the_adaptive_controller_trains_each_site_for_its_own_budget(tmp_path):
    """Real processes, one site behind a 2 Mbit/s link: the PS plans each round's budgets and
    codecs, tells them (a `controller` event and the site's RoundStart), and each site computes for
    its own budget; the narrow link's site, link-bound, sends its deltas in int4 + Huffman, which
    the PS counts beside the others' int8 + Huffman, and the updates go in int4 + Huffman."""
    from wantrain.launch.run import Run, describe_scenario
    from wantrain.telemetry import read_events, rows

    from .helpers import slowed, small_config

    plan = describe_scenario("loopback")
    narrow = plan.names[2]
    plan = plan.with_site(narrow, bandwidth_mbps=2.0)        # its 0.8 MB delta: about 3 s on the wire
    plan = slowed(plan)              # budgets and codecs are what this checks, not compute
    cfg = small_config(**{"train.rounds": 4, "train.round_budget_s": 2.0, "schedule.controller": "adaptive",
                          "model.preset": "tiny"})          # tiny: the delta's size is the link's cost
    with Run(cfg, run_dir=tmp_path / "run", plan=plan) as run:
        for _ in run.follow(timeout_s=200):
            pass
    events = read_events(tmp_path / "run")
    decisions = {(e["round"], e["site"]): e for e in rows(events, "controller")}
    assert len(decisions) == 3 * 4 and len(rows(events, "round_end")) == 4
    assert all(e["comm_s"] is None and e["budget_s"] == 2.0 for (r, _), e in decisions.items() if r == 0)
    later = [e for (r, _), e in decisions.items() if r >= 1]
    assert all(e["comm_s"] is not None and 2.0 <= e["budget_s"] <= 4.0 for e in later), later
    assert all(decisions[r, narrow]["budget_s"] == 2.0 for r in range(4))    # the costliest link: the budget
    assert all(e["budget_s"] > 2.0 for e in later if e["site"] != narrow)    # the others compute longer
    # a site is link-bound from the first round its link was measured above LINK_BOUND of the budget:
    # the narrow one from round 1; a loopback site only where a busy machine made its round that slow
    bound_from = {site: min((r for (r, x), e in decisions.items() if x == site and (e["comm_s"] or 0) > LINK_BOUND * 2.0),
                            default=99) for site in plan.names}
    assert bound_from[narrow] == 1, decisions
    for s in rows(events, "site_round"):                      # and each site computed for its own budget
        assert s["compute_s"] >= decisions[s["round"], s["site"]]["budget_s"] - 0.01, s
        small = s["round"] >= bound_from[s["site"]]
        assert s["encoding"] == ("int4-huffman" if small else "int8-huffman"), s
        assert decisions[s["round"], s["site"]]["codec"] == s["encoding"]
    # from round 1 on every update goes in int4 + Huffman too, and every replica decodes it alike
    update_mb = [e["wire_bytes"] / 1e6 for e in rows(events, "round_end")]
    assert all(mb < 0.6 * update_mb[0] for mb in update_mb[1:]), update_mb
    assert all(e["ok"] for e in rows(events, "hash_check")) and rows(events, "hash_check")
    assert all(set(e["sites"]) == set(plan.names) for e in rows(events, "round_end"))   # every delta counted
    # the dashboard and the report draw every decision, its reason in the hover
    from wantrain.telemetry.charts import figures

    (chart,) = [f for f in figures(events) if f.layout.title.text.startswith("Controller")]
    drawn = {t.name.removeprefix("budget "): t for t in chart.data if t.name.startswith("budget ")}
    assert sorted(drawn) == sorted({site for _, site in decisions})
    for site, trace in drawn.items():
        assert list(trace.y) == [decisions[r, site]["budget_s"] for r in range(4)]
        assert list(trace.customdata) == [decisions[r, site]["reason"] for r in range(4)]
