"""tcconfig shaping on a site's own host, over SSH (issue 13). The "host" is a real OpenSSH server
whose sessions live in a network namespace of their own, so its interface is not this machine's.

Where the kernel has netem, the run trains with the site's uplink shaped there (read back with `tc
qdisc show` during the run) and the shaping is gone afterwards. Where it has none (this project's
CI kernels), tcset exits 0 having done nothing useful: the run must refuse before any site starts,
say why, and leave no qdisc and no process behind. There a site's own "kernel" backend is the
fallback: htb on the host's interface, read back, removed; this test runs on every kernel (the SSH
host listens inside its namespace, so its traffic crosses the interface that is shaped).
"""

import os
import subprocess
import sys

import pytest

from testbed import kernel
from testbed.kernel import KernelLink
from wantrain.errors import ShapingError
from wantrain.launch import RemoteSite
from wantrain.launch.run import describe_scenario
from wantrain.launch.run import Run

from .helpers import small_config
from .sshd import SshServer

pytestmark = [pytest.mark.usefixtures("host_network"),
              pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and tc need root (CI runs as root)")]

SCENARIO = """
name = "remote-{backend}"
ps_region = "East US"
[[site]]
name = "a"
region = "East US"
[[site]]
name = "b"
region = "West Europe"
bandwidth_mbps = {mbps}
backend = "{backend}"
interface = "{interface}"
"""


def _tc(ns: KernelLink, *what: str) -> str:
    """`tc ... show dev IF` on the namespace "host"'s interface."""
    return subprocess.run(ns.exec_prefix() + ["tc", *what, "show", "dev", ns.site_if], capture_output=True,
                          text=True, check=True).stdout


def _run_on_host(tmp_path, venvs: str, ns: KernelLink, server: SshServer, backend: str, mbps: int, rounds: int) -> Run:
    """A run of a local site a and a site b on the namespace "host", whose link `backend` shapes there."""
    scenario = tmp_path / "remote.toml"
    scenario.write_text(SCENARIO.format(backend=backend, mbps=mbps, interface=ns.site_if))
    host = RemoteSite(server.url, python=sys.executable, reuse_site_packages=True, venvs=venvs,
                      key_file=server.key_file, known_hosts=str(server.known_hosts))
    cfg = small_config(**{"sites": ["a", "b"], "num_sites": 2, "train.rounds": rounds, "train.inner_steps": 8})
    return Run(cfg, run_dir=tmp_path / "run", plan=describe_scenario(scenario), remote={"b": host})


@pytest.mark.timeout(480)      # the install on the "host" takes a minute on a loaded machine
def test_tcconfig_over_ssh_shapes_the_hosts_interface_or_refuses_without_netem(tmp_path, venvs):
    with KernelLink("tcs") as ns:
        server = SshServer(tmp_path / "sshd", exec_prefix=tuple(ns.exec_prefix()))
        run = _run_on_host(tmp_path, venvs, ns, server, "tcconfig", 50, rounds=2)
        try:
            if kernel.netem_available():
                run.start()
                shaped = _tc(ns, "qdisc")
                assert "netem" in shaped and "delay" in shaped, shaped
                assert list(run.follow(timeout_s=300))[-1]["kind"] == "run_end"
            else:
                with pytest.raises(ShapingError) as refused:
                    run.start()
                message = str(refused.value)
                assert "site b" in message and "no netem qdisc" in message and ns.site_if in message, message
                assert server.url.removeprefix("ssh://") in message          # which host
                assert not list((tmp_path / "run").glob("site-*.log"))       # no site started
                assert all(p.poll() is not None for p in run.processes())   # the run stopped what it started
        finally:
            run.stop()
            server.close()
        left = _tc(ns, "qdisc")
        assert "netem" not in left and "htb" not in left, left              # nothing left on the host


@pytest.mark.timeout(480)
def test_the_kernel_fallback_over_ssh_puts_htb_on_the_hosts_interface_and_removes_it(tmp_path, venvs):
    """Where tcconfig cannot shape (no netem), a site's own backend "kernel" still shapes its host:
    its uplink rate by htb on the host's interface (applied over SSH, read back, gone afterwards),
    the delay and outages by its proxy link here, which its reverse forward leads through."""
    import json
    import re

    with KernelLink("krn") as ns:
        server = SshServer(tmp_path / "sshd", exec_prefix=tuple(ns.exec_prefix()), listen=ns.site_ip)
        run = _run_on_host(tmp_path, venvs, ns, server, "kernel", 20, rounds=3)
        try:
            run.start()
            shaped = _tc(ns, "-s", "class")
            assert re.search(r"class htb 1:10 root .*rate 20Mbit ceil 20Mbit", shaped), shaped
            assert list(run.follow(timeout_s=300))[-1]["kind"] == "run_end"
            sent = int(re.search(r"Sent (\d+) bytes", _tc(ns, "-s", "class")).group(1))
        finally:
            run.stop()
            server.close()
        left = _tc(ns, "qdisc")
        assert "htb" not in left, left                                        # nothing left on the host
    shaper_log = (tmp_path / "run" / "shaper-b.log").read_text()
    assert "rate 20 Mbit/s by htb" in shaper_log and "removed the shaping" in shaper_log, shaper_log
    link_rows = [json.loads(ln) for ln in (tmp_path / "run" / "links.jsonl").read_text().splitlines()]
    b_up = max(r["bytes_up"] for r in link_rows if r.get("kind") == "link" and r["site"] == "b")
    assert b_up > 100_000 and sent > b_up, (b_up, sent)    # b's deltas went through its proxy link and the htb class
