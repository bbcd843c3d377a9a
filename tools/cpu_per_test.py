"""Where the suite's CPU goes: a pytest plugin that writes each test's wall and CPU seconds.

The suite is CPU-bound (an idle `make test` keeps both cores about 95 % busy), so a test's wall time
says little about what it costs the other workers; its CPU does. Per test, one tab-separated line:
worker, start (epoch s), wall s, CPU s of the pytest process, CPU s of every process below it, and
the test's id. The second is read from /proc over the pytest process's whole tree: for each process
still there, its own CPU and that of the children it has reaped (utime, stime, cutime, cstime), so
a process counts once wherever it ended: in its own entry while it runs, in its reaper's once it is
reaped. That sees the PS and sites a warm starter forked (warm.py: they are the starter's children,
and the starter outlives the test) and a kernel's runs; RUSAGE_CHILDREN sees only what the test
process itself waited for. Not counted: a process that left the tree (a daemon, an orphan). Run
from the repository root:

    PYTHONPATH=tools WANTRAIN_QUICK=1 .venv/bin/python -m pytest -q -n 3 --dist loadgroup -p cpu_per_test
    sort -t$'\\t' -k5 -rn /tmp/cpu-per-test.tsv | head -20        # the costliest trees first

`CPU_PER_TEST_OUT` names another file (lines are appended: remove it between runs).
"""

from __future__ import annotations

import os
import resource
import time

import pytest

OUT = os.environ.get("CPU_PER_TEST_OUT", "/tmp/cpu-per-test.tsv")
TICK = os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and every process below it, with what each has reaped."""
    parent_of, cpu = {}, {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:                     # gone meanwhile
            continue
        pid = int(entry.name)
        parent_of[pid] = int(fields[1])     # after the name: state, ppid, ...; utime is field 14
        cpu[pid] = sum(int(x) for x in fields[11:15]) / TICK
    total = 0.0
    for pid, seconds in cpu.items():
        p, hops = pid, 0
        while p not in (root, 0, 1) and hops < 64:
            p, hops = parent_of.get(p, 0), hops + 1
        if p == root:
            total += seconds
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, me0, tree0 = time.time(), _own_cpu_s(), _tree_cpu_s(os.getpid())
    yield
    me1, tree1 = _own_cpu_s(), _tree_cpu_s(os.getpid())
    with open(OUT, "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')}\t{start:.2f}\t{time.time() - start:.2f}\t"
                f"{me1 - me0:.2f}\t{(tree1 - tree0) - (me1 - me0):.2f}\t{item.nodeid}\n")
