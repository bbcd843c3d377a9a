"""The PS as a domain object, driven without a network."""

import asyncio

import numpy as np
import pytest

from wantrain.codec import Codec, EncodeStats, encode_arrays
from wantrain.config import CodecConfig
from wantrain.errors import ProtocolError, Reject, RejectedError
from wantrain.transport.messages import (DELTA, MODEL, UPDATE, HashReport, Join, Ready, RoundMetrics, RoundResult,
                                         RoundStart, TensorChunk, Welcome)
from wantrain.ps import ParameterServer
from wantrain.models.params import param_hash

from .helpers import drain, small_config


def enter(ps, join):
    """Join a site and, as a real site does once its model is loaded, say it is Ready."""
    link = ps.join(join)
    if link.name not in ps.sites.awaiting_model:
        ps.on_ready(link, Ready(ps.ledger.round, ps.ledger.hash))
    return link


def metrics_for(cfg, round_, stats, chunks, steps=1, tokens=None):
    """RoundMetrics as an honest site reports them for a delta encoded with `stats`."""
    tokens = steps * cfg.train.batch_size * cfg.model.block_size if tokens is None else tokens
    return RoundMetrics(round=round_, train_loss=3.0, last_train_loss=3.0, tokens=tokens, steps=steps,
                        raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes, huffman_bits_per_symbol=0.0,
                        encode_s=0, decode_s=0, compute_s=0, send_s=0, chunks=chunks)


def delta_chunks(ps, round_, scale=1e-3, seed=0):
    rng = np.random.default_rng(seed)
    delta = {k: (rng.standard_normal(n) * scale).astype(np.float32) for k, n in ps.shapes.items()}
    stats = EncodeStats()
    chunks, _ = encode_arrays(delta, Codec(ps.cfg.codec), None, stats)
    msgs = [TensorChunk(DELTA, round_, i, len(chunks), spec, enc) for i, (spec, enc) in enumerate(chunks)]
    return msgs, metrics_for(ps.cfg, round_, stats, len(msgs))


async def deliver(ps, round_, *links):
    """Each of `links` sends a whole delta of `round_` (its own seed) and its metrics."""
    for seed, link in enumerate(links):
        msgs, m = delta_chunks(ps, round_, seed=seed)
        for c in msgs:
            ps.on_chunk(link, c)
        await ps.on_metrics(link, m)


def one_site_round(tmp_path, **changes):
    """A PS for one site, that site joined and in round 0, and a valid delta for it."""
    ps = ParameterServer(small_config(num_sites=1, **changes), run_dir=tmp_path)
    a = enter(ps, Join("a"))
    drain(a)
    msgs, m = delta_chunks(ps, 0)
    return ps, a, msgs, m


@pytest.mark.timeout(120)
def test_round_without_network(tmp_path):
    async def scenario():
        ps = ParameterServer(small_config(num_sites=2, **{"train.rounds": 1}), run_dir=tmp_path)
        a = enter(ps, Join("a"))
        first = drain(a)
        assert isinstance(first[0], Welcome) and all(c.kind == MODEL for c in first[1:])
        assert len(first) - 1 == first[0].model_chunks
        with pytest.raises(RejectedError, match="wire protocol"):
            ps.join(Join("b", protocol_version=99))
        b = enter(ps, Join("b"))
        drain(b)
        with pytest.raises(RejectedError, match="already has its 2 sites"):
            ps.join(Join("c"))
        assert isinstance(a.outbox.get_nowait(), RoundStart)
        h0 = ps.ledger.hash

        msgs, m = delta_chunks(ps, 0)
        with pytest.raises(ProtocolError, match="round 5"):
            ps.on_chunk(a, TensorChunk(DELTA, 5, 0, msgs[0].count, msgs[0].spec, msgs[0].data))
        for c in msgs:
            ps.on_chunk(a, c)
        with pytest.raises(ProtocolError, match="arrived twice"):
            ps.on_chunk(a, msgs[0])
        await ps.on_metrics(a, m)
        assert ps.ledger.round == 0 and ps.ledger.hash == h0          # waits for b
        msgs_b, m_b = delta_chunks(ps, 0, seed=1)
        for c in msgs_b:
            ps.on_chunk(b, c)
        await ps.on_metrics(b, m_b)
        await ps.round_task
        assert ps.ledger.round == 1 and ps.ledger.hash != h0 and ps.ledger.hash == param_hash(ps.model)
        out = drain(a)
        assert all(c.kind == UPDATE for c in out[:-1]) and isinstance(out[-1], RoundResult)
        assert out[-1].model_hash == ps.ledger.hash and ps.done.is_set()
        ev = ps.recorder.events
        assert any('"kind":"round_end"' in e for e in ev) and any('"kind":"run_end"' in e for e in ev)

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_bad_delta_never_touches_the_model(tmp_path):
    async def scenario():
        ps, a, msgs, m = one_site_round(tmp_path)
        h0 = ps.ledger.hash
        with pytest.raises(ProtocolError, match="unknown tensor"):
            bad = msgs[0]
            ps.on_chunk(a, TensorChunk(DELTA, 0, 0, bad.count, type(bad.spec)("nope", 0, 1), bad.data))
        with pytest.raises(ProtocolError, match="outside"):
            ps.on_chunk(a, TensorChunk(DELTA, 0, 0, bad.count, type(bad.spec)(bad.spec.tensor, 10**9, bad.spec.length),
                                       bad.data))
        with pytest.raises(ProtocolError, match=f"comes in {len(msgs)} chunks"):
            ps.on_chunk(a, TensorChunk(DELTA, 0, 0, 10**12, bad.spec, bad.data))
        # A site that repeats its largest valid chunk under every index cannot hold more than
        # one model's worth of delta in the PS's memory: each index must be the plan's chunk.
        big = max(msgs, key=lambda c: c.spec.length)
        with pytest.raises(ProtocolError, match="the plan says"):
            for i in range(len(msgs)):
                ps.on_chunk(a, TensorChunk(DELTA, 0, i, len(msgs), big.spec, big.data))
        with pytest.raises(ProtocolError, match="metrics after"):
            await ps.on_metrics(a, m)
        assert ps.ledger.hash == h0 == param_hash(ps.model) and ps.ledger.round == 0

    asyncio.run(scenario())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["fp32", "int8-huffman", "topk"])
def test_non_finite_delta_is_rejected_for_that_site_alone(tmp_path, mode):
    from wantrain.codec import Encoded

    async def scenario():
        ps, a, msgs, m = one_site_round(tmp_path, **{"codec.mode": mode})
        h0 = ps.ledger.hash
        first = msgs[0]
        if mode == "fp32":           # a NaN element
            values = np.frombuffer(first.data.payload, np.float32).copy()
            values[3] = np.nan
            enc = Encoded("fp32", first.spec.length, 0, b"", values.tobytes())
        else:                         # an infinite scale
            scales = np.frombuffer(first.data.scales, np.float32).copy()
            scales[0] = np.inf
            enc = Encoded(mode, first.spec.length, first.data.quant_block, scales.tobytes(), first.data.payload)
        poisoned = TensorChunk(DELTA, 0, 0, first.count, first.spec, enc)
        for c in [poisoned] + msgs[1:]:
            ps.on_chunk(a, c)
        with pytest.raises(ProtocolError, match="non-finite"):
            await ps.on_metrics(a, m)
        assert ps.ledger.hash == h0 == param_hash(ps.model) and ps.ledger.round == 0 and not ps.rounds.aggregating
        assert rows_of(ps, "quarantine")[-1]["site"] == "a"

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_site_leaving_never_stalls_or_cancels_the_round(tmp_path):
    async def scenario():
        ps = ParameterServer(small_config(num_sites=2, **{"train.rounds": 3}), run_dir=tmp_path)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        # Round 0: b's delta completes the round, then b's connection drops mid-aggregation.
        await deliver(ps, 0, a, b)
        ps.leave(b, "connection lost")
        await ps.round_task
        assert ps.ledger.round == 1 and not ps.rounds.aggregating
        # Round 1: a is done, b (rejoined) leaves without a delta: the round goes on without it.
        b = enter(ps, Join("b"))
        await asyncio.sleep(0)
        msgs, m = delta_chunks(ps, 1)
        for c in msgs:
            ps.on_chunk(a, c)
        await ps.on_metrics(a, m)
        assert ps.ledger.round == 1
        ps.leave(b, "connection lost")
        await ps.round_task
        assert ps.ledger.round == 2 and rows_of(ps, "round_end")[-1]["sites"] == ["a"]

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_site_joining_again_replaces_its_open_session(tmp_path):
    """b's stream broke where the PS could not tell, mid-upload; b joins again: its old session ends
    `replaced` (what it still sends is void), the new one is welcomed, and the round goes on with b's
    delta sent again on it."""
    async def scenario():
        ps = ParameterServer(small_config(num_sites=2, **{"train.rounds": 2}), run_dir=tmp_path)
        a, old = enter(ps, Join("a")), enter(ps, Join("b"))
        drain(a), drain(old)
        msgs, m = delta_chunks(ps, 0, seed=1)
        for c in msgs[:len(msgs) // 2]:
            ps.on_chunk(old, c)
        new = ps.join(Join("b"))
        assert ps.sites.links["b"] is new and old.closed and old.ended[0] == Reject.REPLACED
        assert "another process runs under its name" in old.ended[1]
        assert drain(old)[-1] is None                              # its stream sends what was queued, then ends
        assert isinstance(drain(new)[0], Welcome)
        left = rows_of(ps, "leave")[-1]
        assert (left["site"], left["reason"]) == ("b", "replaced by a new session of the site")
        for c in msgs[len(msgs) // 2:]:                          # the old stream's last chunks: ignored
            await ps.handle(old, c)
        await ps.handle(old, m)
        assert "b" not in ps.rounds.uploads
        ps.leave(old, "stream closed by the site")               # the old stream's end changes nothing now
        assert ps.sites.links["b"] is new
        ps.on_ready(new, Ready(ps.ledger.round, ps.ledger.hash))
        await deliver(ps, 0, a, new)
        await ps.round_task
        assert ps.ledger.round == 1 and rows_of(ps, "round_end")[-1]["sites"] == ["a", "b"]

    asyncio.run(scenario())


def rows_of(ps, kind):
    import json
    return [json.loads(e) for e in ps.recorder.events if f'"kind":"{kind}"' in e]


@pytest.mark.timeout(120)
def test_chunkwise_aggregation_equals_the_whole_model_reference(tmp_path):
    """The PS steps one chunk at a time; the result is bit for bit the whole-tensor computation."""
    from wantrain.codec import ErrorFeedback
    from wantrain.outer.aggregate import weighted_mean
    from wantrain.outer.nesterov import OuterNesterov
    from wantrain.models.params import apply_update, flat_copy, load_flat

    async def scenario():
        ps = ParameterServer(small_config(num_sites=2, **{"train.rounds": 2, "robust.trust": "trusted"}), run_dir=tmp_path)
        start = flat_copy(ps.model)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        rng = np.random.default_rng(5)
        sent = {}
        for link, tokens in ((a, 700), (b, 2000)):
            delta = {k: (rng.standard_normal(n) * 1e-3).astype(np.float32) for k, n in ps.shapes.items()}
            stats = EncodeStats()
            chunks, sent[link.name] = encode_arrays(delta, Codec(ps.cfg.codec), None, stats)
            for i, (spec, enc) in enumerate(chunks):
                ps.on_chunk(link, TensorChunk(DELTA, 0, i, len(chunks), spec, enc))
            await ps.on_metrics(link, metrics_for(ps.cfg, 0, stats, len(chunks), steps=8, tokens=tokens))
        await ps.round_task
        outer = OuterNesterov(ps.cfg.train.outer_lr, ps.cfg.train.outer_momentum)
        whole = {k: weighted_mean([sent["a"][k], sent["b"][k]], [700.0, 2000.0]) for k in sent["a"]}   # per tensor
        update = outer.update(whole)
        _, decoded = encode_arrays(update, Codec(ps.cfg.codec), ErrorFeedback())
        load_flat(ps.model, start)
        apply_update(ps.model, decoded)
        assert param_hash(ps.model) == ps.ledger.hash

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_delta_is_in_one_encoding_that_fits_the_plan(tmp_path):
    """A site picks its delta's encoding, but all of a delta's chunks share it, and an fp32 chunk
    does not fit a plan of one byte an element."""
    from wantrain.codec import Codec, Encoded

    async def scenario():
        ps, a, msgs, m = one_site_round(tmp_path, **{"codec.mode": "int8-huffman"})
        assert len(msgs) > 1
        first, second = msgs[0], msgs[1]
        values = Codec.decode_many([second.data])[0]
        fp32 = Encoded("fp32", second.spec.length, 0, b"", values.astype("<f4").tobytes())
        with pytest.raises(ProtocolError, match="may be int8, int8-huffman, int4-huffman"):
            ps.on_chunk(a, TensorChunk(DELTA, 0, second.index, second.count, second.spec, fp32))
        ps.on_chunk(a, first)
        ternary, _ = Codec(CodecConfig(mode="ternary-huffman")).encode(values)
        with pytest.raises(ProtocolError, match="encoded ternary-huffman, the delta's first int8-huffman"):
            ps.on_chunk(a, TensorChunk(DELTA, 0, second.index, second.count, second.spec, ternary))
        assert ps.rounds.uploads["a"].encoding == "int8-huffman"

    asyncio.run(scenario())


def test_a_site_refuses_an_encoding_the_runs_plan_cannot_carry():
    from wantrain.errors import ConfigError
    from wantrain.site.uplink import Uplink

    with pytest.raises(ConfigError, match="codec 'fp32' is not one this run's deltas may be in"):
        Uplink("a", small_config(), {}, mode="fp32")
    assert Uplink("a", small_config(**{"codec.mode": "fp32"}), {}, mode="topk").codec.cfg.mode == "topk"


@pytest.mark.timeout(120)
def test_the_ps_waits_at_the_end_for_a_site_that_does_not_hold_the_final_model(tmp_path):
    """Both sites are in the last round's update when it commits; a reports the final hash, b's
    stream broke before: only a holds the final model, so only a is done with (the PS waits for b
    to come back and be told the run is over, rather than leaving it to retry a PS that is gone)."""
    async def scenario():
        ps = ParameterServer(small_config(num_sites=2, **{"train.rounds": 1}), run_dir=tmp_path)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        await deliver(ps, 0, a, b)
        await ps.round_task
        assert ps.done.is_set() and ps.sites.told_finished == set()
        ps.on_hash_report(a, HashReport(0, ps.ledger.hash))
        ps.leave(b, "connection lost")
        assert ps.sites.told_finished == {"a"}
        with pytest.raises(RejectedError, match="finished after 1 rounds"):
            ps.join(Join("b", resume_round=0))
        assert ps.sites.told_finished == {"a", "b"}

    asyncio.run(scenario())
