"""A parameter server sharded over processes: tensors split by bytes, one stream per shard, and a
run that survives the kill of a shard mid-round with every committed round once and replicas equal."""

import re

import pytest

from wantrain.errors import ConfigError
from wantrain.shards import ShardLayout, combine_hashes, parse_shard
from wantrain.telemetry import rows

from .cluster import ShardedCluster, check_run
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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", ["sync", "overlap"])
def test_two_shards_train_and_agree(tmp_path, schedule):
    rounds = 3
    cfg = small_config(**{"sites": ["a", "b"], "num_sites": 2, "train.rounds": rounds, "train.schedule": schedule})
    c = ShardedCluster(tmp_path, cfg, shards=2)
    try:
        shards = c.start().finish()
    finally:
        c.close()
    for ev in shards:
        check_run(ev, rounds)
    _same_rounds(shards, rounds)
    assert all(e["sites"] == ["a", "b"] for ev in shards for e in rows(ev, "round_end"))
    sizes = [rows(ev, "site_round")[0]["raw_bytes"] for ev in shards]
    assert min(sizes) > 0.3 * sum(sizes)                   # the model is split, roughly in halves
    # One telemetry stream: shard 1's events reach shard 0's log (the last ones may come after it closed).
    relayed = [e for e in rows(shards[0], "shard") if e["shard"] == 1]
    assert {e["event"]["round"] for e in relayed if e["event"]["kind"] == "round_end"} >= set(range(rounds - 1))
    assert all(e["source"] == "reported" for e in relayed)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("killed", [0, 1])
def test_a_shard_killed_mid_round_loses_and_doubles_no_round(tmp_path, killed):
    """A shard is killed (SIGKILL) while deltas of round 2 arrive and restarted from its folder.
    Each shard commits every round exactly once, counting the same three sites' deltas (the sites
    replay to the restarted shard what it lost), and every replica agrees with both shards."""
    rounds = 5
    cfg = small_config(**{"sites": ["a", "b", "c"], "train.rounds": rounds, "train.inner_steps": 20,
                          "train.quorum_wait_s": 60.0, "train.deadline_min_s": 30.0,
                          "train.deadline_initial_s": 60.0})
    c = ShardedCluster(tmp_path, cfg, shards=2)
    try:
        c.start()
        c.wait_shard_event(killed, "site_round", round=2)
        c.kill(c.shards[killed])
        c.start_shard(killed).wait_for("listening on")
        shards = c.finish()
    finally:
        c.close()
    for ev in shards:
        check_run(ev, rounds)
    _same_rounds(shards, rounds)
    assert all(e["sites"] == ["a", "b", "c"] for ev in shards for e in rows(ev, "round_end"))   # no delta lost
    (restart,) = rows(shards[killed], "restart")
    assert restart["round"] in (2, 3)
    assert not rows(shards[1 - killed], "restart")


@pytest.mark.timeout(120)
def test_a_site_given_the_shards_out_of_order_says_so(tmp_path):
    cfg = small_config(**{"sites": ["a"], "num_sites": 1, "train.rounds": 1})
    c = ShardedCluster(tmp_path, cfg, shards=2)
    try:
        for i in range(2):
            c.start_shard(i).wait_for("listening on")
        c.ports.reverse()
        site = c.start_site("a")
        assert site.p.wait(60) != 0
        assert re.search(r"address [01] of --ps is shard [01] of 2; list the 2 shards' addresses in shard order",
                         site.text()), site.text()[-2000:]
        c.ports = [c.ports[1]]                  # one address for a sharded PS
        site = c.start_site("a")
        assert site.p.wait(60) != 0
        assert "sharded 2 way(s); this site was given 1 address(es)" in site.text()
    finally:
        c.close()
