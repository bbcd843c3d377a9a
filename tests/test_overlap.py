"""The overlap schedule: sites train the next round ahead while their delta and the update are in
transit, and every replica still hashes the same as the PS's after every round."""

import threading

import numpy as np
import pytest
import torch

from wantrain.data import BatchSampler, load_run_data
from wantrain.models import build_model
from wantrain.models.params import flat_copy, load_flat
from wantrain.site.replica import Replica
from wantrain.site.schedule import Schedule
from wantrain.site.train import InnerLoop, Segment
from wantrain.telemetry import rows

from .cluster import check_run
from .harness import run_in_process
from .helpers import small_config


def _loop(cfg) -> InnerLoop:
    torch.manual_seed(0)
    tok, corpus = load_run_data(cfg.data)
    model = build_model(cfg.model.preset, tok.vocab_size, cfg.model.seed, torch.device("cpu"))
    sampler = BatchSampler(corpus.shard(0, 1), cfg.train.batch_size, cfg.model.block_size, 0)
    return InnerLoop(model, sampler, cfg.train, cfg.model.block_size, torch.device("cpu"))


def _replica(model) -> Replica:
    held = Replica()
    held.build(model, 1, 4096)
    return held


def test_a_segment_in_pieces_takes_the_round_budget_of_steps_once():
    cfg = small_config()
    loop = _loop(cfg)
    seg, stop = Segment(0, 0.0), threading.Event()
    stop.set()
    loop.train(seg, stop)                         # stopped before its first step
    assert seg.steps == 0 and not seg.done(loop.t)
    stop.clear()
    loop.train(seg, stop)
    assert seg.steps == loop.t.inner_steps and seg.done(loop.t) and len(seg.losses) == seg.steps
    loop.train(seg, stop)                         # a finished round takes no more steps
    assert seg.steps == loop.t.inner_steps and loop.sampler.batches_drawn == loop.t.inner_steps


@pytest.mark.timeout(60)
def test_steps_ahead_move_onto_the_new_global_model():
    """Round 0 from the replica; the steps of round 1 taken ahead start where round 0 ended and are
    shifted by (new global - that end point) once the update is in; the delta of round 1 is the new
    global model minus where round 1 ended."""
    import asyncio

    cfg = small_config()
    loop = _loop(cfg)
    held = _replica(loop.model)
    replica = held.arrays
    sched = Schedule(loop, overlap=True, budget_s=0.0)

    async def scenario():
        delta0, info0 = await sched.round(0, 0.0, held)
        assert info0["steps_ahead"] == 0 and info0["steps"] == loop.t.inner_steps
        end0 = {k: replica[k] - delta0[k] for k in replica}
        assert sched.ahead is not None and sched.ahead.round == 1 and sched.base is not None
        # The "update": any change of the global model; here half of the round's delta, moved back.
        for k in replica:
            replica[k] -= np.float32(0.5) * delta0[k]
        await sched._pause()                      # hold the steps ahead still to look at them ...
        await asyncio.to_thread(loop.train, sched.ahead)    # ... after they took the whole round
        before = flat_copy(loop.model)
        sched._move(replica, sched.base)
        moved = flat_copy(loop.model)
        for k in replica:   # parameters + (new global - end of round 0), nothing else
            np.testing.assert_allclose(moved[k], before[k] + (replica[k] - end0[k]), rtol=0, atol=1e-6)
        sched.base = None                         # moved: round 1 goes on from these steps
        delta1, info1 = await sched.round(1, 0.0, held)
        assert info1["steps"] == info1["steps_ahead"] == loop.t.inner_steps
        end1 = flat_copy(loop.model)
        for k in replica:
            np.testing.assert_array_equal(delta1[k], replica[k] - end1[k])
        assert sched.ahead is not None and sched.ahead.round == 2     # running, from the end of round 1
        await sched.moved_to(replica)             # the update of round 1 (no change here) is in
        assert sched.base is None
        await sched.discard()
        assert sched.ahead is None and sched._task is None

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_sync_starts_every_round_from_the_replica():
    import asyncio

    cfg = small_config()
    loop = _loop(cfg)
    held = _replica(loop.model)
    sched = Schedule(loop, overlap=False, budget_s=0.0)

    async def scenario():
        await sched.round(0, 0.0, held)
        assert sched.ahead is None
        drifted = flat_copy(loop.model)            # where round 0 ended: not where round 1 starts
        load_flat(loop.model, drifted)
        _, info = await sched.round(1, 0.0, held)
        assert info["steps_ahead"] == 0

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_overlap_run_keeps_every_replica_identical(tmp_path):
    """A PS and three sites (in this process, over gRPC: tests/harness.py) with the overlap schedule.
    The PS stalls 1.5 s in every round's aggregation, so each site has time to train ahead
    (steps_ahead > 0) while it waits for the update; every site's hash equals the PS's after every
    round, and the loss falls."""
    cfg = small_config(**{"schedule.mode": "overlap", "train.rounds": 5, "train.inner_steps": 6,
                          "model.preset": "tiny"})       # tiny: its loss falls in 5 such rounds
    events, _ = run_in_process(cfg.replace(sites=["a", "b", "c"]), tmp_path / "run", stalls={"aggregate": 1.5})
    check_run(events, 5)
    checks = rows(events, "hash_check")
    assert len(checks) == 3 * 5 and all(ch["ok"] for ch in checks)
    site_rounds = rows(events, "site_round")
    assert all(s["steps"] == 6 and 0 <= s["steps_ahead"] <= 6 for s in site_rounds)
    assert all(s["steps_ahead"] == 0 for s in site_rounds if s["round"] == 0)     # nothing to be ahead of
    later = [s for s in site_rounds if s["round"] > 0]
    assert later and all(s["steps_ahead"] >= 1 for s in later), [(s["site"], s["round"], s["steps_ahead"])
                                                                 for s in later]
    start, ends = rows(events, "run_start")[0], rows(events, "round_end")
    assert ends[-1]["val_loss"] < start["val_loss"] - 0.3


def test_demo_command_line_chooses_the_schedule():
    from wantrain.commands.cli import build_parser
    from wantrain.commands.demo import demo_config
    from wantrain.errors import ConfigError

    cfg = demo_config(build_parser().parse_args(["demo", "--schedule", "overlap", "--round-budget", "3"]))
    assert cfg.schedule.mode == "overlap" and cfg.train.round_budget_s == 3
    assert demo_config(build_parser().parse_args(["demo"])).schedule.mode == "sync"
    with pytest.raises(ConfigError, match="schedule.mode must be one of"):
        small_config(**{"schedule.mode": "eager"})
