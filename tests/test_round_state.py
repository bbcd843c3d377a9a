"""The PS's round state is sans-IO: its decisions depend only on what it is told (no clock, no I/O)."""

import math

import pytest

from wantrain.errors import ProtocolError
from wantrain.transport.messages import RoundMetrics
from wantrain.config import ScheduleConfig
from wantrain.ps.rounds import RoundClock, RoundState
from wantrain.ps.uploads import Upload


def arrived(state: RoundState, site: str) -> None:
    state.uploads[site].metrics = RoundMetrics(state.uploads[site].round, 1.0, 1.0, 64, 1, 400, 100, 7.0,
                                               0.0, 0.0, 1.0, 0.0, 1)


def test_a_round_closes_when_everyone_is_in_or_at_the_deadline_with_whoever_is():
    s = RoundState()
    s.start(3, {"a", "b", "c"}, budget_s=0.0, now=100.0)
    assert not s.close()
    arrived(s, "a")
    assert not s.close() and s.missing() == ["b", "c"]
    s.past_deadline = True
    assert s.close()                                     # the deadline passed: a alone
    assert s.members == {"a"} and set(s.late) == {"b", "c"} and s.aggregating
    assert s.upload_for("b", 3, current=3) is s.late["b"]     # b may still finish its late delta
    with pytest.raises(ProtocolError, match="not in that round"):
        s.upload_for("b", 2, current=3)
    with pytest.raises(ProtocolError):
        s.upload_for("a", 3, current=3)                  # a's delta is in; the round is aggregating
    s.finish()
    assert not s.members and not s.uploads and not s.aggregating


def test_nobody_arrived_means_the_deadline_does_not_close_the_round():
    s = RoundState()
    s.start(0, {"a"}, 0.0, now=0.0)
    s.past_deadline = True
    assert not s.close()


def test_a_site_joining_a_running_round_gets_what_is_left_of_the_budget():
    s = RoundState()
    assert s.admission("b", budget_s=10.0, now=5.0) is None           # no round runs
    s.start(1, {"a"}, budget_s=10.0, now=100.0)
    assert s.admission("a", 10.0, now=101.0) is None                   # already in it
    assert s.admission("b", 10.0, now=103.0) == 7.0
    assert s.admission("b", 10.0, now=109.5) is None                   # under a tenth left: next round
    assert s.admission("b", 0.0, now=109.5) == 0.0                     # fixed inner steps: always
    s.admit("b", 1, 7.0)
    assert s.members == {"a", "b"} and s.uploads["b"].train_s == 7.0


def test_with_fixed_steps_a_site_joins_a_running_round_only_with_time_to_deliver():
    s = RoundState()
    s.start(6, {"a", "c"}, budget_s=0.0, now=100.0, deadline_s=4.0)
    assert s.admission("b", 0.0, now=101.0, needs_s=2.5) == 0.0        # 3 s left, it needs 2.5
    assert s.admission("b", 0.0, now=102.8, needs_s=2.5) is None       # 1.2 s left: the next round
    assert s.admission("b", 0.0, now=102.8) == 0.0                     # never timed: it may try
    assert s.admission("b", 0.0, now=104.5) is None                    # past the deadline
    clock = RoundClock(ScheduleConfig())
    assert clock.site_s("b") == 0.0
    for after_s in (4.0, 9.0, 5.0):
        clock.arrived("b", after_s)
    assert clock.site_s("b") == 5.0                                    # its median, what it needs


def test_quorum_waits_at_the_start_then_only_for_a_site_of_the_last_round():
    s = RoundState()
    assert s.quorum_wait({"a"}, {"a", "b"}, num_sites=2, committed=0, quorum_left_s=5.0) == math.inf
    assert s.quorum_wait({"a", "b"}, {"a", "b"}, 2, committed=0, quorum_left_s=5.0) is None
    s.start(0, {"a", "b"}, 0.0, now=0.0)
    s.finish()
    assert s.quorum_wait({"a"}, {"a", "b"}, 2, committed=1, quorum_left_s=2.5) == 2.5   # b was in it
    assert s.quorum_wait({"a"}, {"a", "b"}, 2, committed=1, quorum_left_s=-0.1) is None  # waited enough
    s.start(1, {"a"}, 0.0, now=0.0)
    assert s.quorum_wait({"a"}, {"a", "b"}, 2, committed=2, quorum_left_s=2.5) is None  # b missed the last


def test_stale_deltas_older_than_the_limit_are_dropped():
    s = RoundState()
    s.start(0, {"a"}, 0.0, now=0.0)
    s.stale = {("a", 0): s.uploads["a"]}
    assert list(s.take_stale(current=2)) == ["a@0"] and s.stale == {}
    s.stale = {("a", 0): s.uploads["a"]}
    assert s.take_stale(current=3) == {}                 # MAX_STALENESS is 2


def test_a_site_that_owes_a_delta_is_not_counted_on_until_heard_from():
    s = RoundState()
    s.start(3, {"a", "b"}, budget_s=10.0, now=0.0)
    arrived(s, "a")
    s.past_deadline = True
    assert s.close() and s.owing() == {"b"}              # b missed round 3: it owes that delta
    s.finish()
    s.start(4, {"a"}, budget_s=10.0, now=20.0)            # (the PS leaves b out of round 4)
    assert s.admission("b", 10.0, now=21.0) is None       # not even into the running round
    assert s.heard_from("b", applied_round=2) is None     # a report about an older model: still owes
    owed = s.heard_from("b", applied_round=3)             # it applied round 3 without sending: kept
    assert owed is not None and owed.round == 3 and s.owing() == set()
    with pytest.raises(ProtocolError):
        s.upload_for("b", 3, current=4)                   # it said it moved on: round 3's delta is over
    assert s.admission("b", 10.0, now=21.0) == 9.0


def test_a_site_whose_round_counted_its_chunks_in_owes_only_a_tail_and_is_counted_on():
    s = RoundState()
    for r in (3, 4):                                      # b's chunks are in part at both deadlines
        s.start(r, {"a", "b"}, budget_s=10.0, now=20.0 * r)
        arrived(s, "a")
        s.past_deadline = True
        assert s.close() and s.owing() == {"b"}
        s.committed(r, {"b": 0.5}, {"b": frozenset({0})})  # its round counted chunk 0 of it
        assert s.owing() == set() and s.owed("b", r).counted == {0}
        s.finish()
    assert s.heard_from("b", applied_round=4) is None     # b applied round 4: its tails still come
    assert s.upload_for("b", 3, current=5) is s.tails["b", 3] and s.admission("b", 10.0, now=100.0) is None
    assert s.came("b", s.tails["b", 3]) and not s.came("b", Upload(9))   # its metrics came: done
    assert list(s.tails) == [("b", 4)]
    s.drop("b")                                           # b left: its tail of round 4 will not come
    assert s.tails == {}
    with pytest.raises(ProtocolError):
        s.upload_for("b", 4, current=5)


def test_what_becomes_of_a_late_delta():
    from wantrain.config import RecoveryConfig
    from wantrain.ps.rounds import late_outcome

    drop = RecoveryConfig(late_policy="drop")
    stale = RecoveryConfig(late_policy="stale", staleness_discount=0.5)
    assert late_outcome(drop, 3, committed=4, aggregating=False, rounds=20)[0] == "dropped"
    action, why = late_outcome(stale, 3, committed=4, aggregating=False, rounds=20)
    assert action == "deferred" and "counts in round 4" in why and "0.5" in why
    assert late_outcome(stale, 3, committed=5, aggregating=False, rounds=20)[0] == "deferred"     # 2 rounds on
    assert late_outcome(stale, 3, committed=5, aggregating=True, rounds=20)[0] == "dropped"      # its next commit is 6
    action, why = late_outcome(stale, 3, committed=9, aggregating=False, rounds=20)
    assert action == "dropped" and "too stale" in why
    outside = RecoveryConfig(late_policy="zero-outside")
    action, why = late_outcome(outside, 3, committed=3, aggregating=True, rounds=20)          # arrived while 3 commits
    assert action == "deferred" and "applied when round 4 commits" in why and "outside the outer momentum" in why
    assert late_outcome(outside, 3, committed=6, aggregating=False, rounds=20)[0] == "dropped"
    # The run's last round: no commit comes after it, so nothing is deferred to one.
    action, why = late_outcome(outside, 9, committed=10, aggregating=False, rounds=10)
    assert action == "dropped" and "the run's last round" in why
    assert late_outcome(outside, 8, committed=9, aggregating=True, rounds=10)[0] == "dropped"   # 9 commits last
    assert late_outcome(outside, 8, committed=9, aggregating=False, rounds=10)[0] == "deferred"  # 9 is open
    action, why = late_outcome(RecoveryConfig(late_policy="rescale"), 3, committed=4, aggregating=False, rounds=20)
    assert action == "dropped" and "stood in for it" in why


def test_a_site_new_to_a_round_tolerates_no_loss():
    """A member that was not in the round before (it joined, rejoined, came back) counts whole or
    not at all: its chunks in at the deadline are not counted in part, and while it is missing the
    round's missing share is infinite (no early close). In the first round a PS runs, nobody was
    before: the warm-up rule decides."""
    from concurrent.futures import Future

    from wantrain.transport.manifest import ChunkEntry, Manifest

    def sending(state, site):            # a manifest of two chunks and the first chunk in
        up = state.uploads[site]
        up.take_manifest(Manifest(up.round, (ChunkEntry(0, "w", 0, 4, "mlp", 1.0, 0.5, 4, 0),
                                             ChunkEntry(1, "w", 4, 4, "mlp", 1.0, 0.5, 4, 0)), 64, 1))
        up.decoding[0] = Future()
        up.importance_in = 0.5

    s = RoundState()
    s.start(0, {"a", "b"}, 0.0, now=0.0)
    assert not any(up.whole_only for up in s.uploads.values())          # the first round: the warm-up's
    arrived(s, "a"), arrived(s, "b")
    assert s.close()
    s.finish()
    s.start(1, {"a", "b", "c"}, 0.0, now=10.0)
    assert [site for site, up in sorted(s.uploads.items()) if up.whole_only] == ["c"]
    arrived(s, "a")
    sending(s, "b"), sending(s, "c")
    assert s.uploads["b"].counts_in_part and not s.uploads["c"].counts_in_part
    assert s.missing_share() == math.inf                                # c is new and not complete
    arrived(s, "c")
    assert s.missing_share() == pytest.approx(0.5 / 3)                 # b's half, of three deltas alike
    s.admit("d", 1, 0.0)
    assert s.uploads["d"].whole_only                                    # joined the running round
