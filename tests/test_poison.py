"""Finding 1: one authenticated site must not be able to destroy the run (wantrain.outer.screening).

Domain tests drive the PS without a network: claims bounded by the round, an outlier delta
rejected or clipped against its peers and the history, the trimmed mean. The last test is the
reported attack over gRPC (in this process): a 1e38 fp32 delta and a 2^64 - 1 token claim from an
authenticated site while an honest site trains the run to its end.
"""

import asyncio
import dataclasses
import math

import numpy as np
import pytest

from wantrain.transport.auth import Authenticator
from wantrain.codec import Codec, Encoded, EncodeStats, ErrorFeedback, encode_arrays
from wantrain.errors import ProtocolError
from wantrain.transport.messages import DELTA, Join, TensorChunk
from wantrain.outer.nesterov import OuterNesterov
from wantrain.ps import ParameterServer
from wantrain.models.params import apply_update, flat_copy, load_flat, param_hash
from wantrain.telemetry import rows

from .cluster import check_run
from .harness import InProcessCluster
from .helpers import small_config
from .test_hostile import HandSite
from .test_server import drain, enter, metrics_for, one_site_round, rows_of


def encoded_delta(ps, round_, scale, seed):
    """A random delta of `scale` that shares half its energy with every other: (chunks, metrics, decoded values)."""
    common, rng = np.random.default_rng(1234), np.random.default_rng(seed)    # honest deltas share a direction
    delta = {k: ((common.standard_normal(n) + rng.standard_normal(n)) * scale).astype(np.float32)
             for k, n in ps.shapes.items()}
    stats = EncodeStats()
    chunks, decoded = encode_arrays(delta, Codec(ps.cfg.codec), None, stats)
    msgs = [TensorChunk(DELTA, round_, i, len(chunks), spec, enc) for i, (spec, enc) in enumerate(chunks)]
    return msgs, metrics_for(ps.cfg, round_, stats, len(msgs)), decoded


async def push(ps, link, msgs, m):
    for c in msgs:
        ps.on_chunk(link, c)
    await ps.on_metrics(link, m)


def scaled(msgs, factor):
    """The same chunks with every scale multiplied by `factor` (float32), as the PS clips."""
    out = []
    for c in msgs:
        s = (np.frombuffer(c.data.scales, "<f4") * np.float32(factor)).astype("<f4").tobytes()
        out.append(TensorChunk(c.kind, c.round, c.index, c.count, c.spec,
                               Encoded(c.data.encoding, c.data.length, c.data.quant_block, s, c.data.payload)))
    return out


@pytest.mark.timeout(120)
def test_claims_cannot_exceed_what_the_round_allowed(tmp_path):
    async def scenario():
        ps, a, msgs, m = one_site_round(tmp_path)
        for c in msgs:
            ps.on_chunk(a, c)
        inner = ps.cfg.train.inner_steps
        for lie, match in [(dict(tokens=2**64 - 1), "tokens"), (dict(steps=inner + 1), "inner steps"),
                           (dict(steps=1, tokens=257), "tokens"), (dict(raw_bytes=1), "raw_bytes"),
                           (dict(wire_bytes=m.wire_bytes + 1), "wire_bytes"),
                           (dict(data_position=2**63), "data position")]:
            with pytest.raises(ProtocolError, match=match):
                await ps.on_metrics(a, dataclasses.replace(m, **lie))
        await ps.on_metrics(a, m)                                # the honest claim is accepted ...
        with pytest.raises(ProtocolError, match="arrived twice|not in that round"):
            await ps.on_metrics(a, m)                            # ... once (and the round is aggregating)
        await ps.round_task
        assert ps.ledger.round == 1

    asyncio.run(scenario())


def three_site_round(tmp_path, outlier_scale, **changes):
    """Round 0 of a three-site PS where c's delta is `outlier_scale` times a's and b's."""
    async def scenario():
        ps = ParameterServer(small_config(**{"train.rounds": 2, **changes}), run_dir=tmp_path)
        links = {n: enter(ps, Join(n)) for n in "abc"}
        deltas = {n: encoded_delta(ps, 0, 1e-3 * (outlier_scale if n == "c" else 1), seed=i)
                  for i, n in enumerate("abc")}
        for n in "abc":
            await push(ps, links[n], *deltas[n][:2])
        await ps.round_task
        return ps, deltas
    return asyncio.run(scenario())


def reference_hash(tmp_path, deltas, names, **changes):
    """The hash a PS reaches when only `names` push their deltas (the same model, the same codec)."""
    async def scenario():
        ps = ParameterServer(small_config(num_sites=len(names), **{"train.rounds": 2, **changes}), run_dir=tmp_path)
        links = {n: enter(ps, Join(n)) for n in names}
        for n in names:
            await push(ps, links[n], *deltas[n][:2])
        await ps.round_task
        return ps.ledger.hash
    return asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_an_outlier_delta_is_rejected_against_its_peers(tmp_path):
    ps, deltas = three_site_round(tmp_path / "run", outlier_scale=20)
    end = rows_of(ps, "round_end")[-1]
    assert end["sites"] == ["a", "b"] and end["rejected"] == ["c"]
    q = rows_of(ps, "quarantine")[-1]
    assert q["site"] == "c" and q["action"] == "reject" and 15 < q["norm"] / q["reference"] < 25
    assert ps.ledger.hash == reference_hash(tmp_path / "ref", deltas, "ab")       # as if c had sent nothing
    assert all(math.isfinite(e["val_loss"]) for e in rows_of(ps, "round_end"))


@pytest.mark.timeout(120)
def test_an_outlier_delta_can_be_clipped_instead(tmp_path):
    ps, deltas = three_site_round(tmp_path / "run", outlier_scale=20, **{"robust.norm_action": "clip",
                                                                          "robust.clip_ratio": 0.0})
    q = rows_of(ps, "quarantine")[-1]
    assert q["site"] == "c" and q["action"] == "clip" and q["factor"] == pytest.approx(10 * q["reference"] / q["norm"])
    assert rows_of(ps, "round_end")[-1]["sites"] == ["a", "b", "c"]
    clipped = dict(deltas, c=(scaled(deltas["c"][0], q["factor"]), deltas["c"][1], None))
    assert ps.ledger.hash == reference_hash(tmp_path / "ref", clipped, "abc", **{"robust.trust": "trusted"})


@pytest.mark.timeout(120)
def test_trimmed_mean_takes_the_coordinate_median_of_three(tmp_path):
    ps, deltas = three_site_round(tmp_path / "run", outlier_scale=20, **{"robust.trust": "trusted",
                                                                          "robust.aggregate": "trimmed_mean"})
    assert rows_of(ps, "round_end")[-1]["sites"] == ["a", "b", "c"]
    fresh = ParameterServer(small_config(**{"train.rounds": 2}), run_dir=tmp_path / "ref")
    start = flat_copy(fresh.model)
    median = {k: np.median(np.stack([deltas[n][2][k] for n in "abc"]), axis=0).astype(np.float32)
              for k in start}                                   # of three float32 values: exactly the middle one
    update = OuterNesterov(ps.cfg.train.outer_lr, ps.cfg.train.outer_momentum).update(median)
    _, decoded = encode_arrays(update, Codec(ps.cfg.codec), ErrorFeedback())
    load_flat(fresh.model, start)
    apply_update(fresh.model, decoded)
    assert param_hash(fresh.model) == ps.ledger.hash


@pytest.mark.timeout(120)
def test_a_lone_site_is_judged_against_nothing_and_told_so(tmp_path):
    async def scenario():
        ps = ParameterServer(small_config(num_sites=1, **{"train.rounds": 3}), run_dir=tmp_path)
        a = enter(ps, Join("a"))
        for r, scale in enumerate([1e-3, 1e-3, 3e-2]):
            drain(a)
            await push(ps, a, *encoded_delta(ps, r, scale, seed=r)[:2])
            await ps.round_task
        return ps
    ps = asyncio.run(scenario())
    assert rows_of(ps, "quarantine") == [] and ps.ledger.round == 3       # no history it could be judged by
    alert, = rows_of(ps, "alert")
    assert alert["round"] == 0 and "no rule can tell an honest delta from a hostile one" in alert["message"]


@pytest.mark.timeout(120)
def test_a_delta_larger_than_the_model_is_refused_on_arrival(tmp_path):
    async def scenario():
        ps, a, msgs, m = one_site_round(tmp_path, **{"codec.mode": "fp32"})
        huge = [TensorChunk(c.kind, c.round, c.index, c.count, c.spec,
                            Encoded("fp32", c.spec.length, 0, b"", np.full(c.spec.length, 1e38, "<f4").tobytes()))
                for c in msgs]
        for c in huge:
            ps.on_chunk(a, c)
        with pytest.raises(ProtocolError, match="max_delta_ratio"):
            await ps.on_metrics(a, m)
        assert ps.ledger.round == 0 and not ps.rounds.aggregating
        assert rows_of(ps, "quarantine")[-1]["action"] == "rejected"

    asyncio.run(scenario())


@pytest.mark.timeout(180)
def test_a_hostile_site_cannot_poison_a_real_run(tmp_path):
    """The reported attack, over gRPC (the PS and the honest site in this process: tests/harness.py;
    the attacker a client of its own, in a thread): a complete fp32 delta of 1e38 per element with a
    plausible token count, then a claim of 2^64 - 1 tokens, from an authenticated site; the honest
    site trains every round, the validation loss stays finite, every replica agrees."""
    tokens = {"honest": "honest-token-0123456789", "mallory": "mallory-token-0123456789"}
    cfg = small_config(num_sites=2, sites=["honest", "mallory"], **{
        "codec.mode": "fp32", "train.rounds": 4, "train.inner_steps": 10, "schedule.quorum_wait_s": 0.5})

    def attack(address: str, kind: str):
        m = HandSite(address, None, "mallory", tokens["mallory"])
        try:
            m.enter()
            start = m.wait_round()
            msgs, metrics = m.delta(start.round)
            if kind == "huge":
                msgs = [TensorChunk(x.kind, x.round, x.index, x.count, x.spec, Encoded(
                    "fp32", x.spec.length, 0, b"", np.full(x.spec.length, 1e38, "<f4").tobytes())) for x in msgs]
            else:
                metrics = dataclasses.replace(metrics, tokens=2**64 - 1)
            for x in msgs:
                m.send(x)
            m.send(metrics)
            return m.status()
        finally:
            m.close()

    async def scenario() -> list[dict]:
        async with InProcessCluster(cfg, tmp_path / "run", auth=Authenticator(tokens)) as c:
            c.start_site("honest", token=tokens["honest"])
            for kind in ("huge", "tokens"):
                err = await asyncio.to_thread(attack, c.address, kind)
                assert err is not None and err.code().name == "INVALID_ARGUMENT", err
                assert ("max_delta_ratio" if kind == "huge" else "tokens") in err.details()
            return await c.finish()

    events = asyncio.run(scenario())
    ends = rows(events, "round_end")
    assert [e["round"] for e in ends] == list(range(4))
    assert all(math.isfinite(e["val_loss"]) for e in ends) and ends[-1]["val_loss"] < ends[0]["val_loss"] + 0.5
    assert all("mallory" not in e["sites"] for e in ends)
    assert [q["site"] for q in rows(events, "quarantine")] == ["mallory"]
    checks = [e for e in rows(events, "hash_check") if e["site"] == "honest"]
    assert len(checks) == 4 and all(e["ok"] for e in checks)
    check_run([e for e in events if e.get("site") != "mallory"], 4)


@pytest.mark.timeout(120)
def test_a_site_given_a_broken_model_says_so(tmp_path):
    """Finding 1, the other side: the honest site exited with "cannot quantize non-finite values",
    which does not point at the cause. Now a NaN in a downloaded model or an update, or a NaN loss,
    is named for what it is."""
    from wantrain.errors import CorruptModelError, DivergedError
    from wantrain.transport.messages import MODEL, UPDATE, RoundResult, Welcome
    from wantrain.site import Site, SiteOptions

    cfg = small_config(num_sites=1)
    site = Site(SiteOptions(ps="127.0.0.1:1", name="a", device="cpu", threads=1))
    site._on_welcome(Welcome("run", 0, cfg, 0, "0" * 16, 1))
    first = next(iter(site.replica.sizes))
    bad = np.zeros(site.replica.sizes[first], np.float32)
    bad[5] = np.nan
    enc, _ = Codec(type(cfg.codec)(mode="fp32")).encode(bad)
    from wantrain.codec import ChunkSpec
    with pytest.raises(CorruptModelError, match="model the parameter server sent .* NaN or Inf in"):
        site.replica.place(TensorChunk(MODEL, 0, 0, 1, ChunkSpec(first, 0, bad.size), enc))
    update = [TensorChunk(UPDATE, 0, i, 1, ChunkSpec(k, 0, n), Codec(type(cfg.codec)(mode="fp32")).encode(
        np.full(n, np.inf if k == first else 0, np.float32))[0]) for i, (k, n) in enumerate(site.replica.sizes.items())]
    update = [TensorChunk(UPDATE, 0, i, len(update), c.spec, c.data) for i, c in enumerate(update)]
    with pytest.raises(CorruptModelError, match="update of round 0 .* global model is corrupt"):
        site.replica.apply(update, RoundResult(0, "0" * 16))
    with torch_no_grad():
        dict(site.model.named_parameters())[first].view(-1)[0] = float("nan")   # parameters already broken
    with pytest.raises(DivergedError, match="training loss became nan at inner step 0 of round 0"):
        site.inner.run(0, 0.0)


def torch_no_grad():
    import torch
    return torch.no_grad()


def test_sum_of_squares_from_symbols_equals_that_of_the_values():
    from wantrain.codec import Codec
    from wantrain.config import CodecConfig
    from wantrain.outer.screening import sum_of_squares
    rng = np.random.default_rng(3)
    codec = Codec(CodecConfig(quant_block=64))
    encs = [codec.encode((rng.standard_normal(n) * s).astype(np.float32))[0] for n, s in ((1000, 1e-3), (37, 5.0))]
    parts = Codec.extract_many(encs)
    for p in parts:
        values = p.values().astype(np.float64)
        assert sum_of_squares(p) == pytest.approx(np.dot(values, values), rel=1e-6)   # values() rounds to f32
