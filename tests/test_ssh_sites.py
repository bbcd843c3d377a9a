"""Sites over SSH (issue 13, deployment shape a): the PS runs here, next to the notebook; three
sites start on an SSH "host" (a real OpenSSH server, tests/sshd.py) from this checkout's version
installed there, and reach the PS through reverse forwards on their own connections. Nothing on
the site side listens on the network."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wantrain.launch import ProcessSpec, SshLauncher, SshTarget
from wantrain.launch.argv import site_command
from wantrain.launch.install import install_on_host
from wantrain.launch.ssh import LOST
from wantrain.telemetry import read_events, rows

from .cluster import Cluster, check_run
from .helpers import small_config
from .sshd import SshServer


def _listening_tcp_pids() -> set[int]:
    """Processes that hold a listening TCP socket (ss -ltnp)."""
    out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
    return {int(p.split("=")[1]) for line in out.splitlines() for p in line.split("users:")[-1].split(",")
            if p.startswith("pid=")}


def _group(pgid: int) -> set[int]:
    """The processes of a process group (from /proc: field 5 of stat, after the command's name)."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                members.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return members


@pytest.mark.timeout(480)     # the suite's install on the "host" (venvs) takes a minute on a loaded machine
def test_three_ssh_sites_train_through_reverse_forwards(tmp_path, venvs):
    rounds = 3
    cfg = small_config(**{"sites": ["a", "b", "c"], "train.rounds": rounds})
    server = SshServer(tmp_path / "sshd")
    c = Cluster(tmp_path, cfg)
    launchers = []
    try:
        c.start_ps().wait_for("listening on")
        handles, said = [], []
        for name in cfg.sites:
            remote = SshLauncher(SshTarget.parse(server.url, key_file=server.key_file,
                                                 known_hosts=str(server.known_hosts)), python=sys.executable)
            launchers.append(remote)
            # This checkout's version, in the venv the suite installed on the "host" (conftest.py:
            # venvs; a fresh install is test_host_install.py's). The host's torch is reused.
            python = install_on_host(remote, sys.executable, reuse_site_packages=True, venvs=venvs,
                                     progress=said.append)
            assert python.startswith(venvs)
            ps = remote.reverse_forward("127.0.0.1", c.port)
            assert ps.startswith("unix:/tmp/wantrain-")
            argv = site_command(python, ps, name, threads=1)
            handles.append(remote.start(ProcessSpec(name, argv, log_path=tmp_path / f"{name}.log")))
        c.wait_event("round_start", round=1)
        listening = _listening_tcp_pids()
        assert c.ps.p.pid in listening                         # the check sees listeners: the PS's
        site_side = set().union(*(_group(h.pgid) for h in handles), (p.pid for p in server.sessions))
        assert len(site_side) >= 6 and not site_side & listening      # no site, no sshd of theirs listens
        assert sum("already installed" in m for m in said) == 3 and not any("creating" in m for m in said), said
        probe = launchers[0].run(f"{python} -c 'import wantrain; print(wantrain.__file__)'")
        assert probe[0] == 0 and probe[1].startswith(venvs), probe    # not the checkout's
        for h in handles:
            assert h.wait(180) == 0, h.log_tail(40)
        events = c.finish()
    finally:
        for remote in launchers:
            remote.close()
        c.close()
        server.close()
    check_run(events, rounds)
    assert all(e["sites"] == ["a", "b", "c"] for e in rows(events, "round_end"))
    # A host's first round encodes, and its first update applies, no slower than the later ones:
    # the codec's loops were compiled at the install (test_host_install.py sees it say so), for the
    # argument types of real use, and loaded before the Join (compiling them in the first rounds
    # took 13 s and 6 s; missing the types of bytes off the wire, 0.6 s and 1.4 s). (0.25 s of
    # slack: a round's encode is milliseconds here.) The three sites share the host's venv, so a
    # missing compile would slow each one's first round: one site's slow first round (0.47 s
    # against 0.08 s, in a busy suite) is the machine's noise, and does not fail the test.
    encode, apply = {}, {}
    for name in cfg.sites:
        mine = {e["round"]: e for e in rows(events, "site_round") if e["site"] == name}
        encode[name] = {r: e["encode_s"] for r, e in mine.items()}
        apply[name] = {r: e["decode_s"] for r, e in mine.items() if r > 0}   # round r applies round r - 1's update
    assert any(e[0] <= 2 * max(e[r] for r in range(1, rounds)) + 0.25 for e in encode.values()), encode
    assert any(a[1] <= 2 * max(a[r] for r in range(2, rounds)) + 0.25 for a in apply.values()), apply
    joins = rows(events, "join")
    assert {j["site"] for j in joins} == {"a", "b", "c"}


@pytest.mark.timeout(480)
def test_a_run_with_a_local_and_an_ssh_site(tmp_path, venvs):
    """Run starts site b on its SSH host (inspected, installed, TLS CA and shared secret copied
    there 0600, dialling back through a reverse forward that leads to its emulated link) beside
    local site a. Killed, b rejoins. When every SSH connection drops, once while b downloads the
    model and once while it trains, its watchdog stops it on the host and the run starts it again
    on a new connection, and it rejoins again."""
    import time

    from wantrain.launch import RemoteSite
    from wantrain.launch.run import describe_scenario
    from wantrain.launch.run import Run

    scenario = tmp_path / "two.toml"
    scenario.write_text('name = "two"\nps_region = "East US"\n[[site]]\nname = "a"\nregion = "East US"\n'
                        '[[site]]\nname = "b"\nregion = "West Europe"\nbandwidth_mbps = 200\n')

    server = SshServer(tmp_path / "sshd")
    said: list[str] = []
    host = RemoteSite(server.url, python=sys.executable, reuse_site_packages=True, venvs=venvs,
                      progress=said.append, key_file=server.key_file, known_hosts=str(server.known_hosts))
    # Each round after a fault waits for b (it was in the last round), so it is back before the end.
    cfg = small_config(**{"sites": ["a", "b"], "num_sites": 2, "train.rounds": 6, "train.inner_steps": 16,
                          "schedule.quorum_wait_s": 120.0})
    dropped = []
    try:
        with Run(cfg, run_dir=tmp_path / "run", remote={"b": host}, plan=describe_scenario(scenario)) as run:
            assert run.tls and run.certs is not None
            for ev in run.follow(timeout_s=400):
                if ev["kind"] == "round_end" and ev["round"] == 1:
                    run.kill_site("b")                     # over SSH: the remote group, then a restart there
                    stalled = run.start_site("b", extra=("--stall", "download=60"))
                    deadline = time.time() + 120
                    while "stalling" not in stalled.log_tail(20) and time.time() < deadline:
                        time.sleep(0.2)
                    assert "in phase download" in stalled.log_tail(20), stalled.log_tail(20)
                    dropped.append(stalled)
                    server.drop_all()                      # the network fails mid-download
                if ev["kind"] == "round_end" and ev["round"] == 3:
                    dropped.append(run.workers["b"])
                    server.drop_all()                      # and again while b trains
            codes = run.wait_exit(60)
    finally:
        server.close()
    assert all(c == 0 for name, c in codes.items() if "site" in name), codes
    events = read_events(tmp_path / "run")
    check_run(events, 6)
    assert [j["site"] for j in rows(events, "join")].count("b") >= 4          # joined; killed, dropped: rejoined
    assert [f["site"] for f in rows(events, "fault") if f["action"] == "SSH connection lost"] == ["b", "b"]
    assert dropped[0] is not dropped[1]
    for p in dropped:
        assert p.poll() == LOST and not _group(p.pgid)                        # nothing of it left on the host
    assert any("Python" in m and "torch" in m for m in said) and any("installed" in m for m in said), said
    assert (tmp_path / "run" / "site-b.log").read_text().strip()               # its log came back here
    link_rows = [json.loads(ln) for ln in (tmp_path / "run" / "links.jsonl").read_text().splitlines()]
    b_up = max(r["bytes_up"] for r in link_rows if r.get("kind") == "link" and r["site"] == "b")
    assert b_up > 100_000, b_up          # b's deltas went up through its emulated link, not around it
