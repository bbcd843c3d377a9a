"""Streaming DiLoCo's fragments (train.fragments, wantrain/outer/fragments.py): a round synchronizes one
fragment of the tensors, the PS moves only those (and only their momentum), a site trains the rest
on and sends a delta that is zero outside its round's fragment; a run keeps every replica equal."""

import asyncio

import numpy as np
import pytest

from wantrain.outer.aggregate import Contribution
from wantrain.codec import Extracted
from wantrain.config import RunConfig
from wantrain.errors import ConfigError
from wantrain.outer.fragments import fragments, synced
from wantrain.transport.messages import Join
from wantrain.ps import ParameterServer
from wantrain.models.params import flat_copy
from wantrain.site.schedule import Schedule
from wantrain.telemetry import rows

from .cluster import check_run
from .harness import run_in_process
from .helpers import drain, small_config
from .test_overlap import _loop, _replica
from .test_server import delta_chunks, enter


def test_fragments_cut_the_tensors_in_order_into_parts_of_about_equal_size():
    sizes = {"wte": 400, "h0.w": 100, "h0.b": 10, "h1.w": 100, "h1.b": 10, "h2.w": 100, "ln_f": 10, "head": 300}
    parts = fragments(sizes, 3)
    assert [sorted(p) for p in parts] == [["wte"], ["h0.b", "h0.w", "h1.b", "h1.w", "h2.w"], ["head", "ln_f"]]
    assert [sum(sizes[k] for k in p) for p in parts] == [400, 320, 310]
    flat = [k for p in parts for k in sizes if k in p]
    assert flat == list(sizes)                                 # contiguous, each tensor once, in order
    assert len(fragments(sizes, 8)) == 8 and all(fragments(sizes, 8))     # one tensor each, none empty
    assert synced(sizes, 1, 5) is None and synced(sizes, 3, 4) == parts[1]
    with pytest.raises(ConfigError, match="train.fragments must be 1 to the model's 8 tensors, got 9"):
        fragments(sizes, 9)
    with pytest.raises(ConfigError, match="train.fragments.*schedule.mode 'sync'"):
        RunConfig().replace(**{"train.fragments": 2, "schedule.mode": "overlap"})
    with pytest.raises(ConfigError, match="recovery.late_policy.*'stale'.*another fragment"):
        RunConfig().replace(**{"train.fragments": 2, "recovery.late_policy": "stale"})


@pytest.mark.timeout(120)
def test_a_round_moves_only_its_fragment_and_only_its_momentum(tmp_path):
    async def scenario():
        ps = ParameterServer(small_config(num_sites=1, **{"train.rounds": 3, "train.fragments": 2}), run_dir=tmp_path)
        a = enter(ps, Join("a"))
        drain(a)
        before = {k: v.copy() for k, v in ps.global_model.views.items()}
        msgs, m = delta_chunks(ps, 0, scale=1e-2)           # a delta that is not zero anywhere
        for c in msgs:
            ps.on_chunk(a, c)
        await ps.on_metrics(a, m)
        await ps.round_task
        mine, other = fragments(ps.global_model.sizes, 2)
        assert all(not np.array_equal(ps.global_model.views[k], before[k]) for k in mine)
        assert all(np.array_equal(ps.global_model.views[k], before[k]) for k in other)
        momentum = ps.global_model.outer.state_dict()
        assert all(np.any(momentum[k]) for k in mine) and not any(np.any(momentum[k]) for k in other)

    asyncio.run(scenario())


def _parts(values, plan):
    return [Extracted(values[s.tensor][s.offset: s.offset + s.length].copy(), None, 0) for s in plan]


@pytest.mark.timeout(120)
def test_a_late_delta_moves_its_own_fragment_when_a_later_round_commits_outside_the_momentum(tmp_path):
    """Round 1 synchronizes the second fragment; a delta late from round 0 (the first fragment's
    round) moves the first by -lr x its share, no momentum, and nothing of it reaches the second
    (not even values a site should not have sent there)."""
    cfg = small_config(num_sites=2, **{"train.fragments": 2, "codec.mode": "fp32"})
    models = [ParameterServer(cfg, run_dir=tmp_path / name).global_model for name in ("with", "without")]
    first, second = fragments(models[0].sizes, 2)
    rng = np.random.default_rng(3)
    now = {k: (rng.standard_normal(n) * 1e-3).astype(np.float32) for k, n in models[0].shapes.items()}
    late = {k: (rng.standard_normal(n) * 1e-3).astype(np.float32) for k, n in models[0].shapes.items()}
    before = {k: v.copy() for k, v in models[0].views.items()}
    plan = models[0].plan
    models[0].apply(1, {"a": Contribution(_parts(now, plan), 1.0)}, {"b@0": Contribution(_parts(late, plan), 0.5)},
                    "zero")
    models[1].apply(1, {"a": Contribution(_parts(now, plan), 1.0)}, None, "zero")
    lr = cfg.train.outer_lr
    for k in first:
        np.testing.assert_allclose(models[0].views[k] - before[k], -lr * 0.5 * late[k], rtol=1e-4, atol=1e-7)
        assert np.array_equal(models[1].views[k], before[k])
        assert not np.any(models[0].outer.buf.get(k, 0))
    for k in second:
        assert np.array_equal(models[0].views[k], models[1].views[k]) and not np.array_equal(before[k],
                                                                                             models[1].views[k])


@pytest.mark.timeout(60)
def test_a_site_trains_the_other_fragments_on_and_sends_only_its_rounds():
    """Round 0 sends fragment 0 only; round 1 starts from the replica for fragment 0 (just synced)
    and from where round 0 ended for fragment 1, whose delta then spans both rounds' steps."""
    cfg = small_config(**{"train.fragments": 2})
    loop = _loop(cfg)
    held = _replica(loop.model)
    sched = Schedule(loop, overlap=False, budget_s=0.0, fragments=2)
    first, second = fragments(sched.sizes, 2)

    async def scenario():
        start = {k: v.copy() for k, v in held.arrays.items()}
        delta0, _ = await sched.round(0, 0.0, held)
        assert all(np.any(delta0[k]) for k in first) and not any(np.any(delta0[k]) for k in second)
        end0 = flat_copy(loop.model)
        assert sched._reloaded(1) == first
        sched._load(held, first)                              # what round 1 starts from
        loaded = flat_copy(loop.model)
        assert all(np.array_equal(loaded[k], held.arrays[k]) for k in first)
        assert all(np.array_equal(loaded[k], end0[k]) and not np.array_equal(end0[k], start[k]) for k in second)
        delta1, _ = await sched.round(1, 0.0, held)           # the PS's update of round 0 was zero here
        end1 = flat_copy(loop.model)
        assert not any(np.any(delta1[k]) for k in first)
        for k in second:          # the replica (unchanged since round 0's start) minus round 1's end
            np.testing.assert_array_equal(delta1[k], start[k] - end1[k])
            assert not np.array_equal(end1[k], end0[k])
        # A late delta of round 0, applied when round 1 commits, moved the first fragment: round 2
        # reloads the second (just synced) and moves the first's training by as much.
        moved = {k: (np.full_like(held.arrays[k], 1e-2)) for k in first}
        for k in first:
            held.arrays[k] += moved[k]
        sched._load(held, sched._reloaded(2))
        loaded = flat_copy(loop.model)
        for k in first:
            np.testing.assert_allclose(loaded[k], end1[k] + moved[k], rtol=1e-6, atol=1e-7)
        assert all(np.array_equal(loaded[k], held.arrays[k]) for k in second)
        sched.reload()            # a Welcome: the next round loads the whole replica again
        assert sched._reloaded(2) is None and sched._reloaded(1) is None

    asyncio.run(scenario())


@pytest.mark.timeout(180)
def test_a_streaming_run_keeps_every_replica_equal_and_learns(tmp_path):
    """A PS and three sites over gRPC (tests/harness.py), 2 fragments: every hash check holds and the
    validation loss falls."""
    cfg = small_config(**{"train.fragments": 2, "train.rounds": 6, "train.inner_steps": 4})
    events, _ = run_in_process(cfg.replace(sites=["a", "b", "c"]), tmp_path / "run")
    check_run(events, 6)
    checks = rows(events, "hash_check")
    assert len(checks) == 3 * 6 and all(ch["ok"] for ch in checks)
    start, ends = rows(events, "run_start")[0], rows(events, "round_end")
    assert ends[-1]["val_loss"] < start["val_loss"] - 0.3
