"""The screen and the bounded mean, as pure functions (wantrain.outer.screening.Screen, aggregate.py).

Properties, over deltas an attacker chooses freely (any norm, any direction, any claim): while
honest sites are a majority and agree with each other, no honest delta is rejected or clipped;
the reference an honest delta is judged by moves by no more than the honest deltas allow; and
what one hostile site adds to the round's mean is bounded by the honest deltas alone. The PS's
use of them (events, DeltaOutcome, the journal) is tested in test_poison.py.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wantrain.outer.aggregate import Contribution, weighted_mean
from wantrain.codec import Codec, ErrorFeedback, Extracted, encode_arrays
from wantrain.config import RunConfig
from wantrain.outer.screening import Screen, clipped, gram, norms_on_supports

DIM = 256
CFG = RunConfig()


def honest_deltas(n: int, seed: int, spread: float = 0.6) -> list[np.ndarray]:
    """n deltas that share a direction (cosine about 0.7 between two) and norms within 1.2x."""
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(DIM)
    out = []
    for _ in range(n):
        v = common + spread * rng.standard_normal(DIM) * 1.2
        out.append((v / np.linalg.norm(v) * rng.uniform(1.0, 1.2)).astype(np.float32))
    return out


def attacker(kind: int, scale: float, seed: int, honest: list[np.ndarray]) -> np.ndarray:
    rng = np.random.default_rng(seed + 99)
    mean = np.mean(honest, axis=0)
    direction = [rng.standard_normal(DIM), -mean, mean, honest[0] - mean][kind % 4]
    return (direction / max(np.linalg.norm(direction), 1e-30) * scale).astype(np.float32)


def judge(screen: Screen, deltas: dict[str, np.ndarray], weights: dict[str, float]):
    keys = list(deltas)
    g = gram([[Extracted(deltas[k], None, 0)] for k in keys])
    return screen.judge(keys, g, [weights[k] for k in keys])


def counted_mean(deltas: dict[str, np.ndarray], verdicts) -> tuple[np.ndarray, dict[str, Contribution]]:
    """The round's mean as the PS takes it (commit.contributions, then weighted_mean, names in order)."""
    parts = {k: Contribution(clipped([Extracted(deltas[k], None, 0)], v.factor), v.weight)
             for k, v in sorted(verdicts.items()) if v.action != "reject"}
    return weighted_mean([c.parts[0] for c in parts.values()], [c.weight for c in parts.values()]), parts


attacks = dict(honest_n=st.integers(2, 6), kind=st.integers(0, 3), log_scale=st.floats(-12, 12),
               log_claim=st.floats(-6, 6), seed=st.integers(0, 10_000))


@settings(max_examples=300, deadline=None)
@given(**attacks)
def test_no_honest_delta_is_rejected_or_clipped_while_honest_sites_are_a_majority(honest_n, kind, log_scale,
                                                                                  log_claim, seed):
    honest = honest_deltas(honest_n, seed)
    deltas = {f"h{i}": v for i, v in enumerate(honest)}
    deltas["x"] = attacker(kind, math.exp(log_scale), seed, honest)
    weights = {k: 1000.0 for k in deltas} | {"x": 1000.0 * math.exp(log_claim)}
    verdicts = judge(Screen(CFG), deltas, weights)
    for k, v in verdicts.items():
        if k != "x":
            assert v.action == "accept" and v.factor == 1 and v.weight == 1000.0, (k, v)
        assert v.reference > 0          # three or more sites: every delta was judged


@settings(max_examples=300, deadline=None)
@given(**attacks)
def test_one_hostile_site_moves_the_mean_by_a_bounded_amount(honest_n, kind, log_scale, log_claim, seed):
    """Whatever x sends and claims, its share of the mean is at most weight_ratio x the honest median
    weight over the honest weights' total, times clip_ratio x the largest honest norm."""
    r = CFG.robust
    honest = honest_deltas(honest_n, seed)
    deltas = {f"h{i}": v for i, v in enumerate(honest)}
    deltas["x"] = attacker(kind, math.exp(log_scale), seed, honest)
    weights = {k: 1000.0 for k in deltas} | {"x": 1000.0 * math.exp(log_claim)}
    mean, parts = counted_mean(deltas, judge(Screen(CFG), deltas, weights))
    total = sum(c.weight for c in parts.values())
    honest_part = sum(np.float64(parts[k].weight / total) * deltas[k].astype(np.float64) for k in parts if k != "x")
    moved = np.linalg.norm(mean - honest_part)                        # what x added to the mean
    bound = r.weight_ratio * 1000.0 / (1000.0 * honest_n) * r.clip_ratio * max(np.linalg.norm(h) for h in honest)
    assert moved <= bound * (1 + 1e-5) + 1e-6


@settings(max_examples=200, deadline=None)
@given(honest_n=st.integers(2, 5), log_scale=st.floats(-12, 12), kind=st.integers(0, 3), seed=st.integers(0, 10_000))
def test_the_bounds_a_hostile_site_meets_are_set_by_the_honest_deltas(honest_n, log_scale, kind, seed):
    """The attacker changes its own vote on each honest delta and nothing else, and the longest
    delta that counts is clip_ratio x a norm within the honest deltas' range, whatever it sends."""
    honest = honest_deltas(honest_n, seed)
    base = {f"h{i}": v for i, v in enumerate(honest)}
    third = honest_deltas(honest_n + 1, seed)[-1]          # without x: another honest site in its place
    deltas = dict(base, x=attacker(kind, math.exp(log_scale), seed, honest))
    with_x = judge(Screen(CFG), deltas, dict.fromkeys(deltas, 1.0))
    without = judge(Screen(CFG), dict(base, x=third), dict.fromkeys(deltas, 1.0))
    norms = [float(np.linalg.norm(v)) for v in honest]
    for k in base:
        assert len(set(with_x[k].disagrees) - set(without[k].disagrees)) <= 1
        assert with_x[k].action == without[k].action == "accept"
    x = with_x["x"]
    if x.action != "reject":
        assert x.norm * x.factor <= CFG.robust.clip_ratio * max(norms) * (1 + 1e-6)


@pytest.mark.parametrize("kind", ["tiny", "huge", "reversed", "noise"])
def test_an_out_of_line_delta_is_rejected_and_says_why(kind):
    honest = honest_deltas(3, seed=1)
    bad = {"tiny": honest[0] * 1e-3, "huge": honest[0] * 50, "reversed": -np.mean(honest, axis=0),
           "noise": attacker(0, 1.0, 1, honest)}[kind]
    deltas = {"a": honest[0], "b": honest[1], "c": honest[2], "x": bad}
    verdicts = judge(Screen(CFG), deltas, dict.fromkeys(deltas, 1.0))
    assert [k for k, v in verdicts.items() if v.action == "reject"] == ["x"]
    words = {"tiny": "shorter than", "huge": "longer than", "reversed": "angle", "noise": "angle"}[kind]
    assert words in verdicts["x"].reason and "3 of the 3 other sites" in verdicts["x"].reason


def test_two_sites_are_never_judged_and_their_disagreement_raises_one_alert():
    screen = Screen(CFG)
    assert "no rule can tell" in screen.cannot_decide(2) and screen.cannot_decide(3) is None
    honest = honest_deltas(1, seed=2)[0]
    alerts = []
    for r in range(6):
        deltas = {"honest": honest, "tiny": honest * 1e-4}
        verdicts = judge(screen, deltas, dict.fromkeys(deltas, 1.0))
        assert all(v.action == "accept" and v.factor == 1 for v in verdicts.values())
        assert verdicts["honest"].disagrees == ("tiny",)
        alerts += [(r, a) for a in screen.record(r, verdicts)]
    (r, alert), = alerts
    assert r == CFG.robust.alert_after - 1 and alert["since"] == 0 and alert["sites"] == ["honest", "tiny"]
    assert "no rule can tell which one is honest" in alert["message"]


def test_a_site_out_of_line_in_three_of_six_rounds_raises_one_alert_until_it_is_clean_again():
    screen = Screen(CFG)
    honest = honest_deltas(3, seed=3)
    pattern = [True, False, True, True, True, False, False, False, False, False, False, True, False, True, True]
    seen = []
    for r, bad in enumerate(pattern):
        deltas = {"a": honest[0], "b": honest[1], "c": honest[2], "x": honest[0] * (100 if bad else 1.01)}
        seen += [(r, a["site"], a["since"]) for a in screen.record(r, judge(screen, deltas, dict.fromkeys(deltas, 1.0)))]
    # alerted at round 3 (rounds 0, 2, 3 of its last six); rounds 5-10 clean; again at 14 (11, 13, 14)
    assert seen == [(3, "x", 0), (14, "x", 11)]
    again = Screen(CFG)
    again.load_state_dict(screen.state_dict())
    assert again.windows == screen.windows and again.alerted == screen.alerted
    again.load_state_dict([0.1, 0.2])               # a checkpoint from before: a list of norms
    assert again.windows == {}


def test_a_late_delta_gives_its_site_no_second_vote():
    """x's late delta and its current one agree with each other; a and b must still outvote x."""
    honest = honest_deltas(2, seed=4)
    third = honest_deltas(3, seed=4)[2]
    deltas = {"a": honest[0], "b": honest[1], "c": third, "x": -honest[0] * 3, "x@3": -honest[0] * 3}
    verdicts = judge(Screen(CFG), deltas, dict.fromkeys(deltas, 1.0))
    assert verdicts["x"].action == "reject" and verdicts["x@3"].action == "reject"
    assert all(verdicts[k].action == "accept" for k in "abc")


def test_trusted_sites_are_not_compared():
    screen = Screen(CFG.replace(**{"robust.trust": "trusted"}))
    honest = honest_deltas(3, seed=5)
    deltas = {"a": honest[0], "b": honest[1], "x": -honest[0] * 100}
    assert all(v.action == "accept" and v.factor == 1 for v in judge(screen, deltas, dict.fromkeys(deltas, 1.0)).values())
    assert screen.cannot_decide(2) is None


def test_gram_of_int8_chunks_matches_the_dequantized_values():
    rng = np.random.default_rng(6)
    deltas = [{"w": rng.standard_normal(10_000).astype(np.float32), "b": rng.standard_normal(300).astype(np.float32)}
              for _ in range(3)]
    cfg = CFG.replace(**{"codec.chunk_bytes": 4096, "codec.quant_block": 256})
    parts, values = [], []
    for d in deltas:
        chunks, decoded = encode_arrays(d, Codec(cfg.codec), ErrorFeedback())
        parts.append(Codec.extract_many([e for _, e in chunks]))
        values.append(np.concatenate([decoded[k] for k in d]).astype(np.float64))
    x = np.stack(values)
    g = x @ x.T                         # of the float32 values; gram multiplies q and scale in float64
    assert len(parts[0]) > 2 and np.allclose(gram(parts), g, rtol=1e-6, atol=1e-6 * np.abs(g).max())
    norms = np.sqrt(np.diag(g))
    assert np.allclose(gram(parts, list(norms)), g, rtol=1e-6, atol=1e-6 * np.abs(g).max())


@settings(max_examples=100, deadline=None)
@given(log_claim=st.floats(-20, 20), seed=st.integers(0, 1000))
def test_of_two_sites_neither_claims_more_than_its_bounded_share(log_claim, seed):
    honest = honest_deltas(1, seed)[0]
    deltas = {"honest": honest, "x": -honest}
    weights = {"honest": 1000.0, "x": 1000.0 * math.exp(log_claim)}
    v = judge(Screen(CFG), deltas, weights)
    assert v["honest"].action == v["x"].action == "accept" and v["honest"].factor == v["x"].factor == 1
    share = v["x"].weight / (v["x"].weight + v["honest"].weight)
    ratio = CFG.robust.weight_ratio
    assert 1 / (1 + ratio) * (1 - 1e-9) <= share <= ratio / (1 + ratio) * (1 + 1e-9)


def test_a_part_of_a_delta_is_judged_on_the_chunks_it_has():
    """A partial delta (chunks missing at its round's close) and the rest of one (applied late) are
    small beside whole deltas and at a wide angle to them: judged against whole deltas they look
    hostile. Judged over the chunks they have, an honest part passes and a reversed one does not."""
    a, b, c, d = honest_deltas(4, seed=5, spread=0.1)
    chunks = lambda v: [Extracted(x, None, 0) for x in np.split(v, 128)]    # 128 chunks of 2
    part = lambda v, keep: [x if i in keep else None for i, x in enumerate(chunks(v))]
    # d's rest: one small chunk, where a and b agree (and c has nothing: no evidence either way)
    agree = [i for i, (x, y) in enumerate(zip(np.split(a, 128), np.split(b, 128))) if i >= 96 and x @ y > 0.9 *
             np.linalg.norm(x) * np.linalg.norm(y)]
    small = min(agree, key=lambda i: np.linalg.norm(np.split(a, 128)[i]))
    deltas = {"a": chunks(a), "b": chunks(b), "c": part(c, set(range(96))), "d@3": part((a + b) / 2, {small}),
              "x@2": part(-a, {101})}                                     # x's rest: reversed
    keys = list(deltas)
    g = gram([deltas[k] for k in keys])
    whole = Screen(CFG).judge(keys, g, [1.0] * len(keys))
    assert whole["d@3"].action == "reject"              # beside whole deltas an honest rest is "smaller": refused
    fair = Screen(CFG).judge(keys, g, [1.0] * len(keys), norms_on_supports([deltas[k] for k in keys]))
    assert {k: v.action for k, v in fair.items()} == {"a": "accept", "b": "accept", "c": "accept", "d@3": "accept",
                                                      "x@2": "reject"}
    assert norms_on_supports([deltas["a"], deltas["b"]]) is None           # whole deltas: nothing to restrict
