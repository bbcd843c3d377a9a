"""tcconfig shaping on a site's own host, over SSH (issue 13). The "host" is a real OpenSSH server
whose sessions live in a network namespace of their own, so its interface is not this machine's.

Where the kernel has netem, the run trains with the site's uplink shaped there (read back with `tc
qdisc show` during the run) and the shaping is gone afterwards. Where it has none (this project's
CI kernels), tcset exits 0 having done nothing useful: the run must refuse before any site starts,
say why, and leave no qdisc and no process behind.
"""

import os
import subprocess
import sys

import pytest

from testbed import kernel
from testbed.kernel import KernelLink
from wantrain.errors import ShapingError
from wantrain.launch import RemoteSite
from wantrain.plan import describe_scenario
from wantrain.run import Run

from .helpers import small_config
from .sshd import SshServer

pytestmark = [pytest.mark.usefixtures("host_network"),
              pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and tc need root (CI runs as root)")]

SCENARIO = """
name = "remote-tcconfig"
ps_region = "East US"
[[site]]
name = "a"
region = "East US"
[[site]]
name = "b"
region = "West Europe"
bandwidth_mbps = 50
backend = "tcconfig"
interface = "{interface}"
"""


def _qdiscs(ns: KernelLink) -> str:
    return subprocess.run(ns.exec_prefix() + ["tc", "qdisc", "show", "dev", ns.site_if], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.timeout(480)      # the install on the "host" takes a minute on a loaded machine
def test_tcconfig_over_ssh_shapes_the_hosts_interface_or_refuses_without_netem(tmp_path):
    with KernelLink("tcs") as ns:
        server = SshServer(tmp_path / "sshd", exec_prefix=tuple(ns.exec_prefix()))
        scenario = tmp_path / "remote.toml"
        scenario.write_text(SCENARIO.format(interface=ns.site_if))
        host = RemoteSite(server.url, python=sys.executable, reuse_site_packages=True, venvs=str(tmp_path / "venvs"),
                          key_file=server.key_file, known_hosts=str(server.known_hosts))
        cfg = small_config(**{"sites": ["a", "b"], "num_sites": 2, "train.rounds": 2, "train.inner_steps": 8})
        run = Run(cfg, run_dir=tmp_path / "run", plan=describe_scenario(scenario), remote={"b": host})
        try:
            if kernel.netem_available():
                run.start()
                shaped = _qdiscs(ns)
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
        left = _qdiscs(ns)
        assert "netem" not in left and "htb" not in left, left              # nothing left on the host
