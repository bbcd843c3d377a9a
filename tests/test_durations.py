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
