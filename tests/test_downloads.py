"""Finding 2: a model download stays consistent while rounds commit.

A site that (re)joins over a slow link keeps downloading while the other sites commit rounds
(on a real WAN, a llama3-1b download takes minutes). Its Welcome announces round r: it must
receive round r's parameters, then every update since, and end bit-identical to the PS.
"""

import asyncio

import pytest

from wantrain.codec import Codec, join_chunks
from wantrain.transport.messages import Join, RoundResult, TensorChunk, Welcome
from wantrain.models import build_model
from wantrain.ps import ParameterServer
from wantrain.ps.downloads import ModelDownload
from wantrain.models.params import apply_update, load_flat, named_params, param_hash
from wantrain.telemetry import rows

from .cluster import Cluster, check_run
from .helpers import small_config
from .test_server import delta_chunks, drain, enter, rows_of


async def push(ps, link, round_, seed):
    msgs, m = delta_chunks(ps, round_, seed=seed)
    for c in msgs:
        ps.on_chunk(link, c)
    await ps.on_metrics(link, m)
    await ps.round_task


@pytest.mark.timeout(120)
def test_a_download_in_flight_keeps_its_round_while_two_rounds_commit(tmp_path):
    async def scenario():
        cfg = small_config(num_sites=2, **{"train.rounds": 4, "schedule.quorum_wait_s": 0.0})
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        for link, seed in ((a, 0), (b, 1)):
            drain(link)
            msgs, m = delta_chunks(ps, 0, seed=seed)
            for c in msgs:
                ps.on_chunk(link, c)
            await ps.on_metrics(link, m)
        await ps.round_task
        ps.leave(b, "connection lost")
        b = ps.join(Join("b"))                    # b rejoins: its model download starts at round 1 ...
        download = b.outbox.get_nowait()
        assert isinstance(download, ModelDownload)
        parts = download.messages()
        welcome, first = next(parts), next(parts)   # ... and stalls after its first chunk
        for r in (1, 2):                            # while a commits two rounds alone
            drain(a)
            await push(ps, a, r, seed=10 + r)
        rest = list(parts)                          # the download resumes
        return ps, cfg, welcome, [first, *rest], drain(b)

    ps, cfg, welcome, chunks, after = asyncio.run(scenario())
    assert isinstance(welcome, Welcome) and welcome.round == 1 and welcome.model_hash == ps.ledger.hashes[1]
    assert len(chunks) == welcome.model_chunks
    assert [e["downloads"] for e in rows_of(ps, "downloads_frozen")] == [1]    # frozen once, at round 1

    replica = build_model(cfg.model.preset, 256, cfg.model.seed + 1)   # other weights: all must come over
    sizes = {k: p.numel() for k, p in named_params(replica).items()}
    load_flat(replica, join_chunks([c.spec for c in chunks], Codec.decode_many([c.data for c in chunks]), sizes))
    assert param_hash(replica) == welcome.model_hash                    # the model the Welcome announced
    updates: list[TensorChunk] = []
    for m in after:                                                     # then rounds 1 and 2, in order
        if isinstance(m, RoundResult):
            apply_update(replica, join_chunks([c.spec for c in updates], Codec.decode_many([c.data for c in updates]),
                                              sizes))
            assert param_hash(replica) == m.model_hash == ps.ledger.hashes[m.round + 1]
            updates = []
        else:
            updates.append(m)
    assert param_hash(replica) == ps.ledger.hash and ps.ledger.round == 3


@pytest.mark.timeout(300)
def test_a_site_rejoining_over_a_stalled_download_catches_up(tmp_path):
    """Real processes: site b restarts and its download stalls (the worker's own fault injection) long
    enough for a and c to commit at least two rounds; b loads the model of its Welcome, applies
    every update since, and trains on with a hash equal to the PS's. A model of 44 MB, so the PS's
    download is still in flight when the rounds commit (a small one fits in gRPC's buffers).
    Rounds are 2 s compute budgets, not a number of steps, so that the 18 s stall spans a few
    rounds and leaves a few after it however fast or busy the machine is (with fixed steps, a
    faster PS round once let a and c finish all 10 rounds inside the stall). Each site computes a
    quarter of its budget and waits the rest (`--speed-factor 4`): rounds last as long, the machine
    does a quarter of the training (this test is about the download, not the steps). With a 12 s
    stall and 9 rounds, a make test beside a busy core saw rounds of over 6 s: one round in the stall."""
    rounds = 11
    cfg = small_config(sites=["a", "b", "c"], **{
        "model.preset": "small", "train.rounds": rounds, "train.inner_steps": 4, "train.round_budget_s": 2.0,
        "schedule.quorum_wait_s": 0.5, "schedule.deadline_min_s": 30.0, "schedule.deadline_initial_s": 120.0})
    c = Cluster(tmp_path, cfg, site_args=("--speed-factor", "4"))
    try:
        c.start_ps().wait_for("listening on")
        for name in cfg.sites:
            c.start_site(name)
        c.wait_event("round_end", round=0)
        killed = c.kill(c.sites["b"])
        c.start_site("b", "--stall", "download=18")
        events = c.finish(timeout=280)
    finally:
        c.close()
    check_run(events, rounds)
    join = next(e for e in rows(events, "join") if e["site"] == "b" and e["t"] > killed)
    ready = next(e for e in rows(events, "ready") if e["site"] == "b" and e["t"] > join["t"])
    # The rounds b had to apply after loading the model of its Welcome (ready["round"]): a round that
    # was aggregating when b joined is already in that model (a busy machine made that happen).
    during = [e["round"] for e in rows(events, "round_end")
              if join["t"] < e["t"] < ready["t"] and e["round"] >= ready["round"]]
    assert len(during) >= 2, f"the download spanned only rounds {during}"       # the case of the finding
    # A commit that began while the PS was still reading the download out froze it (so b got the
    # model its Welcome announced). How much of the 44 MB the socket buffers took before b's stall
    # varies: once the last chunk is handed over there is nothing left to freeze.
    done = next(e for e in rows(events, "download") if e["site"] == "b" and e["t"] > join["t"] and e["chunks"] == e["of"])
    began = [e["t"] - e["aggregate_s"] for e in rows(events, "round_end")]   # just after each commit's freeze
    if any(join["t"] + 1.0 < t < done["t"] - 1.0 for t in began):
        assert any(join["t"] < e["t"] <= done["t"] for e in rows(events, "downloads_frozen")), (join, done, began)
    b_checks = [e for e in rows(events, "hash_check") if e["site"] == "b" and e["t"] > ready["t"]]
    assert {e["round"] for e in b_checks} >= set(during) and all(e["ok"] for e in b_checks)
    assert any(e["site"] == "b" for e in rows(events, "site_round") if e["t"] > ready["t"])   # and trains again
