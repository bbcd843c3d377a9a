import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import Trace, kernel
from testbed.kernel import KernelLink
from testbed.tcconfig_backend import TcconfigError, TcconfigLink

TCSET = shutil.which("tcset") or str(Path(sys.executable).parent / "tcset")
TCDEL = shutil.which("tcdel") or str(Path(sys.executable).parent / "tcdel")
have_tcconfig = pytest.mark.skipif(not Path(TCSET).exists(), reason="tcconfig is a dev dependency")
pytestmark = pytest.mark.usefixtures("host_network")   # namespaces of the host: see tests/conftest.py


@have_tcconfig
@pytest.mark.timeout(180)
def test_dry_run_shows_the_tc_commands():
    link = TcconfigLink("lo", Trace.constant(50, 10, 0.01), tcset=TCSET, tcdel=TCDEL, dry_run=True)
    out = link.apply(link.trace.at(0))
    assert "htb" in out and "netem" in out and "delay 50.0ms" in out and "loss 1.000000%" in out
    assert "10000.0Kbit" in out
    assert "--tc-command" in link.log[0]


@have_tcconfig
@pytest.mark.skipif(os.geteuid() != 0, reason="applying shaping needs root (CI runs as root)")
@pytest.mark.timeout(240)
def test_apply_is_verified_and_refused_without_netem():
    with KernelLink("tcc") as ns:          # a veth inside our own namespace to shape
        link = TcconfigLink(ns.site_if, Trace.constant(20, 10), prefix=ns.exec_prefix(), tcset=TCSET, tcdel=TCDEL)
        if kernel.netem_available():
            link.apply(link.trace.at(0))
            shown = subprocess.run(ns.exec_prefix() + ["tc", "qdisc", "show", "dev", ns.site_if],
                                   capture_output=True, text=True).stdout
            assert "netem" in shown
            link.clear()
        else:
            with pytest.raises(TcconfigError, match="no netem qdisc"):
                link.apply(link.trace.at(0))
        shown = subprocess.run(ns.exec_prefix() + ["tc", "qdisc", "show", "dev", ns.site_if],
                               capture_output=True, text=True).stdout
        assert "netem" not in shown and "htb" not in shown      # nothing left behind


def test_trace_is_followed_at_a_rate_tcset_can_sustain():
    calls = []

    def fake(cmd, **kw):                    # unit test of step(): count the tcset calls
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    trace = Trace.from_rows([(i * 0.1, 10 + i, math.inf, 0) for i in range(50)])   # changes every 0.1 s
    link = TcconfigLink("eth0", trace, dry_run=True, runner=fake, min_interval_s=0.5)
    applied = 0
    t0 = __import__("time").monotonic()
    while (now := __import__("time").monotonic() - t0) < 2.0:
        applied += link.step(now)
    assert 3 <= applied <= 5                 # about every 0.5 s, not 20 times
    assert all("--tc-command" in c for c in calls)
    assert link.tcset_argv(Trace.constant(0, 0).at(0))[-3:] == ["--loss", "100%", "--tc-command"]
