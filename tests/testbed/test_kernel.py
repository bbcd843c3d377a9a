"""The kernel backend, as root inside network namespaces: htb rate and nftables loss measured on
real TCP traffic, outages, and cleanup of everything it made (also after a failure)."""

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import kernel
from testbed.kernel import KernelBackendError, KernelLink, cleanup_all

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel backend needs root (CI runs as root)")

SINK = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; first = last = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    now = time.monotonic(); first = first or now; last = now; n += len(b)
print(n, last - first, flush=True)
"""

SEND = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
s.sendall(b"\\0" * int(sys.argv[3])); s.close()
"""


def transfer(sink_prefix, sink_ip, send_prefix, nbytes):
    """Send nbytes from one side to a sink on the other; returns the sink's measured Mbit/s."""
    sink = subprocess.Popen(sink_prefix + [sys.executable, "-c", SINK, sink_ip], stdout=subprocess.PIPE, text=True)
    try:
        port = sink.stdout.readline().strip()
        subprocess.run(send_prefix + [sys.executable, "-c", SEND, sink_ip, port, str(nbytes)], check=True, timeout=120)
        n, secs = sink.stdout.readline().split()
        return int(n) * 8 / float(secs) / 1e6
    finally:
        sink.kill()
        sink.wait()


def state():
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return [x for x in ns.split() if x.startswith("wt-")], [x for x in links.split() if x.startswith("wt")], \
        [x for x in tables.split() if x.startswith("wt_")]


@pytest.fixture(autouse=True)
def _clean(host_network):
    yield
    if os.geteuid() == 0:
        cleanup_all()


@root_only
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mbps", [10, 40])
def test_htb_rate_on_real_tcp_both_ways(mbps):
    with KernelLink("rate", rate_mbps=mbps) as link:
        nbytes = int(mbps * 1e6 / 8 * 3)                           # about three seconds
        down = transfer(link.exec_prefix(), link.site_ip, [], nbytes)
        up = transfer([], link.host_ip, link.exec_prefix(), nbytes)
    # htb counts link-layer bytes; TCP payload is about 95% of them (headers). Tight above (htb
    # caps), looser below: a busy machine can make the sending or reading process late, never early.
    for measured in (down, up):
        assert 0.95 * mbps - 0.2 * mbps <= measured <= 0.95 * mbps + 0.1 * mbps, (down, up)


@root_only
@pytest.mark.timeout(240)
def test_nftables_loss_rate_is_within_a_binomial_band():
    # With the delay relay in the path (the same nftables rule as without; the relay must add no loss).
    p = 0.05
    with KernelLink("loss", loss=p, relay=True) as link:
        transfer(link.exec_prefix(), link.site_ip, [], 3_000_000)
        seen, dropped = link.counters()["downlink"]
    assert seen > 1000
    rate = dropped / seen
    sigma = math.sqrt(p * (1 - p) / seen)
    assert abs(rate - p) <= 4 * sigma, (rate, seen)


@root_only
@pytest.mark.timeout(240)
def test_outage_holds_tcp_and_lets_it_resume():
    with KernelLink("out", rate_mbps=50) as link:
        sink = subprocess.Popen(link.exec_prefix() + [sys.executable, "-c", SINK, link.site_ip],
                                stdout=subprocess.PIPE, text=True)
        port = sink.stdout.readline().strip()
        link.apply(50, 0.0, 0.0, down=True)
        t0 = time.monotonic()
        sender = subprocess.Popen([sys.executable, "-c", SEND, link.site_ip, port, "2000000"])
        time.sleep(3)
        assert sender.poll() is None                        # stalled, not failed
        link.apply(50, 0.0, 0.0, down=False)
        assert sender.wait(60) == 0
        n, _ = sink.stdout.readline().split()
        assert int(n) == 2_000_000 and time.monotonic() - t0 >= 3
        sink.wait(10)


@root_only
@pytest.mark.timeout(180)
def test_everything_is_removed_also_after_a_failure():
    with pytest.raises(RuntimeError, match="boom"):
        with KernelLink("fail", rate_mbps=5, loss=0.01) as link:
            assert link.ns in state()[0]
            raise RuntimeError("boom")
    assert state() == ([], [], [])
    # A failing setup (an impossible rate) cleans up too, and says why.
    with pytest.raises(KernelBackendError):
        KernelLink("bad", rate_mbps=-5).create()
    assert state() == ([], [], [])


PING = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def ping():
    t = time.monotonic(); s.sendall(b"p"); assert s.recv(1) == b"p"; return time.monotonic() - t
print(min(ping() for _ in range(9)) * 1000)
"""

ECHO = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept()
while b := c.recv(1):
    c.sendall(b)
"""


@root_only
@pytest.mark.timeout(180)
def test_the_relay_delays_what_sites_send_each_other_and_counts_it_as_the_senders_uplink():
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    with KernelLink("a", delay_ms=20, relay=True, peer_to_peer=True) as a, \
            KernelLink("b", delay_ms=5, relay=True, peer_to_peer=True) as b:
        assert not a.needs_proxy_delay and Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "1"
        echo = subprocess.Popen(a.exec_prefix() + [sys.executable, "-c", ECHO, a.site_ip], stdout=subprocess.PIPE,
                                text=True)
        try:
            port = echo.stdout.readline().strip()
            ms = float(subprocess.run(b.exec_prefix() + [sys.executable, "-c", PING, a.site_ip, port],
                                      capture_output=True, text=True, check=True, timeout=60).stdout)
        finally:
            echo.kill()
            echo.wait()
        b_up, b_down = b.counters("bytes")["uplink"], b.counters("bytes")["downlink"]
    # Each side's whole round-trip delay leaves with what it sends: 2 x 20 + 2 x 5 ms.
    assert 49 <= ms <= 62, ms
    assert b_up[0] > 0 and b_down[0] > 0 and b_up[1] == b_down[1] == 0, (b_up, b_down)
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forwarding     # as it was
    assert state() == ([], [], [])


@root_only
@pytest.mark.timeout(180)
def test_delay_comes_from_netem_or_says_it_needs_the_proxy():
    with KernelLink("delay", delay_ms=30) as link:
        assert link.needs_proxy_delay == (not kernel.netem_available())


def test_without_root_the_message_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(KernelBackendError, match="needs root .*uid 1000.*proxy backend"):
        kernel.check_support()


def test_missing_tool_is_named(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(kernel.shutil, "which", lambda tool: None if tool == "nft" else "/usr/bin/" + tool)
    with pytest.raises(KernelBackendError, match="`nft` .*nftables"):
        kernel.check_support()
