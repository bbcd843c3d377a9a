"""Rounds that never wait forever: deadlines, partial aggregation, late deltas (domain, no network)."""

import asyncio
import time

import numpy as np
import pytest

from wantrain.config import ScheduleConfig
from wantrain.transport.messages import DeltaOutcome, HashReport, Join, RoundResult, RoundStart
from wantrain.ps import ParameterServer
from wantrain.ps import rounds
from wantrain.ps.rounds import RoundClock, stale_weight
from wantrain.models.params import param_hash

from .helpers import small_config
from .test_server import delta_chunks, drain, enter, rows_of


def test_derived_deadline_follows_recent_arrivals():
    clock = RoundClock(ScheduleConfig(deadline_initial_s=300, deadline_min_s=2, deadline_factor=3))
    assert clock.deadline_s() == 300                          # nothing timed yet
    for site, a in (("a", 1.0), ("b", 1.2), ("c", 5.0)):
        clock.arrived(site, a)
    assert clock.deadline_s() == pytest.approx(3.6)           # 3 x median 1.2
    budget = RoundClock(ScheduleConfig(deadline_min_s=2, deadline_factor=3), budget_s=10)
    budget.arrived("a", 10.5)
    assert budget.deadline_s() == pytest.approx(12)           # budget + max(floor, 3 x 0.5)
    assert RoundClock(ScheduleConfig(deadline_s=7)).deadline_s() == 7


def test_a_site_away_for_a_while_keeps_its_place_in_the_deadline():
    """The typical arrival is the median over sites of each site's own median: while c is dark, a and
    b arrive round after round, and the deadline still leaves c the time it took before; nor can one
    site, however slow or however many deltas it sends, move it past the next site's time."""
    clock = RoundClock(ScheduleConfig(deadline_min_s=0.5, deadline_factor=1.5))
    for site, a in (("a", 2.0), ("b", 2.4), ("c", 3.0)):
        clock.arrived(site, a)
    before = clock.deadline_s()
    for _ in range(20):                                       # c is dark: only a and b are timed
        clock.arrived("a", 1.8)
        clock.arrived("b", 2.0)
    assert clock.deadline_s() == pytest.approx(1.5 * 2.0) and clock.deadline_s() >= 0.8 * before
    for _ in range(20):
        clock.arrived("c", 500.0)                             # c drips: still the middle site's time
    assert clock.deadline_s() == pytest.approx(1.5 * 2.0)
    assert stale_weight(1000, 2, 0.5) == 250


def test_one_sites_lateness_cannot_stretch_the_deadline():
    two = RoundClock(ScheduleConfig(deadline_min_s=0.5, deadline_factor=3, deadline_initial_s=600), budget_s=10)
    for _ in range(8):
        two.arrived("honest", 10.4)
        two.arrived("drip", 90.0)
    assert two.deadline_s() == pytest.approx(10 + 3 * 0.4)    # of two sites, the faster one's time
    assert two.deadline_s() == pytest.approx(10 + 3 * 0.4)    # however many late deltas it sends


def test_the_first_round_is_bounded_by_its_first_half():
    """Nothing timed: deadline_initial_s, brought forward once half the sites are in, to 3x their
    time but never under deadline_min_s: a drip holds round 0 for 3x the others' time."""
    clock = RoundClock(ScheduleConfig(deadline_initial_s=600, deadline_min_s=10))
    assert clock.untimed and clock.deadline_s() == 600
    assert clock.first_round_bound_s([], 2) is None and clock.first_round_bound_s([3.0], 1) is None
    assert clock.first_round_bound_s([3.0], 2) == 10                   # the floor
    assert clock.first_round_bound_s([8.0], 2) == 24                   # two sites: 3 x the other's time
    assert clock.first_round_bound_s([30.0], 3) is None                # two of three needed
    assert clock.first_round_bound_s([30.0, 20.0], 3) == 90            # 3 x the second arrival
    assert clock.first_round_bound_s([300.0, 290.0], 3) == 600         # never past deadline_initial_s
    clock.arrived("a", 1.0)
    assert not clock.untimed and not RoundClock(ScheduleConfig(deadline_s=30)).untimed
    assert RoundClock(ScheduleConfig(deadline_initial_s=5)).first_round_bound_s([1.0], 2) == 5    # never later


def test_a_quorum_brings_the_deadline_to_a_grace_that_follows_the_usual_spread():
    """schedule.quorum_share: once that share of the members are in, the deadline is the quorum's last
    arrival plus grace_factor x how much later the slowest member usually delivers than the
    quorum's (each one's median), never under QUORUM_GRACE_FLOOR_S."""
    clock = RoundClock(ScheduleConfig(deadline_s=30, quorum_share=0.5, grace_factor=2.0))
    members = {"a", "b", "c", "d"}
    assert clock.quorum_bound_s([1.0], members) is None                   # two of four needed
    assert clock.quorum_bound_s([1.0, 2.0], members) == 2.0 + rounds.QUORUM_GRACE_FLOOR_S   # nothing timed
    for site, usual in (("a", 1.0), ("b", 2.0), ("c", 2.5), ("d", 4.0)):
        clock.arrived(site, usual)
    assert clock.quorum_bound_s([1.5, 1.0], members) == pytest.approx(1.5 + 2.0 * (4.0 - 2.0))
    assert clock.quorum_bound_s([1.1, 1.0], {"a", "b"}) == pytest.approx(1.0 + 2.0 * (2.0 - 1.0))   # one of two
    assert clock.quorum_bound_s([1.0, 1.1], {"a", "c"}) == pytest.approx(1.0 + 2.0 * (2.5 - 1.0))
    assert RoundClock(ScheduleConfig(deadline_s=30)).quorum_bound_s([1.0, 2.0], members) is None   # off


@pytest.mark.timeout(120)
def test_a_round_with_a_quorum_closes_a_grace_after_it_not_at_its_deadline(tmp_path):
    """Three sites, quorum_share 0.5 (two), a fixed deadline of 60 s: a and b deliver, c never does.
    The round commits about QUORUM_GRACE_FLOOR_S after b (nothing timed yet), with c missing."""
    async def scenario():
        cfg = small_config(num_sites=3, **{"train.rounds": 2, "schedule.deadline_s": 60.0, "schedule.quorum_share": 0.5,
                                           "recovery.late_policy": "stale"})
        ps = ParameterServer(cfg, run_dir=tmp_path)
        (a0, am0), (b0, bm0) = (delta_chunks(ps, 0, seed=s) for s in (0, 1))
        a, b, c = (enter(ps, Join(n)) for n in "abc")
        drain(a), drain(b), drain(c)
        for link, msgs, m in ((a, a0, am0), (b, b0, bm0)):
            for x in msgs:
                ps.on_chunk(link, x)
            await ps.on_metrics(link, m)
        t0 = time.monotonic()
        while ps.ledger.round == 0 and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.05)
        await ps.round_task
        return ps, time.monotonic() - t0
    ps, took = asyncio.run(scenario())
    deadline, = rows_of(ps, "deadline")
    assert deadline["missing"] == ["c"] and deadline["deadline_s"] < 10 and took < 10
    assert rows_of(ps, "round_end")[0]["sites"] == ["a", "b"]


@pytest.mark.timeout(120)
def test_a_site_that_drips_its_first_delta_holds_the_others_only_to_the_bound(tmp_path):
    """Round 0: a delivers after about 2 s; b sends one chunk and then nothing. With
    deadline_initial_s 60 s, the round commits at 3x a's time (issue 55: it held the others 54 s
    against their 7-10 s under a 120 s floor), naming b."""
    async def scenario():
        cfg = small_config(num_sites=2, **{"train.rounds": 2, "schedule.deadline_initial_s": 60.0,
                                           "schedule.deadline_min_s": 1.0})
        ps = ParameterServer(cfg, run_dir=tmp_path)
        (a0, am0), (b0, _) = (delta_chunks(ps, 0, seed=s) for s in (0, 1))
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        drain(a), drain(b)
        t0 = time.monotonic()
        ps.on_chunk(b, b0[0])
        await asyncio.sleep(2.0)
        for c in a0:
            ps.on_chunk(a, c)
        await ps.on_metrics(a, am0)
        while ps.ledger.round == 0 and time.monotonic() - t0 < 59:
            await asyncio.sleep(0.1)
        await ps.round_task
        return ps, time.monotonic() - t0
    ps, took = asyncio.run(scenario())
    deadline, = rows_of(ps, "deadline")
    a_s = ps.clock.arrivals["a"][0]
    assert deadline["missing"] == ["b"] and deadline["deadline_s"] == pytest.approx(3 * a_s, rel=0.01) and a_s >= 2.0
    assert took < 3 * a_s + 10                          # not deadline_initial_s
    assert rows_of(ps, "round_end")[0]["sites"] == ["a"]


@pytest.mark.timeout(120)
def test_a_site_that_drips_its_delta_holds_the_others_only_to_their_own_deadline(tmp_path):
    """Round 0 times both sites; in round 1 b sends one chunk and then nothing more. The deadline
    is derived from a's time (the faster of two), not stretched by b's: the round commits at it
    with a deadline event naming b."""
    async def scenario():
        cfg = small_config(num_sites=2, **{"train.rounds": 3, "schedule.deadline_min_s": 0.5,
                                           "schedule.deadline_factor": 3.0, "schedule.deadline_initial_s": 600.0})
        ps = ParameterServer(cfg, run_dir=tmp_path)
        # encoded before the clock runs (a busy machine)
        (a0, am0), (b0, bm0), (a1, am1), (b1, _) = (delta_chunks(ps, r, seed=s) for r, s in ((0, 0), (0, 1), (1, 2), (1, 3)))

        async def send(link, msgs, metrics):
            for c in msgs:
                ps.on_chunk(link, c)
            await ps.on_metrics(link, metrics)

        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        drain(a), drain(b)
        await asyncio.sleep(1.0)
        await send(a, a0, am0)                                # round 0 now waits 3x this for b
        await asyncio.sleep(0.5)
        await send(b, b0, bm0)                                # b is slower, but in time
        await ps.round_task
        ps.on_hash_report(a, HashReport(0, ps.ledger.hash)), ps.on_hash_report(b, HashReport(0, ps.ledger.hash))
        start = rows_of(ps, "round_start")[-1]
        a_s, b_s = ps.clock.arrivals["a"][0], ps.clock.arrivals["b"][0]
        assert start["round"] == 1 and start["deadline_s"] == pytest.approx(max(0.5, 3 * a_s))
        assert start["deadline_s"] < 3 * b_s                  # from a's time, not b's
        ps.on_chunk(b, b1[0])                                # b's first chunk, then a drip of nothing
        await send(a, a1, am1)
        while not any(e["round"] == 1 for e in rows_of(ps, "round_end")):      # round 1 commits at its deadline
            await asyncio.sleep(0.05)
        # (round 2, a alone, may reach its own deadline meanwhile on a busy machine: look at round 1's rows)
        assert next(d for d in rows_of(ps, "deadline") if d["round"] == 1)["missing"] == ["b"]
        assert next(e for e in rows_of(ps, "round_end") if e["round"] == 1)["sites"] == ["a"]

    asyncio.run(scenario())


async def push(ps, link, round_, seed):
    msgs, m = delta_chunks(ps, round_, seed=seed)
    for c in msgs:
        ps.on_chunk(link, c)
    await ps.on_metrics(link, m)


def starts(link):
    return [m for m in drain(link) if isinstance(m, RoundStart)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["drop", "stale", "rescale", "zero-outside"])
def test_deadline_aggregates_what_arrived_and_handles_the_late_delta(tmp_path, policy):
    async def scenario():
        cfg = small_config(num_sites=2, **{"train.rounds": 3, "schedule.deadline_s": 4.0, "recovery.late_policy": policy})
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a_msgs, a_metrics = delta_chunks(ps, 0, seed=0)      # encoded before the clock runs (a busy machine)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        drain(a), drain(b)
        for c in a_msgs:
            ps.on_chunk(a, c)
        await ps.on_metrics(a, a_metrics)
        assert ps.ledger.round == 0                                  # b is still training
        await asyncio.sleep(4.3)                              # the deadline passes
        await ps.round_task
        assert ps.ledger.round == 1 and ps.rounds.late.keys() == {"b"}
        end = rows_of(ps, "round_end")[-1]
        assert end["sites"] == ["a"] and end["missed"] == ["b"]
        assert rows_of(ps, "deadline")[-1]["missing"] == ["b"]
        # b, still pushing round 0, is sent round 0's update too (its replica must follow), but no
        # start of round 1: it owes round 0's delta and may be dark, so round 1 does not count on it.
        out_b = drain(b)
        assert isinstance(out_b[-1], RoundResult) and out_b[-1].round == 0 and out_b[-1].sites == ("a",)
        assert not [m for m in out_b if isinstance(m, RoundStart)]
        start = rows_of(ps, "round_start")[-1]
        assert start["round"] == 1 and start["sites"] == ["a"] and start["dark"] == ["b"]
        h1 = ps.ledger.hash
        await push(ps, b, 0, seed=1)                          # b's late delta for round 0
        late = rows_of(ps, "late_delta")[-1]
        assert late["site"] == "b" and late["rounds_late"] == 1
        applied = policy in ("stale", "zero-outside")
        assert late["action"] == ("deferred" if applied else "dropped")
        told = [m for m in drain(b) if isinstance(m, DeltaOutcome)]     # and b hears what and why
        assert [(m.round, m.outcome) for m in told] == [(0, late["action"])] and late["reason"] == told[0].reason
        assert {"stale": "late_policy stale: it counts in round 1", "drop": "late_policy drop: a late delta is never",
                "rescale": "the mean over the deltas that came stood in for it",
                "zero-outside": "applied when round 1 commits, at its share of round 0, outside the outer momentum",
                }[policy] in told[0].reason
        assert ps.ledger.hash == h1 == param_hash(ps.model)          # a late delta never changes a committed round
        ps.on_hash_report(b, HashReport(0, h1))               # b applied round 0: it is current, and in round 1
        assert [s.round for s in starts(b)] == [1] and ps.rounds.members == {"a", "b"}
        await push(ps, a, 1, seed=2)
        await push(ps, b, 1, seed=3)
        await ps.round_task
        end = rows_of(ps, "round_end")[-1]
        assert ps.ledger.round == 2 and end["sites"] == ["a", "b"]
        assert end["late_sites"] == (["b"] if applied else [])

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_missing_site_holds_nobody_up_after_the_first_round(tmp_path):
    async def scenario():
        cfg = small_config(num_sites=2, **{"train.rounds": 4, "schedule.quorum_wait_s": 0.3,
                                           "train.round_budget_s": 30.0, "schedule.deadline_s": 60.0})
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a = enter(ps, Join("a"))
        assert not starts(a)                                   # a run starts with all its sites
        b = enter(ps, Join("b"))
        assert starts(a)[0].train_s == 30.0
        drain(b)
        await push(ps, a, 0, seed=0)
        ps.leave(b, "killed")                                  # b dies mid-round: a's round completes
        await ps.round_task
        assert ps.ledger.round == 1 and not ps.rounds.members
        await asyncio.sleep(0.5)                               # quorum_wait_s: round 1 starts without b
        assert ps.rounds.members == {"a"} and [s.round for s in starts(a)] == [1]
        await asyncio.sleep(1.0)
        before = time.time() - ps.rounds.started_at
        b = enter(ps, Join("b"))                                 # b is back: joins the running round
        after = time.time() - ps.rounds.started_at
        got = starts(b)
        assert got[0].round == 1 and 30.0 - after <= got[0].train_s <= 30.0 - before <= 29.0   # what is left
        assert ps.rounds.members == {"a", "b"}

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_data_position_survives_in_the_checkpoint(tmp_path):
    async def scenario():
        cfg = small_config(num_sites=1, **{"train.rounds": 3})
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a = enter(ps, Join("a"))
        drain(a)
        msgs, m = delta_chunks(ps, 0)
        for c in msgs:
            ps.on_chunk(a, c)
        from dataclasses import replace
        await ps.on_metrics(a, replace(m, data_position=17))
        await ps.round_task
        ps2 = ParameterServer(cfg, run_dir=tmp_path)           # a restart, from the checkpoint
        a2 = ps2.join(Join("a"))
        welcome = drain(a2)[0]
        assert welcome.data_position == 17 and welcome.round == 1

    asyncio.run(scenario())


def test_the_site_carries_an_unapplied_delta_forward():
    from wantrain.site.uplink import Uplink

    for policy, applied_in in (("drop", None), ("stale", 1), ("stale", None), ("zero-outside", 1),
                               ("zero-outside", None), ("rescale", None)):
        site = Uplink("b", small_config(**{"recovery.late_policy": policy}), {})
        site.feedback.residuals = {"w": np.full(4, 0.5, np.float32)}
        site.pending = {0: {"w": np.ones(4, np.float32)}}
        site.settle(RoundResult(0, "h", sites=("a",)))        # round 0 went on without b
        late = ("b",) if applied_in == 1 else ()
        site.settle(RoundResult(1, "h", sites=("a",), late_sites=late))
        site.settle(RoundResult(2, "h", sites=("a",)))
        carried = policy == "drop" or (applied_in is None and policy != "rescale")   # rescale: never carried
        assert np.allclose(site.feedback.residuals["w"], 1.5 if carried else 0.5), policy
        assert site.pending == {}
        site.keep({"w": np.ones(4, np.float32)})              # a delta never sent (its round went without it)
        assert np.allclose(site.feedback.residuals["w"], (2.5 if carried else 1.5) if policy != "rescale" else 0.5)


def test_a_delta_some_shards_counted_carries_forward_only_the_other_tensors():
    """A sharded PS's shards each decide which deltas their round counts: a site counted by the
    shard of `w` and late at the shard of `v` carries forward `v`'s part only (nothing counted twice)."""
    from types import SimpleNamespace

    from wantrain.models.shards import ShardLayout
    from wantrain.site.sharded import ShardedStream
    from wantrain.site.uplink import Uplink

    layout = ShardLayout.balanced({"w": 4, "v": 4}, 2)
    merge = SimpleNamespace(replica=SimpleNamespace(layout=layout))
    per_shard = [("a", "b"), ("a",)] if layout.shard_of("w") == 0 else [("a",), ("a", "b")]
    everywhere, partial = ShardedStream._counted(merge, per_shard)
    assert everywhere == ("a",) and partial == (("b", frozenset({"w"})),)

    for policy, late_at_v_next_round in (("drop", False), ("stale", True), ("stale", False)):
        site = Uplink("b", small_config(**{"recovery.late_policy": policy}), {})
        site.feedback.residuals = {"w": np.zeros(4, np.float32), "v": np.zeros(4, np.float32)}
        site.pending = {0: {"w": np.ones(4, np.float32), "v": np.full(4, 2.0, np.float32)}}
        site.settle(RoundResult(0, "h", sites=everywhere, partial_sites=partial))
        late = ((("b", frozenset({"v"})),) if late_at_v_next_round else ())
        site.settle(RoundResult(1, "h", sites=("a",), partial_late=late))
        site.settle(RoundResult(2, "h", sites=("a",)))
        assert np.all(site.feedback.residuals["w"] == 0), policy                  # counted: never again
        v_carried = 0.0 if late_at_v_next_round else 2.0
        assert np.all(site.feedback.residuals["v"] == v_carried), (policy, late_at_v_next_round)
        assert site.pending == {}


def test_a_delta_whose_round_counted_some_chunks_carries_only_the_rest():
    """recovery.partial_deltas: round 0 counted chunk 1 of b's delta (the chunks in at its deadline);
    the rest, late past what the policy applies, goes into b's next delta, and chunk 1 never again."""
    from wantrain.site.uplink import Uplink

    cfg = small_config(**{"recovery.late_policy": "zero-outside", "recovery.partial_deltas": True})
    e = cfg.codec.chunk_elements()
    site = Uplink("b", cfg, {})
    site.feedback.residuals = {"w": np.zeros(2 * e + 5, np.float32)}
    site.pending = {0: {"w": np.ones(2 * e + 5, np.float32)}}            # chunks [0, e), [e, 2e), [2e, 2e+5)
    site.settle(RoundResult(0, "h", sites=("a",), partial_chunks=(("b", frozenset({1})),)))
    for r in (1, 2):
        site.settle(RoundResult(r, "h", sites=("a",)))                   # the rest never applied
    carried = site.feedback.residuals["w"]
    assert carried[:e].tolist() == [1.0] * e and not carried[e:2 * e].any() and carried[2 * e:].tolist() == [1.0] * 5
    assert site.pending == {}


def test_two_tails_on_the_way_are_settled_one_by_one():
    """A site may have the tails of two rounds on the way (each follows its round beside the next):
    a commit that applies one of them names the site once, and only that one is settled; the other
    is carried forward once it can no longer be applied. The one the PS said it deferred is the one
    applied, whatever its age."""
    from wantrain.transport.messages import DeltaOutcome
    from wantrain.site.uplink import Uplink

    cfg = small_config(**{"recovery.late_policy": "zero-outside", "recovery.partial_deltas": True})
    for deferred in (0, 1):
        site = Uplink("b", cfg, {})
        site.feedback.residuals = {"w": np.zeros(4, np.float32)}
        site.pending = {0: {"w": np.full(4, 1.0, np.float32)}, 1: {"w": np.full(4, 2.0, np.float32)}}
        site.heard(DeltaOutcome(deferred, "deferred", "the rest came; it counts at the next commit"))
        site.settle(RoundResult(2, "h", sites=("a", "b"), late_sites=("b",)))
        # The other: round 1's is still awaited; round 0's, two rounds old, can no longer be applied.
        assert list(site.pending) == ([1] if deferred == 0 else [])
        for r in (3, 4):
            site.settle(RoundResult(r, "h", sites=("a", "b")))          # never applied: carried forward
        assert site.pending == {} and site.feedback.residuals["w"].tolist() == [2.0 - deferred] * 4


def test_a_chunk_not_counted_two_rounds_in_a_row_goes_as_a_critical_one():
    """A site whose rounds counted its delta without chunk 2, twice in a row, sends chunk 2 in its
    next manifest as critical (first, twice, and no early close without it); a round that counts
    its delta whole clears the count; a round it missed as a whole counts for nothing."""
    from wantrain.codec import EncodeStats
    from wantrain.site.uplink import Uplink

    cfg = small_config(**{"recovery.late_policy": "zero-outside", "recovery.partial_deltas": True})
    e = cfg.codec.chunk_elements()
    delta = {"w": np.full(3 * e, 1e-3, np.float32)}                   # three chunks, all "mlp"
    site = Uplink("b", cfg, {"w": "mlp"})

    def roles(round_):
        _, _, manifest, _ = site._encode(round_, delta, {"tokens": 64, "steps": 1}, EncodeStats(), protects=True)
        return [c.role for c in manifest.chunks]

    assert roles(0) == ["mlp"] * 3
    site.settle(RoundResult(0, "h", sites=("a",), partial_chunks=(("b", frozenset({0, 1})),)))
    assert roles(1) == ["mlp"] * 3                                      # once: not yet
    site.settle(RoundResult(1, "h", sites=("a",)))                      # missed whole: no chunk's fault
    site.settle(RoundResult(2, "h", sites=("a",), partial_chunks=(("b", frozenset({0, 1})),)))
    assert roles(3) == ["mlp", "mlp", "critical"]
    site.settle(RoundResult(3, "h", sites=("a", "b")))
    assert roles(4) == ["mlp"] * 3


def test_under_zero_carry_the_rest_of_a_partly_counted_delta_is_carried_at_once():
    """late_policy zero-carry: zeros stood in for the chunks not counted, the PS never applies them
    late, so the site carries them into its next delta as soon as the round's result says so."""
    from wantrain.site.uplink import Uplink

    cfg = small_config(**{"recovery.late_policy": "zero-carry", "recovery.partial_deltas": True})
    e = cfg.codec.chunk_elements()
    site = Uplink("b", cfg, {})
    assert not site.pushes_late
    site.feedback.residuals = {"w": np.zeros(2 * e, np.float32)}
    site.pending = {0: {"w": np.ones(2 * e, np.float32)}}
    site.settle(RoundResult(0, "h", sites=("a",), partial_chunks=(("b", frozenset({0})),)))
    assert site.pending == {} and site.feedback.residuals["w"].tolist() == [0.0] * e + [1.0] * e
