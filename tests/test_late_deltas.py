"""Deltas that miss their round: the aggregation's zero substitute and its path outside the outer
momentum (outer/aggregate.py), and the study that compares the policies (studies/late.py)."""

import numpy as np

import pytest

from wantrain.outer.aggregate import Contribution, aggregate_round, weighted_mean
from wantrain.codec import Codec, Extracted, plan_chunks
from wantrain.config import CodecConfig, RunConfig
from wantrain.errors import WantrainError
from wantrain.studies.late import WHOLE, chunk_schedule, late_schedule, run_arm
from wantrain.outer.nesterov import OuterNesterov

pytestmark = pytest.mark.timeout(120)


def test_a_zero_substitute_keeps_the_absent_weight_in_the_denominator():
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32)
    np.testing.assert_allclose(weighted_mean([a, b], [1.0, 3.0], absent_weight=4.0), [1.25, 2.5])
    assert np.array_equal(weighted_mean([a, b], [1.0, 3.0], 0.0), weighted_mean([a, b], [1.0, 3.0]))


def _round(params, outer, contributions, side=None, absent=0.0):
    """A round of `contributions`, and (absent > 0) a delta of that weight that never came, as zeros."""
    shapes = {k: v.size for k, v in params.items()}
    plan = plan_chunks(shapes, 1000)                  # several chunks per tensor
    codec = Codec(CodecConfig(mode="fp32"))           # the update is sent exactly
    if absent:
        contributions = {**contributions, "absent": Contribution([None] * len(plan), absent)}
    aggregate_round(0, plan, shapes, params, contributions, outer, None, codec, side=side, substitute="zero")
    return plan


def _parts(values: dict[str, np.ndarray], plan) -> list[Extracted]:
    return [Extracted(values[s.tensor][s.offset: s.offset + s.length].copy(), None, 0) for s in plan]


def test_a_late_delta_moves_the_model_once_by_lr_times_its_share_and_never_enters_the_momentum():
    rng = np.random.default_rng(0)
    shapes = {"w": 2500, "b": 700}
    plan = plan_chunks(shapes, 1000)
    delta = {k: rng.standard_normal(n).astype(np.float32) for k, n in shapes.items()}
    late = {k: rng.standard_normal(n).astype(np.float32) for k, n in shapes.items()}
    lr, mu = 0.7, 0.9

    with_side = {k: np.zeros(n, np.float32) for k, n in shapes.items()}
    without = {k: np.zeros(n, np.float32) for k, n in shapes.items()}
    o1, o2 = OuterNesterov(lr, mu), OuterNesterov(lr, mu)
    _round(with_side, o1, {"a": Contribution(_parts(delta, plan), 3.0)},
           side={"b@0": Contribution(_parts(late, plan), 0.25)}, absent=1.0)
    _round(without, o2, {"a": Contribution(_parts(delta, plan), 3.0)}, absent=1.0)
    for k in shapes:
        g = 0.75 * delta[k]                                          # zero substitute: 3 / (3 + 1)
        np.testing.assert_allclose(without[k], -lr * (1 + mu) * g, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(with_side[k] - without[k], -lr * 0.25 * late[k], rtol=1e-5, atol=1e-6)
        assert np.array_equal(o1.buf[k], o2.buf[k])                  # the momentum never saw it
    # The next round, with nothing new: both models move by the same momentum term only.
    before = {k: v.copy() for k, v in with_side.items()}
    zero = {k: np.zeros(n, np.float32) for k, n in shapes.items()}
    _round(with_side, o1, {"a": Contribution(_parts(zero, plan), 1.0)})
    _round(without, o2, {"a": Contribution(_parts(zero, plan), 1.0)})
    for k in shapes:
        np.testing.assert_allclose(with_side[k] - before[k], -lr * mu * mu * 0.75 * delta[k], rtol=1e-5, atol=1e-6)


def test_the_late_schedule_is_seeded_spares_round_0_and_never_silences_every_site():
    names = ["a", "b", "c"]
    s = late_schedule(names, 400, 0.3, seed=5)
    assert s == late_schedule(names, 400, 0.3, seed=5) and s != late_schedule(names, 400, 0.3, seed=6)
    assert s[0] == {} and all(len(r) < len(names) and set(r.values()) <= {WHOLE} for r in s)
    rate = sum(len(r) for r in s[1:]) / (3 * 399)
    assert 0.25 < rate < 0.33                     # p = 0.3, less the rounds where all three were drawn
    assert late_schedule(names, 50, 0.0, seed=5) == [{}] * 50
    chunks = chunk_schedule(names, 200, 50, 0.1, 4.0, seed=5)
    assert chunks == chunk_schedule(names, 200, 50, 0.1, 4.0, seed=5) and chunks[0] == {}
    assert 0.07 < sum(len(c) for r in chunks for c in r.values()) / (3 * 199 * 50) < 0.13


CFG = RunConfig().replace(num_sites=3, **{"model.preset": "tiny", "model.block_size": 32, "train.rounds": 3,
                                          "train.inner_steps": 2, "train.eval_batches": 1})


def test_every_arm_is_the_same_run_until_a_site_is_late_then_each_policy_differs():
    arms = ("on-time", "drop", "stale", "rescale", "zero", "zero-ef-outside")      # (zero-ef, salr: as zero here)
    runs = {arm: run_arm(CFG, arm, seed=1, late=0.5) for arm in arms}
    schedule = runs["drop"]["late_chunks"]
    assert schedule[0] == {} and any(schedule[1:]) and runs["on-time"]["late_chunks"] == [{}] * 3
    first_late = next(r for r in range(1, 3) if schedule[r])
    assert len({runs[a]["val"][first_late] for a in arms}) == 1      # identical up to it, bit for bit
    # where a site is late: the peer average ("drop", "stale", "rescale") and the zero substitute differ
    after = {a: runs[a]["val"][first_late + 1] for a in arms}
    assert after["drop"] == after["stale"] == after["rescale"]
    assert after["zero"] == after["zero-ef-outside"]
    assert after["zero"] != after["rescale"] != after["on-time"]


def test_with_chunks_late_today_drops_the_whole_site_where_the_others_lose_chunks():
    runs = {arm: run_arm(CFG, arm, seed=0, chunk_loss=0.2) for arm in ("drop", "rescale", "hadamard", "salr")}
    partial = runs["rescale"]["late_chunks"]
    assert partial[1] and all(0 < n < runs["drop"]["chunks"] for n in partial[1].values())   # some of a delta
    assert runs["drop"]["late_chunks"] == [dict.fromkeys(r, "all") for r in partial]         # the same sites, whole
    assert runs["drop"]["val"][:2] == runs["rescale"]["val"][:2]
    assert runs["drop"]["val"][2] != runs["rescale"]["val"][2]
    # B5: the same lost chunks, spread by the transform and rescaled: no chunk is late, the run differs
    assert runs["hadamard"]["late_chunks"] == [{} for _ in partial] and runs["hadamard"]["val"][:2] == runs["drop"]["val"][:2]
    assert runs["hadamard"]["val"][2] not in (runs["drop"]["val"][2], runs["rescale"]["val"][2])
    # protection rebuilds some of what the same link loses, for a few percent more bytes
    salr = runs["salr"]["late_chunks"]
    assert sum(n for r in salr for n in r.values()) < sum(n for r in partial for n in r.values())
    assert 0 < runs["salr"]["overhead"] < 0.1 and runs["rescale"]["overhead"] == 0


def _aggregate_chunks(deltas, masks, substitute, weights=None):
    """One round at outer lr 1, momentum 0 (the update is minus the aggregate), chunk i of delta k
    present where masks[k][i]; returns the aggregate."""
    shapes = {"w": deltas[0].size}
    plan = plan_chunks(shapes, 100)
    params = {"w": np.zeros(deltas[0].size, np.float32)}
    contributions = {f"s{k}": Contribution([Extracted(d[s.offset: s.offset + s.length], None, 0) if keep[i] else None
                                            for i, s in enumerate(plan)], (weights or [1.0] * len(deltas))[k])
                     for k, (d, keep) in enumerate(zip(deltas, masks))}
    aggregate_round(0, plan, shapes, params, contributions, OuterNesterov(1.0, 0.0), None,
                    Codec(CodecConfig(mode="fp32")), substitute=substitute)
    return -params["w"]


def test_a_chunk_missing_from_some_deltas_is_their_peers_mean_or_zero_as_asked():
    deltas = [np.full(300, v, np.float32) for v in (1.0, 2.0, 6.0)]
    masks = [[True, True, True], [True, False, True], [True, False, False]]   # chunk 1: only s0; chunk 2: s0, s1
    peer = _aggregate_chunks(deltas, masks, "peer", weights=[1.0, 1.0, 2.0])
    zero = _aggregate_chunks(deltas, masks, "zero", weights=[1.0, 1.0, 2.0])
    np.testing.assert_allclose(peer[:100], (1 + 2 + 12) / 4)
    np.testing.assert_allclose(peer[100:200], 1.0)
    np.testing.assert_allclose(peer[200:], 1.5)
    np.testing.assert_allclose(zero[:100], (1 + 2 + 12) / 4)
    np.testing.assert_allclose(zero[100:200], 1 / 4)
    np.testing.assert_allclose(zero[200:], 3 / 4)
    none = _aggregate_chunks(deltas, [[True, False, True]] * 3, "peer")
    assert not none[100:200].any()                       # a chunk nobody holds: zero (the momentum still moves it)
    with pytest.raises(WantrainError, match="unknown substitute 'stale'"):
        _aggregate_chunks(deltas, masks, "stale")


def test_the_peer_mean_of_randomly_missing_chunks_is_unbiased_over_many_seeds():
    rng = np.random.default_rng(0)
    k, n, p = 4, 400, 0.3
    deltas = [rng.standard_normal(n).astype(np.float32) for _ in range(k)]
    errors = []
    for t in range(800):
        masks = np.random.default_rng(t).random((k, 4)) >= p
        if masks.any(axis=0).all():                    # a chunk nobody holds is another question (above)
            errors.append(_aggregate_chunks(deltas, masks.tolist(), "peer") - np.mean(deltas, axis=0))
    e = np.array(errors)                               # (trials, elements)
    standard_error = e.std(axis=0) / np.sqrt(len(e))
    assert len(e) > 700 and standard_error.max() < 0.05         # power: an error of 0.2 would show
    assert np.all(np.abs(e.mean(axis=0)) < 4.5 * standard_error)


def test_a_hadamard_spread_loss_is_noise_over_its_tensor_unbiased_over_many_seeds():
    """B5 (studies/spread.py): the transform is orthonormal and its own inverse; losing a run of
    the transformed coefficients costs noise over the whole tensor, not the run, and dividing by
    the share that came makes the estimate unbiased over the random signs."""
    from wantrain.studies.spread import hadamard, spread_loss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64))
    np.testing.assert_allclose(hadamard(hadamard(x)), x, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(hadamard(x), axis=1), np.linalg.norm(x, axis=1))
    v = {"w": rng.standard_normal(1000).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
    once = spread_loss(v, {"w": [(100, 300)]}, seed=0)
    assert once["b"] is v["b"]                                    # nothing lost: as it was
    err = once["w"] - v["w"]
    assert np.abs(err[100:300]).mean() < 2 * np.abs(err[:100]).mean()     # spread, not a hole
    tries = np.array([spread_loss(v, {"w": [(100, 300)]}, seed=s)["w"] for s in range(1500)])
    standard_error = tries.std(axis=0) / np.sqrt(len(tries))
    assert standard_error.max() < 0.05                            # power: a bias of 0.2 would show
    assert np.all(np.abs(tries.mean(axis=0) - v["w"]) < 5 * standard_error)


def _applied_mass(deltas: np.ndarray, lost: np.ndarray, policy: str, owner: int) -> np.ndarray:
    """Rounds of K equal-weight sites' deltas (deltas: rounds x K x elements) with chunks `lost`
    (rounds x K x chunks) handled as `policy` says, on a model at zero with lr 1 and no momentum,
    so the model ends at minus every mass applied; only site `owner`'s values are non-zero (the
    aggregation is linear, so that is the mass its deltas put in)."""
    rounds, k, n = deltas.shape
    shapes = {"w": n}
    plan = plan_chunks(shapes, n // lost.shape[2])
    params, outer = {"w": np.zeros(n, np.float32)}, OuterNesterov(1.0, 0.0)
    carry = np.zeros((k, n), np.float32)                      # the sites' loss error feedback
    side: dict[str, Contribution] = {}
    for r in range(rounds):
        sent = np.where(np.arange(k)[:, None] == owner, deltas[r], 0).astype(np.float32) + carry
        carry[:] = 0
        contributions, late = {}, {}
        for s in range(k):
            parts = _parts({"w": sent[s]}, plan)
            contributions[f"s{s}"] = Contribution([None if lost[r, s, i] else p for i, p in enumerate(parts)], 1.0)
            if lost[r, s].any():
                late[f"s{s}@{r}"] = Contribution([p if lost[r, s, i] else None for i, p in enumerate(parts)], 1 / k)
                if policy.endswith("-ef"):                     # the site sends its lost chunks again
                    for i in np.flatnonzero(lost[r, s]):
                        spec = plan[i]
                        carry[s, spec.offset: spec.offset + spec.length] = sent[s, spec.offset: spec.offset + spec.length]
        aggregate_round(r, plan, shapes, params, contributions, outer, None, Codec(CodecConfig(mode="fp32")),
                        side=side or None, substitute="peer" if policy.startswith("peer") else "zero")
        side = late if policy == "zero-outside" else {}
    return -params["w"]


@pytest.mark.parametrize("policy", ["zero-ef", "zero-outside", "peer-ef"])
def test_no_site_s_mass_is_lost_or_counted_twice(policy):
    """Per site, the mass the model took from its deltas equals what it sent, 1/K of each (equal
    weights), when a lost chunk counts as zeros and its values come later, through the site's error
    feedback or outside the momentum; a peer-mean substitute with error feedback counts it twice."""
    rng = np.random.default_rng(5)
    rounds, k, chunks, n = 8, 4, 6, 600
    deltas = rng.standard_normal((rounds, k, n)).astype(np.float32)
    lost = rng.random((rounds, k, chunks)) < 0.3
    lost[-1] = False                                          # the last round delivers what is owed
    lost[..., 0] |= rng.random((rounds, k)) < 0.2             # some chunks lost two rounds running
    lost[-1] = False
    for owner in range(k):
        applied = _applied_mass(deltas, lost, policy, owner)
        sent = deltas[:, owner].sum(axis=0) / k
        if policy == "peer-ef":
            assert np.abs(applied - sent).max() > 0.1, owner      # the others' mean of it, and itself again
        else:
            np.testing.assert_allclose(applied, sent, rtol=1e-4, atol=1e-4)
