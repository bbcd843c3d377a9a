"""The order the suite runs in, from the seconds each test took in a past run: the long tests
longest first, the middling ones spread among them, the short ones last.

xdist hands tests to its workers in collection order. Longest first (the classic schedule for
jobs on a few machines) starts the long runs at once and leaves the short tests for the workers'
last minutes. Ordered by kind only (tutorials, then tests that start processes, then in-process
ones), a fresh clone's `make test` spent its last two minutes at 20 to 60 % of the CPU. Longest
first, once the suite's multi-site tests trained a smaller model, its last 130 s still ran at 20
to 64 %: the tests of 1.5 to 8 s, which mostly wait (on round deadlines, timeouts, a link's rate
or an outage), three at a time. They are now spread evenly among the long tests, where the other
two workers keep both cores busy, and the tail is left to the sub-second tests, which compute.

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
MIDDLING_S = 1.5            # from here up to LONG_S a test is spread among the long ones
LONG_S = 8.0


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
    """Sort `items` in place: the long tests longest first, each middling test where its share of
    the middling tests' seconds matches the long tests' share before it, then the short tests
    longest first. Ties keep collection order."""
    seconds = [expected_s(item, table) for item in items]
    long = sorted((i for i, s in enumerate(seconds) if s >= LONG_S), key=lambda i: -seconds[i])
    middling = sorted((i for i, s in enumerate(seconds) if MIDDLING_S <= s < LONG_S), key=lambda i: -seconds[i])
    short = sorted((i for i, s in enumerate(seconds) if s < MIDDLING_S), key=lambda i: -seconds[i])
    at: dict[int, float] = {}               # where each long or middling test starts, 0 to 1 of its kind
    for kind in (long, middling):
        total, before = sum(seconds[i] for i in kind) or 1.0, 0.0
        for i in kind:
            at[i] = before / total
            before += seconds[i]
    firsts = set(long)
    spread = sorted(long + middling, key=lambda i: (at[i], i not in firsts))
    items[:] = [items[i] for i in spread + short]


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
