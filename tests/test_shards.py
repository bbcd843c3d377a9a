"""A parameter server sharded over processes: tensors split by bytes, one stream per shard, every
shard counting the same deltas (the shards as `wantrain ps --shard` runs them, in this process:
tests/harness.py; a shard killed mid-round is test_recovery.py's)."""

import asyncio
import re

import pytest

from wantrain.errors import ConfigError, ProtocolError
from wantrain.models.shards import ShardLayout, combine_hashes, parse_shard
from wantrain.telemetry import rows

from .cluster import check_run
from .harness import InProcessCluster, run_in_process
from .helpers import small_config


def test_layout_balances_bytes_and_keeps_the_tensor_order():
    sizes = {"emb": 1000, "a": 300, "b": 300, "c": 250, "head": 900, "ln": 10}
    layout = ShardLayout.balanced(sizes, 2)
    # largest first onto the lighter shard: emb 0, head 1, a 1, b 0, c 1, ln 0
    assert layout.tensors == (("emb", "b", "ln"), ("a", "c", "head"))
    assert [layout.shard_of(t) for t in sizes] == [0, 1, 0, 1, 1, 0]
    loads = [sum(sizes[t] for t in names) for names in layout.tensors]
    assert max(loads) - min(loads) <= max(sizes.values()) and sum(loads) == sum(sizes.values())
    assert sorted(t for names in layout.tensors for t in names) == sorted(sizes)
    for names in layout.tensors:                  # each shard in the tensor order
        assert list(names) == [t for t in sizes if t in names]
    assert ShardLayout.balanced(sizes, 1).tensors == (tuple(sizes),)
    assert ShardLayout.balanced(sizes, 2) == layout                    # every party derives the same
    with pytest.raises(ConfigError, match="7 shards"):
        ShardLayout.balanced(sizes, 7)


def test_combined_hash_is_the_hash_with_one_shard():
    assert combine_hashes(["0123456789abcdef"]) == "0123456789abcdef"
    h = combine_hashes(["0123456789abcdef", "fedcba9876543210"])
    assert len(h) == 16 and h != combine_hashes(["fedcba9876543210", "0123456789abcdef"])


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "0/0", "-1/2", "0/65"])
def test_bad_shard_option_is_refused_by_name(text):
    with pytest.raises(ConfigError, match="shard"):
        parse_shard(text)
    assert parse_shard("1/4") == (1, 4)


def _same_rounds(shards: list[list[dict]], rounds: int) -> None:
    """Every shard committed each round once, counting the same sites' deltas."""
    per_shard = [{e["round"]: (tuple(e["sites"]), tuple(e["late_sites"])) for e in rows(ev, "round_end")}
                 for ev in shards]
    assert all(sorted(p) == list(range(rounds)) for p in per_shard), per_shard
    assert all(p == per_shard[0] for p in per_shard), per_shard


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule,fragments", [("sync", 1), ("overlap", 1), ("sync", 2)])
def test_two_shards_train_and_agree(tmp_path, schedule, fragments):
    """Two shards and two sites (in this process, over gRPC: tests/harness.py; a shard killed is
    test_recovery.py's), whole rounds or Streaming DiLoCo's fragments (each shard cuts the whole
    model's tensors, so they agree on a round's fragment)."""
    rounds = 3
    cfg = small_config(**{"sites": ["a", "b"], "num_sites": 2, "train.rounds": rounds, "schedule.mode": schedule,
                          "train.fragments": fragments})
    _, c = run_in_process(cfg, tmp_path / "run", shards=2)
    shards = [c.events(i) for i in range(2)]
    for ev in shards:
        check_run(ev, rounds)
    _same_rounds(shards, rounds)
    assert all(e["sites"] == ["a", "b"] for ev in shards for e in rows(ev, "round_end"))
    sizes = [rows(ev, "site_round")[0]["raw_bytes"] for ev in shards]
    assert min(sizes) > 0.3 * sum(sizes)                   # the model is split, roughly in halves
    # One telemetry stream: shard 1's events reach shard 0's log, in its order; the last ones may come
    # after shard 0 closed (on a busy machine, seen: the last two rounds' round_end)
    relayed = [e for e in rows(shards[0], "shard") if e["shard"] == 1]
    assert [e["event"] for e in relayed] == shards[1][:len(relayed)]
    assert {e["event"]["round"] for e in relayed if e["event"]["kind"] == "round_end"} >= {0}
    assert relayed[0]["event"]["kind"] == "run_start"
    assert all(e["source"] == "reported" for e in relayed)
    assert {s.hash for s in c.sites.values()} == {combine_hashes([ps.ledger.hash for ps in c.shards])}


@pytest.mark.timeout(120)
def test_a_late_delta_is_reconciled_on_both_shards_and_every_replica_agrees(tmp_path):
    """Under the default late_policy (zero-outside) site b's delta of round 1 misses the deadline on
    both shards (its push stalls): each counts it as zeros, applies it once, at a later commit,
    outside the outer momentum, and every replica matches both shards' hashes at every check.
    b's chunks stop 3.3 s after its first, which comes at least 1 s (its compute budget) into the
    round, so they miss the 4 s deadline by a little; a rests 1.5 s before training in rounds 2 and
    3, so the two rounds that may still take b's delta last about 2.5 s each, not 1 s: a busy
    machine's slower transfer must not let a shard commit them before b's delta is in (it would
    then be more than MAX_STALENESS rounds old, and dropped)."""
    rounds = 5
    cfg = small_config(**{"sites": ["a", "b"], "num_sites": 2, "train.rounds": rounds, "schedule.deadline_s": 4.0,
                          "train.round_budget_s": 1.0, "schedule.quorum_wait_s": 1.0})
    assert cfg.recovery.late_policy == "zero-outside"

    async def go() -> InProcessCluster:
        async with InProcessCluster(cfg, tmp_path / "run", shards=2) as c:
            c.start_site("a", stalls=(("train@2", 1.5), ("train@3", 1.5)))
            c.start_site("b", stalls=(("push@1", 3.3),))       # its round-1 chunks stop after the first
            await c.finish(60)
            return c
    c = asyncio.run(go())
    shards = [c.events(i) for i in range(2)]
    for ev in shards:
        check_run(ev, rounds)
        ends = {e["round"]: e for e in rows(ev, "round_end")}
        assert ends[1]["sites"] == ["a"] and ends[1]["substitute"] == "zero" and "b" in ends[1]["substituted"]
        reconciled = [r for r, e in ends.items() for k in e["reconciled"] if k == "b@1"]
        assert len(reconciled) == 1 and reconciled[0] in (2, 3), [(r, e["reconciled"]) for r, e in ends.items()]
    _same_rounds(shards, rounds)
    assert {s.hash for s in c.sites.values()} == {combine_hashes([ps.ledger.hash for ps in c.shards])}


@pytest.mark.timeout(120)
def test_a_site_given_the_shards_out_of_order_says_so(tmp_path):
    cfg = small_config(**{"sites": ["a"], "num_sites": 1, "train.rounds": 1})

    async def site_error(run: str, reorder) -> str:
        async with InProcessCluster(cfg, tmp_path / run, shards=2) as c:
            c.address = reorder(c.address)
            c.start_site("a")
            with pytest.raises(ProtocolError) as e:      # the worker's exit: an error, this line
                await asyncio.wait_for(c.finish(), 60)
            return str(e.value)

    said = asyncio.run(site_error("reversed", lambda a: ",".join(reversed(a.split(",")))))
    assert re.search(r"address [01] of --ps is shard [01] of 2; list the 2 shards' addresses in shard order", said)
    said = asyncio.run(site_error("one", lambda a: a.split(",")[0]))     # one address for a sharded PS
    assert "sharded 2 way(s); this site was given 1 address(es)" in said, said


SITES = ("a", "b", "c")


async def _rounds(ps, deltas: list[dict], order_seed: int) -> None:
    """Sites a, b, c join `ps`; in each round their delta chunks (each site's part for this PS's
    tensors) arrive interleaved in a seeded random order, each site's metrics after its last chunk."""
    import random

    from wantrain.codec import Codec, EncodeStats, encode_arrays
    from wantrain.transport.messages import DELTA, Join, TensorChunk

    from .helpers import drain
    from .test_server import enter, metrics_for

    links = {s: enter(ps, Join(s)) for s in SITES}
    rng = random.Random(order_seed)
    for r, by_site in enumerate(deltas):
        for link in links.values():
            drain(link)
        pending, metrics = [], {}
        for s in SITES:
            stats = EncodeStats()
            chunks, _ = encode_arrays({k: by_site[s][k] for k in ps.shapes}, Codec(ps.cfg.codec), None, stats)
            pending += [(s, TensorChunk(DELTA, r, i, len(chunks), spec, enc)) for i, (spec, enc) in enumerate(chunks)]
            metrics[s] = (len(chunks), metrics_for(ps.cfg, r, stats, len(chunks)))
        rng.shuffle(pending)
        for s, c in pending:
            ps.on_chunk(links[s], c)
            metrics[s] = (metrics[s][0] - 1, metrics[s][1])
            if metrics[s][0] == 0:
                await ps.on_metrics(links[s], metrics[s][1])
        await ps.round_task
        assert ps.ledger.round == r + 1


@pytest.mark.timeout(300)
def test_arrival_order_and_sharding_change_no_bit_of_the_model(tmp_path):
    """Chunks decoded as they arrive, in any order and interleaving of the sites, give the same
    parameters bit for bit; and two shards compute exactly the tensors one PS computes."""
    import asyncio

    import numpy as np

    from wantrain.ps import ParameterServer

    cfg = small_config(**{"sites": list(SITES), "train.rounds": 2})
    rng = np.random.default_rng(0)
    whole = ParameterServer(cfg, run_dir=tmp_path / "probe")
    common = [{k: rng.standard_normal(n) for k, n in whole.shapes.items()} for _ in range(2)]   # deltas agree
    deltas = [{s: {k: ((c[k] + rng.standard_normal(n)) * 1e-3).astype(np.float32) for k, n in whole.shapes.items()}
               for s in SITES} for c in common]
    results = []
    for seed in range(3):
        ps = ParameterServer(cfg, run_dir=tmp_path / f"order{seed}")
        asyncio.run(_rounds(ps, deltas, seed))
        results.append((ps.ledger.hash, {k: v.copy() for k, v in ps.global_model.views.items()}))
    assert len({h for h, _ in results}) == 1
    shard_hashes = []
    for i in range(2):
        ps = ParameterServer(cfg, run_dir=tmp_path / f"shard{i}", shard=(i, 2))
        asyncio.run(_rounds(ps, deltas, 10 + i))
        shard_hashes.append(ps.ledger.hash)
        for k, v in ps.global_model.views.items():
            np.testing.assert_array_equal(v, results[0][1][k])
    layout = ShardLayout.balanced({k: v.size for k, v in results[0][1].items()}, 2)
    assert layout.hashes(results[0][1]) == shard_hashes
    assert combine_hashes(shard_hashes) != results[0][0]           # a sharded model's hash is its own
