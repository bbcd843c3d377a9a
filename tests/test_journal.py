"""The PS's journal: a restarted PS replays the rounds committed after its last full checkpoint and
stands exactly where the old one stood, parameters, outer momentum and downlink residual bit for bit."""

import asyncio
import json

import numpy as np
import pytest

from wantrain.errors import CheckpointError
from wantrain.transport.messages import HashReport, Join
from wantrain.ps import ParameterServer
from wantrain.ps.journal import JOURNAL_DIR
from wantrain.ps.rounds import MAX_STALENESS

from .helpers import drain, small_config
from .test_server import delta_chunks, enter


async def play_round(ps, links, seed):
    """Every site sends a delta of its own for the current round; returns once it has committed."""
    for i, link in enumerate(links):
        drain(link)
        msgs, m = delta_chunks(ps, ps.ledger.round, seed=seed + i)
        for c in msgs:
            ps.on_chunk(link, c)
        await ps.on_metrics(link, m)
    await ps.round_task
    await ps.checkpoints.settled()


def state_of(ps):
    return ps.ledger.round, ps.ledger.hash, ps.global_model.state_dict(), dict(ps.ledger.data_positions), ps.screen.state_dict()


def assert_same_state(a, b):
    assert a[:2] == b[:2]
    for part in ("params_np", "outer_np", "feedback_np"):
        assert a[2][part].keys() == b[2][part].keys() and a[2][part], part
        for k in a[2][part]:
            assert np.array_equal(a[2][part][k], b[2][part][k]), (part, k)
    assert a[3:] == b[3:]


@pytest.mark.timeout(120)
def test_a_restarted_ps_replays_the_journal_bit_identically(tmp_path):
    cfg = small_config(num_sites=2, **{"train.rounds": 6, "train.checkpoint_every": 3})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        for r in range(2):
            await play_round(ps, [a, b], seed=10 * r)
        # Rounds 0 and 1 are in the journal only; the full checkpoint is still the start's.
        state = state_of(ps)
        again = ParameterServer(cfg, run_dir=tmp_path)
        assert_same_state(state_of(again), state)
        assert again.ledger.round == 2 and again.ledger.hashes == ps.ledger.hashes

        await play_round(ps, [a, b], seed=20)          # round 2 makes round 3 a full checkpoint ...
        journal = tmp_path / JOURNAL_DIR
        commits = sorted(p.name for p in journal.glob("commit-*"))
        assert commits == []                           # ... which drops what it holds
        deltas = sorted(p.name for p in journal.glob("delta-*"))
        assert all(int(n.split("-")[1]) >= 3 - MAX_STALENESS - 1 for n in deltas)
        await play_round(ps, [a, b], seed=30)
        state = state_of(ps)
        assert_same_state(state_of(ParameterServer(cfg, run_dir=tmp_path)), state)

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_round_committed_but_not_logged_is_logged_by_the_replay(tmp_path):
    """A PS stopped between a round's commit (its journal record) and its round_end event: the PS
    that replays the round logs the event as the commit measured it, once, marked replayed."""
    cfg = small_config(num_sites=2, **{"train.rounds": 6, "train.checkpoint_every": 3})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        for r in range(2):
            await play_round(ps, [a, b], seed=10 * r)
        ps.recorder.close()
        log = tmp_path / "events.jsonl"
        lines = log.read_text().splitlines(keepends=True)
        (cut,) = [i for i, ln in enumerate(lines) if '"kind":"round_end"' in ln and '"round":1,' in ln]
        lost = json.loads(lines[cut])
        log.write_text("".join(lines[:cut]))             # the stop came before round 1's event was written
        again = ParameterServer(cfg, run_dir=tmp_path)
        again.recorder.close()
        ends = [json.loads(ln) for ln in log.read_text().splitlines() if '"kind":"round_end"' in ln]
        assert [e["round"] for e in ends] == [0, 1] and ends[1]["replayed"] is True and "replayed" not in ends[0]
        skip = ("v", "seq", "t", "elapsed_s", "replayed", "round_s")     # (round_s: as of the commit's start)
        assert 0 < ends[1]["round_s"] <= lost["round_s"]
        assert {k: v for k, v in ends[1].items() if k not in skip} == {k: v for k, v in lost.items() if k not in skip}
        ParameterServer(cfg, run_dir=tmp_path).recorder.close()          # a second restart logs it no more
        assert sum('"kind":"round_end"' in ln for ln in log.read_text().splitlines()) == 2

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_updates_the_controller_sent_in_int4_replay_bit_identically(tmp_path):
    """Once a site is link-bound the adaptive controller sends every update in int4 + Huffman
    (ps/controller.py); the journal records that, and a restarted PS replays those rounds exactly."""
    from wantrain.ps.controller import SMALL_CODEC

    cfg = small_config(num_sites=2, **{"train.rounds": 6, "train.checkpoint_every": 10, "train.round_budget_s": 1.0,
                                       "schedule.controller": "adaptive"})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        await play_round(ps, [a, b], seed=0)
        ps.controller.link_bound.add("b")           # as its plan does for a link that costs too much
        for r in (1, 2):
            await play_round(ps, [a, b], seed=10 * r)
        records = [json.loads((tmp_path / JOURNAL_DIR / f"commit-{r:06d}.json").read_text()) for r in range(3)]
        assert [rec.get("update_mode", "") for rec in records] == ["", SMALL_CODEC, SMALL_CODEC]
        sent = [m for m in ps.catchup.since(2) if hasattr(m, "data")]                  # round 2's update as sent
        assert sent and {m.data.encoding for m in sent} == {SMALL_CODEC}
        state = state_of(ps)
        assert_same_state(state_of(ParameterServer(cfg, run_dir=tmp_path)), state)

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_journal_that_does_not_replay_to_its_hash_is_refused(tmp_path):
    cfg = small_config(num_sites=1, **{"train.rounds": 4, "train.checkpoint_every": 10})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a = enter(ps, Join("a"))
        await play_round(ps, [a], seed=1)
        await play_round(ps, [a], seed=2)

    asyncio.run(scenario())
    record = tmp_path / JOURNAL_DIR / "commit-000001.json"
    good = json.loads(record.read_text())
    # Halving the one delta (one site: its weight would cancel) gives other parameters.
    record.write_text(json.dumps({**good, "contributions": [{**good["contributions"][0], "factor": 0.5}]}))
    with pytest.raises(CheckpointError, match="replaying round 1 gives parameters hashing to"):
        ParameterServer(cfg, run_dir=tmp_path)
    record.write_text(json.dumps({**good, "run_id": "someone-else"}))
    with pytest.raises(CheckpointError, match="belongs to run someone-else"):
        ParameterServer(cfg, run_dir=tmp_path)
    record.write_text(json.dumps(good))
    assert ParameterServer(cfg, run_dir=tmp_path).ledger.round == 2


@pytest.mark.timeout(120)
def test_a_failed_full_checkpoint_loses_nothing(tmp_path, monkeypatch):
    """The disk refuses the full state (here: save_checkpoint raises, as on a full disk): the PS says
    so and goes on, and the journal still holds every round since the last good checkpoint."""
    cfg = small_config(num_sites=1, **{"train.rounds": 4, "train.checkpoint_every": 1})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)       # the start's full state is written
        a = enter(ps, Join("a"))

        def full_disk(*args, **kwargs):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr("wantrain.ps.state.save_checkpoint", full_disk)
        for r in range(3):
            await play_round(ps, [a], seed=r)
        return ps

    ps = asyncio.run(scenario())
    errors = [json.loads(e) for e in ps.recorder.events if '"checkpoint_failed"' in e]
    assert [e["message"].split(":")[0] for e in errors] == [f"checkpoint of round {r}" for r in (1, 2, 3)]
    assert sorted(p.name for p in (tmp_path / JOURNAL_DIR).glob("commit-*")) == \
        [f"commit-00000{r}.json" for r in range(3)]
    monkeypatch.undo()
    assert_same_state(state_of(ParameterServer(cfg, run_dir=tmp_path)), state_of(ps))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["stale", "zero-outside"])
def test_a_late_delta_counted_rounds_later_is_replayed(tmp_path, policy):
    """A delta of round 0 that missed its deadline counts in round 1: with the "stale" policy in the
    mean, at a discounted weight; with "zero-outside" outside the outer momentum, at the share of
    round 0 it was counted as zeros at. The journal names it by the round it was for, and replay
    finds it (and the zeros)."""
    cfg = small_config(num_sites=2, **{"train.rounds": 4, "schedule.deadline_s": 4.0, "recovery.late_policy": policy,
                                       "train.checkpoint_every": 10})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        late_msgs, late_metrics = delta_chunks(ps, 0, seed=7)   # encoded before the clock runs
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        a_msgs, a_metrics = delta_chunks(ps, 0, seed=1)
        for c in a_msgs:
            ps.on_chunk(a, c)
        await ps.on_metrics(a, a_metrics)
        await asyncio.sleep(4.3)                                # round 0 closes without b
        await ps.round_task
        for c in late_msgs:
            ps.on_chunk(b, c)
        await ps.on_metrics(b, late_metrics)                   # b's delta of round 0, late
        ps.on_hash_report(b, HashReport(0, ps.ledger.hash))           # b applied round 0: it is in round 1
        await play_round(ps, [a, b], seed=20)                  # round 1 counts it too
        return ps

    ps = asyncio.run(scenario())
    record = json.loads((tmp_path / JOURNAL_DIR / "commit-000001.json").read_text())
    assert [(c["key"], c["upload_round"]) for c in record["contributions"]] == [("a", 1), ("b", 1), ("b@0", 0)]
    first = json.loads((tmp_path / JOURNAL_DIR / "commit-000000.json").read_text())
    if policy == "zero-outside":     # b counted as zeros at a's weight; its delta, later, at half of round 0
        a, b = first["contributions"]
        assert b == {"key": "b", "site": "b", "missing": True, "weight": a["weight"]}
        assert [c["side"] for c in record["contributions"]] == [False, False, True]
        assert record["contributions"][2]["weight"] == pytest.approx(0.5) and record["substitute"] == "zero"
    else:
        assert [c["key"] for c in first["contributions"]] == ["a"] and record["substitute"] == "peer"
    assert_same_state(state_of(ParameterServer(cfg, run_dir=tmp_path)), state_of(ps))
