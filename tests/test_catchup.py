"""A site that comes back holding the model of an earlier round gets the updates it missed, not the model."""


import numpy as np
import pytest

from wantrain.codec import ChunkSpec, Codec
from wantrain.config import CodecConfig
from wantrain.transport.messages import UPDATE, RoundResult, TensorChunk
from wantrain.ps.catchup import Catchup
from wantrain.telemetry import rows

from .cluster import check_run
from .harness import reset_b_while_it_pushes
from .helpers import small_config


def _update(round_: int, n: int = 1000) -> tuple[list[TensorChunk], RoundResult]:
    enc, _ = Codec(CodecConfig(mode="fp32")).encode(np.full(n, round_, np.float32))
    return [TensorChunk(UPDATE, round_, 0, 1, ChunkSpec("w", 0, n), enc)], RoundResult(round_, f"{round_:016x}")


def test_catchup_keeps_recent_rounds_within_its_bytes():
    kept = Catchup(next_round=3, max_bytes=2 * 4000)      # two rounds of 4000 bytes
    assert kept.since(3) == [] and kept.since(2) is None and kept.since(4) is None
    for r in (3, 4, 5):
        kept.add(r, *_update(r))
    assert kept.since(3) is None                          # dropped: a full download instead
    msgs = kept.since(4)
    assert [type(m).__name__ for m in msgs] == ["TensorChunk", "RoundResult"] * 2
    assert [m.round for m in msgs] == [4, 4, 5, 5]
    assert [m.round for m in kept.since(5)] == [5, 5] and kept.since(6) == []
    assert kept.since(7) is None and kept.wire_bytes_since(4) == 8000
    kept.add(9, *_update(9))                              # a gap: nothing older is usable
    assert kept.since(5) is None and [m.round for m in kept.since(9)] == [9, 9]


@pytest.mark.timeout(300)
def test_a_site_whose_link_resets_gets_only_the_rounds_it_missed(tmp_path):
    """b's connection is reset while it pushes round 2, and it stays away 8 s (a stall): a and c
    commit round 2 without it, then wait for it (a long quorum wait). b comes back holding the model
    of round 2 and receives round 2's update, not the model; every replica agrees to the end."""
    rounds = 5
    cfg = small_config(**{"sites": ["a", "b", "c"], "train.rounds": rounds, "train.inner_steps": 10,
                          "schedule.quorum_wait_s": 60.0, "schedule.deadline_min_s": 15.0,
                          "schedule.deadline_initial_s": 60.0})
    events, t_reset = reset_b_while_it_pushes(cfg, tmp_path / "run", "push@2", 8.0)
    check_run(events, rounds)
    back = [e for e in rows(events, "join") if e["site"] == "b" and e["t"] > t_reset]
    assert len(back) == 1 and back[0]["resumed"] and back[0]["catchup"], back
    (caught,) = [e for e in rows(events, "catchup") if e["site"] == "b"]
    assert caught["round"] == 2 and caught["rounds"] == 1, caught        # round 2 committed without b
    assert 0 < caught["mb"] < caught["model_mb"]
    assert not [e for e in rows(events, "download") if e["site"] == "b" and e["t"] > t_reset]
    mine = {e["round"]: e["ok"] for e in rows(events, "hash_check") if e["site"] == "b"}
    assert all(mine.get(r) for r in range(rounds)), mine                   # round 2's update included
    assert 2 not in {e["round"] for e in rows(events, "site_round") if e["site"] == "b"}
