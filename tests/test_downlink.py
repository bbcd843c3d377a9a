"""The downlink's tail (recovery.downlink_budget; ps/downlink.py): an update sent as a head before
the result and a tail after the next RoundStart, patched into the replica and into the round
training from it. Unit tests, then a run over real gRPC in this process (tests/harness.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from wantrain.codec import Codec, plan_chunks
from wantrain.config import CodecConfig
from wantrain.errors import ProtocolError
from wantrain.transport.messages import UPDATE, RoundResult, TensorChunk
from wantrain.models import build_model
from wantrain.transport.roles import roles_of
from wantrain.ps.downlink import split_update, update_energies
from wantrain.models.params import flat_copy, named_params
from wantrain.site.replica import Replica
from wantrain.site.schedule import Schedule
from wantrain.site.train import InnerLoop
from wantrain.data import BatchSampler
from wantrain.telemetry import rows

from .cluster import check_run
from .harness import run_in_process
from .helpers import small_config


def _update(model: torch.nn.Module, seed: int, round_: int = 0, chunk_bytes: int = 2048) -> list[TensorChunk]:
    """An int8 update of `model`'s shapes, its tensors at very different scales (as real ones are)."""
    rng = np.random.default_rng(seed)
    sizes = {k: p.numel() for k, p in named_params(model).items()}
    codec = Codec(CodecConfig(chunk_bytes=chunk_bytes))
    plan = plan_chunks(sizes, codec.cfg.chunk_elements())
    scale = {k: 10.0 ** rng.uniform(-4, -1) for k in sizes}
    return [TensorChunk(UPDATE, round_, i, len(plan), spec,
                        codec.encode((scale[spec.tensor] * rng.standard_normal(spec.length)).astype(np.float32))[0])
            for i, spec in enumerate(plan)]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model("tiny", 96, 0)


def test_the_tail_holds_at_most_the_budget_no_critical_chunk_most_energetic_first(model):
    update = _update(model, 1)
    roles = roles_of({k: tuple(p.shape) for k, p in named_params(model).items()})
    energies = update_energies(update)
    total = sum(energies)
    for budget in (0.0, 0.01, 0.05, 0.3):
        head, tail = split_update(update, energies, roles, budget)
        assert sorted(c.index for c in head + tail) == list(range(len(update)))
        assert [c.index for c in head] == sorted(c.index for c in head)           # the head in order
        tail_e = [energies[c.index] for c in tail]
        assert sum(tail_e) <= budget * total
        assert tail_e == sorted(tail_e, reverse=True)
        assert all(roles[c.spec.tensor] != "critical" for c in tail)
        # greedy from the least energetic: the head's weakest non-critical chunk would not fit
        weakest = min((energies[c.index] for c in head if roles[c.spec.tensor] != "critical"), default=np.inf)
        assert sum(tail_e) + weakest > budget * total
        if budget == 0.0:
            assert tail == []
        if budget == 0.3:       # energy is concentrated: a small share of it is a large share of the bytes
            assert len(tail) > len(update) // 4, (len(tail), len(update))


def _replica(model) -> Replica:
    r = Replica("s")
    r.build(model, 1, CodecConfig(chunk_bytes=2048).chunk_elements())
    r._rehash()
    return r


def test_a_head_then_its_tail_patched_in_is_bit_identical_to_the_whole_update(model):
    update = _update(model, 2)
    roles = roles_of({k: tuple(p.shape) for k, p in named_params(model).items()})
    head, tail = split_update(update, update_energies(update), roles, 0.3)
    whole = _replica(model)
    whole.apply(list(update), RoundResult(0, "h"))
    parts = _replica(model)
    parts.apply(head, RoundResult(0, whole.hash, tail_chunks=len(tail)))
    assert not parts.whole and parts.round == 1 and parts.hash == "" and parts.promised_hash == whole.hash
    with pytest.raises(ProtocolError, match="before the last"):        # the next result cannot overtake it
        parts.apply([], RoundResult(1, whole.hash))
    for c in tail:
        parts.patch(c)
    assert parts.whole and parts.hash == whole.hash
    assert all(np.array_equal(parts.arrays[k], whole.arrays[k]) for k in whole.arrays)
    with pytest.raises(ProtocolError, match="not one this site awaits"):     # nothing more is awaited
        parts.patch(tail[0])


def test_a_result_whose_head_and_tail_do_not_add_up_is_refused(model):
    update = _update(model, 3)
    r = _replica(model)
    with pytest.raises(ProtocolError, match="expected"):
        r.apply(update[:-2], RoundResult(0, "h", tail_chunks=1))
    with pytest.raises(ProtocolError, match="expected"):
        r.apply(update[:-1] + update[:1], RoundResult(0, "h", tail_chunks=1))     # a chunk twice


def _schedule(model_seed: int = 0) -> tuple[Schedule, InnerLoop]:
    cfg = small_config(**{"train.inner_steps": 3, "train.warmup_steps": 0})
    model = build_model("tiny", 96, model_seed)
    tokens = np.random.default_rng(0).integers(0, 96, 5000).astype(np.int64)
    inner = InnerLoop(model, BatchSampler(tokens, 2, 16, 0), cfg.train, 16, torch.device("cpu"))
    return Schedule(inner, False, 0.0), inner


def test_a_tail_patched_into_a_training_round_never_enters_its_delta(model):
    # The same round twice: from the whole update, and from its head with the tail landing after
    # the round started (taken before its first step). The steps, the end and the delta agree bit
    # for bit: the patch went into the parameters and into the start alike.
    update = _update(model, 4)
    roles = roles_of({k: tuple(p.shape) for k, p in named_params(model).items()})
    head, tail = split_update(update, update_energies(update), roles, 0.3)
    assert tail

    def run(split: bool) -> tuple[dict, dict]:
        schedule, inner = _schedule()
        replica = _replica(inner.model)
        if split:
            replica.apply(head, RoundResult(0, "", tail_chunks=len(tail)))
        else:
            replica.apply(list(update), RoundResult(0, ""))
        patched = []

        def train(seg, stop, start_hash, patch):     # the tail lands after the load, before step 1
            if split and not patched:
                for c in tail:
                    schedule.patch(replica, c)
                patched.append(True)
            InnerLoop.train(inner, seg, stop, start_hash, patch)

        inner.train = train
        delta, _ = asyncio.run(schedule.round(1, 0.0, replica))
        assert replica.whole
        return delta, flat_copy(inner.model)

    (d1, e1), (d2, e2) = run(False), run(True)
    assert all(np.array_equal(d1[k], d2[k]) for k in d1)
    assert all(np.array_equal(e1[k], e2[k]) for k in e1)


@pytest.mark.timeout(180)
def test_rounds_whose_update_comes_in_a_head_and_a_tail_keep_every_replica_equal(tmp_path):
    # Two sites over real gRPC, a third of each update's energy allowed in its tail: every round
    # after the warm-up but the last is split, the sites train while its tail lands, and every site
    # reports every round's hash, equal to the PS's.
    rounds = 4
    cfg = small_config(num_sites=2, sites=["a", "b"], **{
        "train.rounds": rounds, "train.inner_steps": 4, "train.warmup_steps": 0, "recovery.reliable_rounds": 1,
        "schedule.quorum_wait_s": 1.0, "recovery.downlink_budget": 0.3})
    events, _ = run_in_process(cfg, tmp_path / "run", timeout_s=150)
    check_run(events, rounds)
    splits = rows(events, "update_split")
    assert [e["round"] for e in splits] == [1, 2], splits
    assert all(e["tail_chunks"] > 0 and e["tail_energy"] <= 0.3 for e in splits), splits
    for site in ("a", "b"):
        assert sorted(e["round"] for e in rows(events, "hash_check") if e["site"] == site) == list(range(rounds))
