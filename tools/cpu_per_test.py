"""Where the suite's CPU goes: a pytest plugin that writes each test's wall and CPU seconds.

The suite is CPU-bound (an idle `make test` keeps both cores about 86 % busy), so a test's wall time
says little about what it costs the other worker; its CPU does. Per test, one tab-separated line:
worker, start (epoch s), wall s, CPU s of the pytest process, CPU s of the processes it started and
reaped (PS, sites, kernels, browsers; RUSAGE_CHILDREN, so an orphan a test never waited for is
not counted). Run from the repository root:

    PYTHONPATH=tools WANTRAIN_QUICK=1 .venv/bin/python -m pytest -q -n 2 --dist loadgroup -p cpu_per_test
    sort -t$'\\t' -k5 -rn /tmp/cpu-per-test.tsv | head -20        # the costliest children first

`CPU_PER_TEST_OUT` names another file (lines are appended: remove it between runs).
"""

from __future__ import annotations

import os
import resource
import time

import pytest

OUT = os.environ.get("CPU_PER_TEST_OUT", "/tmp/cpu-per-test.tsv")


def _cpu_s() -> tuple[float, float]:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, (me0, children0) = time.time(), _cpu_s()
    yield
    me1, children1 = _cpu_s()
    with open(OUT, "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')}\t{start:.2f}\t{time.time() - start:.2f}\t"
                f"{me1 - me0:.2f}\t{children1 - children0:.2f}\t{item.nodeid}\n")
