import json

import pytest

from wantrain.telemetry import SCHEMA_VERSION, Recorder, read_events, rows


def test_record_and_read_back(tmp_path):
    rec = Recorder(tmp_path / "events.jsonl")
    seen = []
    unsubscribe = rec.subscribe(lambda: seen.append(1))
    rec.emit("join", site="a", site_index=0, device="cpu", resumed=False)
    rec.emit("round_end", round=0, val_loss=float("nan"), model_hash="h")
    unsubscribe()
    rec.emit("run_end", rounds=1, val_loss=2.0)
    rec.close()
    events = read_events(tmp_path)
    assert [e["seq"] for e in events] == [0, 1, 2] and len(seen) == 2
    assert all(e["v"] == SCHEMA_VERSION and e["elapsed_s"] >= 0 for e in events)
    assert rows(events, "round_end")[0]["val_loss"] is None       # NaN is not JSON: it becomes null
    assert rows(events, "join")[0]["site"] == "a"
    # A restarted recorder continues the same log and numbering.
    again = Recorder(tmp_path / "events.jsonl")
    assert again.emit("error", code="x", message="y")["seq"] == 3
    again.close()


def test_unknown_kind_and_bad_files(tmp_path):
    rec = Recorder(None)
    with pytest.raises(ValueError, match="unknown telemetry event kind"):
        rec.emit("nonsense")
    p = tmp_path / "events.jsonl"
    p.write_text(json.dumps({"v": 99, "seq": 0, "kind": "join"}) + "\n")
    with pytest.raises(ValueError, match="schema version 99"):
        read_events(p)
    p.write_text("{not json\n")
    with pytest.raises(ValueError, match="events.jsonl:1"):
        read_events(p)
    with pytest.raises(FileNotFoundError):
        read_events(tmp_path / "nowhere")


def test_a_restarted_recorder_keeps_the_runs_clock(tmp_path):
    """A PS restarted from its checkpoint continues the log and its clock: elapsed_s counts from the
    run's start, not the new process's (04's loss chart once ran backwards in time)."""
    import time

    path = tmp_path / "events.jsonl"
    first = Recorder(path, start_time=time.time() - 100.0)
    first.emit("run_start", run_id="r", config={}, num_params=1)
    again = Recorder(path)                                  # the restarted PS
    assert again.start == first.start
    assert again.emit("restart", round=0)["elapsed_s"] >= 100.0
    assert Recorder(tmp_path / "new.jsonl").start == pytest.approx(time.time(), abs=5)   # a new run starts now


def test_a_restarted_recorder_cuts_the_event_a_killed_ps_left_half_written(tmp_path):
    path = tmp_path / "events.jsonl"
    first = Recorder(path)
    first.emit("run_start", run_id="r", config={}, num_params=1)
    first.emit("restart", round=0)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"v": 1, "seq": 2, "kind": "round_st')      # SIGKILL mid-write
    again = Recorder(path)                                  # the restarted PS
    again.emit("restart", round=1)
    assert [e["kind"] for e in read_events(path)] == ["run_start", "restart", "restart"]
    assert path.read_bytes().startswith(whole) and len(again.events) == 3
