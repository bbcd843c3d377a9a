"""A delta's manifest at the PS (docs/protocol.md 4a), driven without a network: it comes first,
describes the run's chunk plan and the chunks that follow, claims the weight the metrics claim, and
tells the deadline how much of a late delta's importance is still missing."""

import asyncio
import json
from dataclasses import replace

import numpy as np
import pytest

from wantrain.codec import Codec, EncodeStats, encode_arrays
from wantrain.errors import ProtocolError
from wantrain.transport.messages import DELTA, HashReport, Join, RoundResult, TensorChunk
from wantrain.ps import ParameterServer
from wantrain.ps.journal import JOURNAL_DIR
from wantrain.transport.manifest import build_manifest
from wantrain.transport.roles import roles_of
from wantrain.models.params import named_params

from .helpers import small_config
from .test_server import drain, enter, metrics_for, rows_of

pytestmark = pytest.mark.timeout(120)


def delta_with_manifest(ps, round_, seed=0, steps=1):
    """A delta's chunks, its manifest (as a site builds it) and its metrics."""
    rng = np.random.default_rng(seed)
    delta = {k: (rng.standard_normal(n) * 1e-3).astype(np.float32) for k, n in ps.shapes.items()}
    stats = EncodeStats()
    chunks, decoded = encode_arrays(delta, Codec(ps.cfg.codec), None, stats)
    roles = roles_of({k: tuple(p.shape) for k, p in named_params(ps.global_model.model).items()})
    m = metrics_for(ps.cfg, round_, stats, len(chunks), steps=steps)
    manifest = build_manifest(round_, chunks, decoded, roles, tokens=m.tokens, steps=m.steps)
    msgs = [TensorChunk(DELTA, round_, i, len(chunks), spec, enc) for i, (spec, enc) in enumerate(chunks)]
    return manifest, msgs, m


def test_a_delta_with_a_manifest_commits_as_one_without():
    async def scenario(with_manifest):
        ps = ParameterServer(small_config(num_sites=1), run_dir=None)
        a = enter(ps, Join("a"))
        drain(a)
        manifest, msgs, m = delta_with_manifest(ps, 0)
        if with_manifest:
            ps.on_manifest(a, manifest)
        for i in sorted(range(len(msgs)), key=lambda i: -manifest.chunks[i].importance):   # importance order
            ps.on_chunk(a, msgs[i])
        await ps.on_metrics(a, m)
        await ps.round_task
        return ps.ledger.round, ps.ledger.hash

    assert asyncio.run(scenario(True)) == asyncio.run(scenario(False)) and asyncio.run(scenario(True))[0] == 1


def _refused(edit_manifest=None, after_chunk=False, edit_metrics=None, edit_chunk=None, twice=False):
    async def scenario():
        ps = ParameterServer(small_config(num_sites=1), run_dir=None)
        a = enter(ps, Join("a"))
        drain(a)
        manifest, msgs, m = delta_with_manifest(ps, 0)
        if after_chunk:
            ps.on_chunk(a, msgs[0])
        ps.on_manifest(a, edit_manifest(manifest) if edit_manifest else manifest)
        if twice:
            ps.on_manifest(a, manifest)
        for c in msgs[1:] if after_chunk else msgs:
            ps.on_chunk(a, edit_chunk(c) if edit_chunk and c.index == 1 else c)
        await ps.on_metrics(a, edit_metrics(m) if edit_metrics else m)
    with pytest.raises(ProtocolError) as info:
        asyncio.run(scenario())
    return str(info.value)


def test_a_manifest_that_does_not_belong_is_refused():
    assert "came after its delta's first chunk" in _refused(after_chunk=True)
    assert "arrived twice" in _refused(twice=True)
    shifted = lambda m: replace(m, chunks=(replace(m.chunks[0], offset=1), *m.chunks[1:]))
    assert "manifest entry 0 covers" in _refused(shifted)
    assert "lists 2" in _refused(lambda m: replace(m, chunks=m.chunks[:2]))
    assert "claim 99 inner steps" in _refused(lambda m: replace(m, steps=99))


def test_a_chunk_or_metrics_unlike_the_manifest_are_refused():
    other = lambda c: replace(c, data=replace(c.data, payload=c.data.payload[:-1] + bytes([c.data.payload[-1] ^ 1])))
    assert "not the chunk its manifest described" in _refused(edit_chunk=other)
    assert "its manifest 1 and" in _refused(edit_metrics=lambda m: replace(m, tokens=m.tokens - 1))


async def a_done_b_to_come(cfg):
    """A PS for sites a and b in round 0: a's delta complete (metrics and all), b's delta, its manifest
    and metrics made but nothing of it sent. Returns the PS, b's link and what b will send."""
    ps = ParameterServer(cfg, run_dir=None)
    _, a_msgs, a_metrics = delta_with_manifest(ps, 0, seed=1)
    b_manifest, b_msgs, _ = delta_with_manifest(ps, 0, seed=2)
    a, b = enter(ps, Join("a")), enter(ps, Join("b"))
    drain(a), drain(b)
    for c in a_msgs:
        ps.on_chunk(a, c)
    await ps.on_metrics(a, a_metrics)
    return ps, b, b_manifest, b_msgs


def test_the_deadline_says_how_much_of_a_late_delta_s_importance_is_missing():
    async def scenario():
        ps, b, b_manifest, b_msgs = await a_done_b_to_come(small_config(num_sites=2, **{
            "train.rounds": 2, "schedule.deadline_s": 3.0, "recovery.partial_deltas": False}))    # a deadline, not put off
        ps.on_manifest(b, b_manifest)
        sent = sorted(range(len(b_msgs)), key=lambda i: -b_manifest.chunks[i].importance)[:len(b_msgs) // 2]
        for i in sent:
            ps.on_chunk(b, b_msgs[i])
        await asyncio.sleep(3.3)
        await ps.round_task
        return ps, b_manifest, sent

    ps, manifest, sent = asyncio.run(scenario())
    deadline = rows_of(ps, "deadline")[-1]
    assert deadline["missing"] == ["b"]
    missing = deadline["missing_importance"]["b"]
    assert missing == pytest.approx(manifest.missing(sent), abs=1e-6) and 0 < missing < 0.5   # the top half went first


def _partial_run(tmp_path, policy, late_b):
    """Two sites, rounds 0 and 1, fp32 deltas, lr 1 and no outer momentum (so the model ends at its
    start minus every mass applied). In round 0 `late_b`: b sends its manifest and the top half of
    its chunks by importance before the deadline, the rest after; else it is on time. Returns the PS,
    the chunks b had in at the deadline and what a heard."""
    cfg = small_config(num_sites=2, **{"train.rounds": 3, "schedule.deadline_s": 3.0, "recovery.late_policy": policy,
                                       "recovery.partial_deltas": True, "train.checkpoint_every": 10,
                                       "recovery.reliable_rounds": 0, "train.warmup_steps": 0, "train.outer_lr": 1.0,
                                       "train.outer_momentum": 0.0, "codec.mode": "fp32"})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        deltas = {(r, s): delta_with_manifest(ps, r, seed=10 * r + i) for r in (0, 1) for i, s in enumerate("ab")}
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        drain(a), drain(b)
        heard = []
        for r in (0, 1):
            for site, link in (("a", a), ("b", b)):
                manifest, msgs, m = deltas[(r, site)]
                ps.on_manifest(link, manifest)
                order = sorted(range(len(msgs)), key=lambda i: -manifest.chunks[i].importance)
                first = order[:len(order) // 2] if (site, r) == ("b", 0) and late_b else order
                for i in first:
                    ps.on_chunk(link, msgs[i])
                if first is order:
                    await ps.on_metrics(link, m)
            if r == 0 and late_b:
                await asyncio.sleep(3.3)                 # the deadline: a's delta and half of b's are in
                await ps.round_task
                heard += drain(a)
                for i in order[len(order) // 2:]:        # the rest of b's, late
                    ps.on_chunk(b, deltas[(0, "b")][1][i])
                await ps.on_metrics(b, deltas[(0, "b")][2])
                ps.on_hash_report(b, HashReport(0, ps.ledger.hash))
            await ps.round_task
            heard += drain(a)
        return ps, frozenset(order[:len(order) // 2]), heard

    return cfg, *asyncio.run(scenario())


@pytest.mark.parametrize("policy", ["zero-outside", "rescale", "zero-carry"])
def test_the_chunks_in_at_the_deadline_count_and_the_rest_once_later(tmp_path, policy):
    cfg, ps, sent, heard = _partial_run(tmp_path / "late", policy, late_b=True)
    results = [m for m in heard if isinstance(m, RoundResult)]
    assert [(r.round, r.sites, r.partial_chunks) for r in results][0] == (0, ("a",), (("b", sent),))
    n = len(ps.plan)
    ends = rows_of(ps, "round_end")
    assert (ends[0]["close"], ends[0]["partial"], ends[0]["substituted"]) == ("deadline", {"b": len(sent)},
                                                                              {"b": n - len(sent)})
    assert ends[0]["substitute"] == ("peer" if policy == "rescale" else "zero")
    assert ends[1]["close"] == "complete"
    assert ends[1]["reconciled"] == ({"b@0": n - len(sent)} if policy == "zero-outside" else {})
    late = rows_of(ps, "late_delta")[-1]
    assert (late["site"], late["action"]) == ("b", "deferred" if policy == "zero-outside" else "dropped")
    first = json.loads((tmp_path / "late" / JOURNAL_DIR / "commit-000000.json").read_text())
    b0 = next(c for c in first["contributions"] if c["site"] == "b")
    assert b0["partial"] and b0["chunks"] == sorted(sent)
    second = json.loads((tmp_path / "late" / JOURNAL_DIR / "commit-000001.json").read_text())
    rest = [c for c in second["contributions"] if c["key"] == "b@0"]
    if policy == "zero-outside":                 # the rest, once, outside the momentum, at b's half of round 0
        assert results[1].late_sites == ("b",)
        assert rest[0]["side"] and set(rest[0]["chunks"]) == set(range(len(ps.plan))) - sent
        assert rest[0]["weight"] == pytest.approx(0.5)
        # Every chunk of b's round-0 delta counted once: the model ends where it would with b on time.
        _, on_time, _, _ = _partial_run(tmp_path / "on-time", policy, late_b=False)
        for k, v in ps.global_model.views.items():
            np.testing.assert_allclose(v, on_time.global_model.views[k], rtol=0, atol=1e-6)
    else:       # the others' mean (rescale) or zeros (zero-carry: b carries the rest) stood in: never applied
        assert not rest and results[1].late_sites == ()
    from .test_journal import assert_same_state, state_of    # and a restart replays it bit for bit
    assert_same_state(state_of(ParameterServer(cfg, run_dir=tmp_path / "late")), state_of(ps))


def _early(missing_critical=False, no_manifest=False, budget=0.2, reliable_rounds=0, trickle=0):
    """Two sites, a deadline of 5 s: a's delta complete, then b's manifest and its chunks in order
    of importance until what is missing of b is under `budget` (all its critical chunks, unless
    `missing_critical`; no manifest at all with `no_manifest`), then `trickle` more, 0.3 s apart.
    Returns the PS and whether round 0 closed."""
    # tiny: enough chunks that a partial delta can miss some and still be within the budget
    cfg = small_config(num_sites=2, **{"model.preset": "tiny", "train.rounds": 2, "schedule.deadline_s": 5.0,
                                       "recovery.late_policy": "zero-outside",
                                       "recovery.partial_deltas": True, "recovery.loss_budget": budget,
                                       "recovery.reliable_rounds": reliable_rounds,
                                       "train.warmup_steps": 0})

    async def scenario():
        ps, b, b_manifest, b_msgs = await a_done_b_to_come(cfg)
        if not no_manifest:
            ps.on_manifest(b, b_manifest)
        order = sorted(range(len(b_msgs)), key=lambda i: (b_manifest.chunks[i].role != "critical",
                                                          -b_manifest.chunks[i].importance))
        if missing_critical:
            order = order[1:]
        held, sent = 1.0, 0
        for i in order:
            if held <= budget / 2:      # b weighs half the round: its missing share is half the round's
                break
            ps.on_chunk(b, b_msgs[i])
            held, sent = held - b_manifest.chunks[i].importance, sent + 1
        for i in order[sent: sent + trickle]:    # still flowing: each within the grace of the last
            await asyncio.sleep(0.3)
            ps.on_chunk(b, b_msgs[i])
        await asyncio.sleep(1.0)                 # the grace: a tenth of the deadline
        if ps.round_task is not None:
            await ps.round_task
        return ps
    ps = asyncio.run(scenario())
    return ps, ps.ledger.round == 1


def test_a_round_closes_early_once_what_is_missing_is_within_the_budget():
    ps, closed = _early()
    assert closed
    end = rows_of(ps, "round_end")[-1]
    assert end["close"] == "early" and end["sites"] == ["a"] and 0 < end["partial"]["b"] < len(ps.plan) - 3
    partial_b = end["partial"]["b"]
    assert not _early(missing_critical=True)[1]          # a critical chunk of b is not in
    assert not _early(no_manifest=True)[1]               # b sent no manifest: it is a straggler, as today
    assert not _early(reliable_rounds=1)[1]              # warm-up: no round closes early
    assert not _early(budget=0.0)[1]                     # no budget: never early
    # Chunks still flowing are in flight, not lost: the round waits until they stop for the grace.
    ps, closed = _early(trickle=3)
    end = rows_of(ps, "round_end")[-1]
    assert closed and end["close"] == "early" and end["partial"]["b"] == partial_b + 3


def test_an_early_close_waits_for_a_delta_whose_every_chunk_is_in():
    """b's every chunk is in, its metrics not yet (a busy PS checks them slowly): nothing is missing,
    but closing now would count b's whole delta as a partial one and its metrics as late. The round
    waits past the grace, then completes when they come."""
    cfg = small_config(num_sites=2, **{"train.rounds": 2, "schedule.deadline_s": 5.0,
                                       "recovery.late_policy": "zero-outside",
                                       "recovery.partial_deltas": True, "recovery.reliable_rounds": 0,
                                       "train.warmup_steps": 0})

    async def scenario():
        ps, b, b_manifest, b_msgs = await a_done_b_to_come(cfg)
        _, _, b_metrics = delta_with_manifest(ps, 0, seed=2)
        ps.on_manifest(b, b_manifest)
        for c in b_msgs:
            ps.on_chunk(b, c)
        await asyncio.sleep(1.0)                 # twice the grace (a tenth of the deadline)
        waited = ps.ledger.round == 0 and not ps.rounds.aggregating
        await ps.on_metrics(b, b_metrics)
        await ps.round_task
        return ps, waited

    ps, waited = asyncio.run(scenario())
    end = rows_of(ps, "round_end")[-1]
    assert waited and end["close"] == "complete" and end["sites"] == ["a", "b"] and not end["partial"]


def _extended(more: bool):
    """Two sites, a deadline of 2 s, recovery.extend_above 0.1: a's delta complete; of b's, at the
    deadline, what holds 0.4 of its importance (0.2 of the round's: too much to go without). After
    the deadline, with `more`, chunks until the round misses 0.05. Returns the PS's round_end."""
    cfg = small_config(num_sites=2, **{"train.rounds": 2, "schedule.deadline_s": 2.0, "recovery.late_policy": "zero-outside",
                                       "recovery.loss_budget": 0.02, "recovery.extend_above": 0.1,
                                       "recovery.reliable_rounds": 0, "train.warmup_steps": 0})

    async def scenario():
        ps, b, b_manifest, b_msgs = await a_done_b_to_come(cfg)
        ps.on_manifest(b, b_manifest)
        order = sorted(range(len(b_msgs)), key=lambda i: (b_manifest.chunks[i].role != "critical",
                                                          -b_manifest.chunks[i].importance))
        held, sent = 1.0, 0

        def send_until(wanted: float) -> None:
            nonlocal held, sent
            for i in order[sent:]:
                if held <= wanted:
                    break
                ps.on_chunk(b, b_msgs[i])
                held, sent = held - b_manifest.chunks[i].importance, sent + 1
        send_until(0.4)
        await asyncio.sleep(2.3)                  # the deadline passes: the round waits
        assert ps.ledger.round == 0 and not ps.rounds.aggregating and ps.rounds.extensions == 1
        if more:
            send_until(0.1)
        await asyncio.sleep(0.6 if more else 2.2)   # (more) the grace, a tenth of the deadline; else
        if ps.round_task is not None:               # the deadline once more
            await ps.round_task
        return ps
    ps = asyncio.run(scenario())
    assert ps.ledger.round == 1
    return rows_of(ps, "round_end")[-1]


def test_a_round_missing_too_much_at_its_deadline_waits_one_deadline_more_at_most():
    end = _extended(more=True)
    assert end["close"] == "extended" and end["partial"]["b"] > 0
    end = _extended(more=False)
    assert end["close"] == "deadline" and end["partial"]["b"] > 0


def test_a_partial_delta_the_screen_rejects_counts_as_zeros_and_the_round_commits(tmp_path):
    """Three sites; at the deadline b's manifest and half its chunks are in, and they point against
    a's and c's: the screen rejects them, zeros stand in for b, and the round commits and is told
    (its commit record names b missing; a restart replays it)."""
    cfg = small_config(num_sites=3, **{"train.rounds": 2, "schedule.deadline_s": 2.0, "recovery.late_policy": "zero-outside",
                                       "recovery.partial_deltas": True, "recovery.reliable_rounds": 0, "train.warmup_steps": 0,
                                       "train.checkpoint_every": 10})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        links = {s: enter(ps, Join(s)) for s in "abc"}
        for link in links.values():
            drain(link)
        manifest, msgs, m = delta_with_manifest(ps, 0, seed=1)
        for s in "ac":                                   # a and c: the same direction
            ps.on_manifest(links[s], manifest)
            for c in msgs:
                ps.on_chunk(links[s], c)
            await ps.on_metrics(links[s], m)
        rng = np.random.default_rng(1)                   # b: the same delta as a's, reversed and larger
        against = {k: (-3 * rng.standard_normal(n) * 1e-3).astype(np.float32) for k, n in ps.shapes.items()}
        stats = EncodeStats()
        chunks, decoded = encode_arrays(against, Codec(cfg.codec), None, stats)
        roles = roles_of({k: tuple(p.shape) for k, p in named_params(ps.global_model.model).items()})
        b_manifest = build_manifest(0, chunks, decoded, roles, tokens=m.tokens, steps=m.steps)
        ps.on_manifest(links["b"], b_manifest)
        for i, (spec, enc) in enumerate(chunks[: len(chunks) // 2]):
            ps.on_chunk(links["b"], TensorChunk(DELTA, 0, i, len(chunks), spec, enc))
        await asyncio.sleep(2.3)                          # the deadline
        await ps.round_task
        return ps, drain(links["a"])
    ps, heard = asyncio.run(scenario())
    assert ps.ledger.round == 1 and any(isinstance(x, RoundResult) and x.round == 0 for x in heard)
    end = rows_of(ps, "round_end")[-1]
    assert end["round"] == 0 and "b" in end["rejected"] and end["substituted"]["b"] == len(ps.plan)
    record = json.loads((tmp_path / JOURNAL_DIR / "commit-000000.json").read_text())
    assert [c for c in record["contributions"] if c["key"] == "b"] == [
        {"key": "b", "site": "b", "missing": True, "weight": pytest.approx(m_weight(record))}]
    from .test_journal import assert_same_state, state_of    # a restart replays it bit for bit
    assert_same_state(state_of(ParameterServer(cfg, run_dir=tmp_path)), state_of(ps))


def m_weight(record: dict) -> float:
    """The weight zeros stood in with: the mean of the counted deltas' (a's and c's)."""
    counted = [c["weight"] for c in record["contributions"] if c["key"] in ("a", "c")]
    return sum(counted) / len(counted)


@pytest.mark.parametrize("manifest", [True, False])
def test_a_warm_up_round_puts_its_deadline_off_for_a_member_still_sending(manifest):
    """recovery.reliable_rounds: a warm-up round tolerates no loss. At its deadline (1 s) b's manifest
    and half its chunks are in: the round waits a deadline more, and b's whole delta counts. A member
    that sent nothing is a straggler as ever: the round closes without it at the deadline."""
    cfg = small_config(num_sites=2, **{"train.rounds": 2, "schedule.deadline_s": 1.0, "recovery.late_policy": "zero-outside",
                                       "recovery.partial_deltas": True, "recovery.reliable_rounds": 1})

    async def scenario():
        ps, b, b_manifest, b_msgs = await a_done_b_to_come(cfg)
        if manifest:
            ps.on_manifest(b, b_manifest)
            for c in b_msgs[: len(b_msgs) // 2]:
                ps.on_chunk(b, c)
        await asyncio.sleep(1.4)                         # past the deadline
        open_at_deadline = ps.round_task is None
        if manifest:
            for c in b_msgs[len(b_msgs) // 2:]:
                ps.on_chunk(b, c)
            await ps.on_metrics(b, delta_with_manifest(ps, 0, seed=2)[2])
        if ps.round_task is not None:
            await ps.round_task
        return ps, open_at_deadline
    ps, open_at_deadline = asyncio.run(scenario())
    end = rows_of(ps, "round_end")[-1]
    assert open_at_deadline == manifest
    assert (end["sites"], end["close"]) == ((["a", "b"], "complete") if manifest else (["a"], "deadline"))
