"""The telemetry schema is docs/protocol.md section 10: every kind documented, every field that is
written documented, every field a reader reads documented; a log of another version refused."""

import ast
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from wantrain.errors import TelemetryError
from wantrain.transport.messages import RoundMetrics
from wantrain.telemetry import EVENT_KINDS, SCHEMA_VERSION, read_events

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "protocol.md").read_text()
COMMON = {"v", "seq", "kind", "t", "elapsed_s", "source"}


def documented() -> dict[str, set[str]]:
    section = DOC[DOC.index("## 10."):DOC.index("## 11.")]
    out = {}
    for m in re.finditer(r"^\| `(\w+)` \| (.*) \|$", section, re.M):
        out[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    out["site_round"] |= {f.name for f in fields(RoundMetrics)}          # "every RoundMetrics field"
    return out


def written(path: Path, call: str) -> list[tuple[str, set[str]]]:
    """(kind, keyword names) of each `call("kind", name=...)` and each `{"kind": "...", ...}` literal."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == call \
                and node.args and isinstance(node.args[0], ast.Constant):
            out.append((node.args[0].value, {k.arg for k in node.keywords if k.arg}))
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "kind" in keys:
                kind = node.values[keys.index("kind")]
                if isinstance(kind, ast.Constant):
                    out.append((kind.value, set(keys) - {"kind"}))
    return out


def test_every_kind_and_every_written_field_is_documented():
    doc = documented()
    assert set(EVENT_KINDS) == set(doc), set(EVENT_KINDS) ^ set(doc)
    sources = [(p, "emit") for p in (ROOT / "wantrain").rglob("*.py") if "proto" not in p.parts]
    sources += [(ROOT / "testbed" / "links.py", "write")]
    seen = set()
    for path, call in sources:
        for kind, names in written(path, call):
            if kind in doc:
                seen.add(kind)
                assert names - COMMON <= doc[kind], (path.name, kind, names - COMMON - doc[kind])
    # round_end's fields come from commit.round_end's dict(...): checked like an emit.
    tree = ast.parse((ROOT / "wantrain" / "ps" / "commit.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "round_end")
    ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
    assert {k.arg for k in ret.value.keywords} <= doc["round_end"]
    assert {"run_start", "link", "spike", "reset", "fault", "link_rtt"} <= seen      # the checks above ran


def test_readers_read_documented_fields_only():
    doc = documented()
    known = set().union(*doc.values()) | COMMON
    readers = ["wantrain/telemetry/report.py", "wantrain/ui/dashboard.py", "wantrain/commands/demo.py",
               "wantrain/telemetry/__init__.py"]
    for rel in readers:
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                    node.value.id in ("e", "ev", "ln", "event", "m", "u", "c", "f") and \
                    isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                name = node.slice.value
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id in ("e", "ev", "ln", "event") and \
                    node.args and isinstance(node.args[0], ast.Constant):
                name = node.args[0].value
            if name is not None:
                assert name in known, (rel, node.lineno, name)


def test_a_log_of_another_schema_version_is_refused_with_its_version(tmp_path):
    (tmp_path / "events.jsonl").write_text(json.dumps({"v": 1, "seq": 0, "kind": "run_start", "t": 100.0,
                                                       "elapsed_s": 0.0, "val_loss": 5.0}) + "\n")
    with pytest.raises(TelemetryError, match="schema version 1 .*version 2 only"):
        read_events(tmp_path)
    assert SCHEMA_VERSION == 2


def test_reported_events_keep_their_time_and_say_where_they_came_from(tmp_path):
    from wantrain.telemetry import Recorder
    rec = Recorder(tmp_path / "events.jsonl", start_time=100.0)
    rec.emit("join", site="a", site_index=0, device="cpu", resumed=False, data_position=0)
    assert rec.record_reported({"kind": "outage_start", "t": 150.0, "site": "a", "seq": 99, "v": 7}) == 1
    rec.close()
    ev = read_events(tmp_path)[1]
    assert (ev["seq"], ev["v"], ev["t"], ev["elapsed_s"], ev["source"]) == (1, SCHEMA_VERSION, 150.0, 50.0, "reported")


def test_a_reported_time_the_run_cannot_have_seen_is_replaced_by_the_arrival(tmp_path):
    import time

    from wantrain.telemetry import REPORTED_TIME_SLACK_S, Recorder
    start = time.time() - 100
    rec = Recorder(tmp_path / "events.jsonl", start_time=start)
    for t in (4e12, start - 2 * REPORTED_TIME_SLACK_S, start - REPORTED_TIME_SLACK_S / 2):
        rec.record_reported({"kind": "fault", "t": t, "action": "kill site", "site": "a", "claimed_t": 1.0})
    arrived = time.time()
    rec.close()
    far_future, long_before, just_before = read_events(tmp_path)
    for ev, claimed in ((far_future, 4e12), (long_before, start - 2 * REPORTED_TIME_SLACK_S)):
        assert ev["claimed_t"] == claimed and start < ev["t"] <= arrived      # where the run's clock put it
    assert just_before["t"] == start - REPORTED_TIME_SLACK_S / 2 and "claimed_t" not in just_before
