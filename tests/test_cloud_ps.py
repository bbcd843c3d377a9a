"""A parameter server on an SSH host (issue 13, deployment shape b: a cloud VM). The PS is
inspected, installed and started there with its certificate, the sites' own tokens and the
observer token copied into a private folder (0600); sites dial its public address with TLS (one
here, one on an SSH host of its own), and this process follows the run through a local port
forward, across a restart of the PS from its checkpoint."""

import sys
import time

import pytest

from wantrain.launch import RemotePS, RemoteSite
from wantrain.launch.run import Run

from .helpers import small_config
from .sshd import SshServer


@pytest.mark.timeout(300)
def test_a_ps_address_a_site_cannot_reach_is_refused_by_name_and_leaves_nothing(tmp_path, venvs):
    """The PS listens on 127.0.0.1 of its host, but the sites are told 127.0.0.2: the run refuses
    before any site starts, naming the site, its host and the address, and stops the PS it started."""
    from wantrain.errors import ProcessError

    from .test_ssh_sites import _group

    cloud = SshServer(tmp_path / "cloud")
    common = dict(python=sys.executable, reuse_site_packages=True, venvs=venvs,
                  key_file=cloud.key_file, known_hosts=str(cloud.known_hosts))
    ps = RemotePS(cloud.url, public_host="127.0.0.2", bind="127.0.0.1", run_root=str(tmp_path / "cloud-runs"),
                  **common)
    site = RemoteSite(cloud.url, **common)
    cfg = small_config(**{"sites": ["b", "a"], "num_sites": 2, "train.rounds": 2})
    run = Run(cfg, run_dir=tmp_path / "run", ps_on=ps, remote={"b": site})
    try:
        with pytest.raises(ProcessError, match=rf"site b on ssh://.*:{cloud.port} cannot reach the PS at "
                                               r"127\.0\.0\.2:\d+: .*[Cc]onnection refused.*public_host"):
            run.start()
        assert run.ps is not None and run.ps.poll() is not None
        # The host's watchdog ends the PS's group once its SSH channel closes: SIGTERM, SIGKILL 5 s on.
        gone_by = time.time() + 20
        while _group(run.ps.pgid) and time.time() < gone_by:
            time.sleep(0.2)
        assert not _group(run.ps.pgid)                                                          # the PS is gone
        assert not run.workers and not list((tmp_path / "run").glob("site-*.log"))             # no site started
    finally:
        run.stop()
        cloud.close()


def test_a_local_site_that_cannot_reach_the_ps_is_refused_by_name(tmp_path):
    import socket

    from wantrain.errors import ProcessError
    from wantrain.launch.placement import Placements

    with socket.create_server(("127.0.0.1", 0)) as s:
        closed = s.getsockname()[1]
    places = Placements(["a"], None, None, sys.executable)
    with pytest.raises(ProcessError, match=rf"site a on this machine cannot reach the PS at 127.0.0.1:{closed}: "):
        places.place("a", f"127.0.0.1:{closed}", tmp_path / "secret", None, tmp_path, forward=False)
