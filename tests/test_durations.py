"""The suite's order (tests/durations.py): longest first, from a table of past seconds."""

import json
from pathlib import Path
from types import SimpleNamespace

from . import durations


def item(nodeid: str):
    return SimpleNamespace(nodeid=nodeid, path=Path(nodeid.split("::")[0]))


def test_the_longest_test_goes_first_and_unknown_tests_by_their_kind():
    table = {"tests/test_a.py::test_long": 30.0, "tests/test_b.py::test_mid[x]": 4.0}
    items = [item("tests/test_a.py::test_short"), item("tests/test_b.py::test_mid[x]"),
             item("notebooks/09-new.ipynb::09-new.ipynb"), item("tests/test_a.py::test_long@heavy"),
             item("tests/test_a.py::test_other")]
    durations.longest_first(items, table)
    assert [i.nodeid for i in items] == [
        "notebooks/09-new.ipynb::09-new.ipynb",                 # a tutorial the table does not know: long
        "tests/test_a.py::test_long@heavy",                     # xdist's group suffix ignored
        "tests/test_b.py::test_mid[x]",
        "tests/test_a.py::test_short", "tests/test_a.py::test_other"]    # unknown: short, in collection order


def test_in_process_tests_that_wait_are_spread_among_the_long_process_tests():
    table = {"tests/p.py::p60": 60.0, "tests/p.py::p30": 30.0, "tests/p.py::p10": 10.0,
             "tests/i.py::i8": 8.0, "tests/i.py::i2": 2.0, "tests/i.py::i1": 1.5, "tests/p.py::p1": 1.0}
    items = [item(f"tests/{n[0]}.py::{n}") for n in ("i1", "p1", "i2", "p10", "i8", "p30", "p60", "p0")]
    durations.longest_first(items, table, waits=lambda i: i.nodeid.startswith("tests/i.py"))
    # Each kind longest first, each test at its start's share of its kind's seconds: p60 0, p30 0.6,
    # p10 0.9; i8 0, i2 0.8. Under 2 s, longest first whatever the kind.
    assert [i.nodeid.split("::")[1] for i in items] == ["p60", "i8", "p30", "i2", "p10", "i1", "p1", "p0"]


def test_a_group_suffix_is_dropped_but_not_a_parameter():
    assert durations.plain("tests/t.py::test_x@heavy") == "tests/t.py::test_x"
    assert durations.plain("tests/t.py::test_x[a@b]") == "tests/t.py::test_x[a@b]"
    assert durations.plain("tests/t.py::test_x[a@b]@hostile") == "tests/t.py::test_x[a@b]"


def test_the_recorded_table_is_what_load_reads_and_a_missing_one_orders_nothing(tmp_path):
    rec = durations.Recorder()
    for nodeid, phase_s in [("tests/t.py::test_a@heavy", 0.4), ("tests/t.py::test_a@heavy", 1.2),
                            ("tests/t.py::test_b", 0.3)]:
        rec.add(SimpleNamespace(nodeid=nodeid, duration=phase_s))
    rec.write(tmp_path / "d.json")
    assert durations.load(tmp_path / "d.json") == {"tests/t.py::test_a": 1.6}     # under a second: left out
    assert durations.load(tmp_path / "missing.json") == {}
    (tmp_path / "broken.json").write_text("{")
    assert durations.load(tmp_path / "broken.json") == {}


def test_the_stored_table_names_tests_that_exist():
    """A renamed test falls out of the order silently: the stored table must not name what is gone."""
    root = Path(durations.__file__).resolve().parents[1]
    table = json.loads(durations.STORED.read_text())
    assert len(table) > 100
    for nodeid in table:
        path, _, name = nodeid.partition("::")
        assert (root / path).is_file(), nodeid
        if path.endswith(".py"):
            assert f"def {name.split('[')[0]}(" in (root / path).read_text(), nodeid
