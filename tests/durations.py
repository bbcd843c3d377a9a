"""The order the suite runs in: longest test first, from the seconds each took in a past run.

xdist hands tests to its workers in collection order. Longest first (the classic schedule for
jobs on a few machines) starts the long runs at once and leaves the sub-second tests for the
workers' last minutes. Ordered by kind only (tutorials, then tests that
start processes, then in-process ones), a fresh clone's `make test` spent its last two minutes
at 20 to 60 % of the CPU, the workers waiting on the round deadlines of in-process tests; longest
first, its pytest took 857 s against 883. Spreading the tests that mostly wait among the long runs
measured worse twice: the in-process tests of 2 s or more, 924 s; every test of 1.5 to 8 s, 932 and
935 s against 898 and 930 for longest first in the same hours. Those tests still leave the last
two minutes at 20 to 64 % of the CPU; a schedule by each test's CPU (tools/cpu_per_test.py) rather
than its seconds is the next thing to try.

`tests/durations.json` holds the seconds of every test that took a second or more in a fresh
clone's `make test` (call, setup and teardown, under the suite's own load); a test not in it is
taken as short, a tutorial not in it as long. Every run writes the same table for itself to
`test-output/durations.json`: copy it over `tests/durations.json` when tests were added or moved.
Only the order depends on it, never a result.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

STORED = Path(__file__).with_name("durations.json")
MEASURED = Path(__file__).resolve().parents[1] / "test-output" / "durations.json"
KEPT_FROM_S = 1.0           # shorter tests are left out of the table: they are the default
SHORT_S = 0.5               # a test the table does not name
TUTORIAL_S = 60.0           # a tutorial it does not name


def load(path: Path = STORED) -> dict[str, float]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}           # no table (or a broken one): every test counts as short; the order only


def plain(nodeid: str) -> str:
    """The test's id without the "@group" xdist appends to the tests of an xdist_group."""
    test, _, group = nodeid.rpartition("@")
    return test if test and group and not any(c in group for c in "/:[]") else nodeid


def expected_s(item, table: dict[str, float]) -> float:
    if plain(item.nodeid) in table:
        return table[plain(item.nodeid)]
    return SHORT_S if str(item.path).endswith(".py") else TUTORIAL_S


def longest_first(items: list, table: dict[str, float]) -> None:
    """Sort `items` in place, longest expected first (ties keep collection order)."""
    items.sort(key=lambda item: -expected_s(item, table))


class Recorder:
    """Sums each test's setup, call and teardown seconds as reports arrive (in the xdist controller,
    from every worker) and writes the table `load` reads."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, report) -> None:
        self.seconds[plain(report.nodeid)] += report.duration

    def write(self, path: Path = MEASURED) -> None:
        kept = {test: round(s, 1) for test, s in sorted(self.seconds.items()) if s >= KEPT_FROM_S}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(kept, indent=0, sort_keys=True) + "\n")
