"""The delay relay: a one-way delay for every packet a site's namespace sends, where the kernel has
no netem.

    ip netns exec NS python -m testbed.delay_relay --tun TUN --dev VETH --mac HOST_MAC --delay-ms D

Inside the site's namespace (testbed/kernel.py sets it up) every route leads to the TUN device, so
whatever the site sends (TCP to the PS, gloo or libp2p straight to another site, UDP) comes to this
process as a raw IP packet. The relay holds each packet until its time has come, then puts it on
the site's veth with a packet socket: out through the veth's htb (the rate) to the host, as if the
site had sent it late. Packets leave in the order they came, whatever the delay does meanwhile.

Standard input sets the delay: each line is a new one-way delay in milliseconds (the trace moves
on); end of input ends the relay. It never reads what arrives on the veth: the site's kernel
takes that as usual, so the path's whole delay sits on the site's sending side (a round trip sees
the trace's delay up plus down; one-way times lean to the uplink). A packet the veth's queue
cannot take (the htb backlog is full: a bottleneck router's drop) is dropped and counted; the
counts go to standard output as one JSON line at the end.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
READS_PER_WAKE = 256          # packets read from the TUN before sending what is due


def open_tun(name: str) -> int:
    """Attach to the TUN device `name` (made persistent by the caller); a non-blocking fd of raw IP packets."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def _ethertype(packet: bytes) -> int | None:
    version = packet[0] >> 4 if packet else 0
    return {4: ETH_P_IP, 6: ETH_P_IPV6}.get(version)


def relay(tun: int, dev: str, mac: bytes, delay_s: float, control: int) -> dict:
    """Forward packets from `tun` to `dev` (towards `mac`) `delay_s` late until the fd `control`
    ends; each line read from it is a new delay in milliseconds."""
    out = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)    # protocol 0: sends only, never receives
    held: collections.deque[tuple[float, int, bytes]] = collections.deque()    # (due, ethertype, packet)
    counts = {"packets": 0, "bytes": 0, "dropped": 0, "not_ip": 0}
    last_due = 0.0
    pending = b""
    sel = selectors.DefaultSelector()
    sel.register(tun, selectors.EVENT_READ, "tun")
    sel.register(control, selectors.EVENT_READ, "control")
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        for key, _ in sel.select(timeout):
            if key.data == "control":
                chunk = os.read(control, 4096)
                if not chunk:
                    return counts
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if lines:                                   # the latest delay holds
                    delay_s = max(0.0, float(lines[-1]) / 1000)
                continue
            now = time.monotonic()
            for _ in range(READS_PER_WAKE):
                try:
                    packet = os.read(tun, 65536)
                except BlockingIOError:
                    break
                kind = _ethertype(packet)
                if kind is None:
                    counts["not_ip"] += 1
                    continue
                last_due = max(now + delay_s, last_due)      # never overtake an earlier packet
                held.append((last_due, kind, packet))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, kind, packet = held.popleft()
            try:
                out.sendto(packet, (dev, kind, 0, 0, mac))
                counts["packets"] += 1
                counts["bytes"] += len(packet)
            except (BlockingIOError, OSError):           # ENOBUFS: the veth's queue is full
                counts["dropped"] += 1


class DelayRelay:
    """The relay process of one namespace, seen from the host: start it, move its delay, stop it."""

    def __init__(self, exec_prefix: list[str], tun: str, dev: str, mac: str, delay_ms: float) -> None:
        self.delay_ms = delay_ms
        self.counts: dict | None = None
        self.proc = subprocess.Popen(
            [*exec_prefix, sys.executable, "-m", "testbed.delay_relay", "--tun", tun, "--dev", dev, "--mac", mac,
             "--delay-ms", str(delay_ms)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        first = self.proc.stdout.readline() if self.proc.stdout else ""
        if first.strip() != "ready":
            self.stop()
            raise RuntimeError(f"the delay relay on {tun} did not start: {first.strip()} "
                               f"{self.proc.stderr.read().strip() if self.proc.stderr else ''}".strip())

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def set_delay(self, delay_ms: float) -> None:
        if delay_ms != self.delay_ms and self.alive and self.proc.stdin:
            self.proc.stdin.write(f"{delay_ms}\n")
            self.proc.stdin.flush()
            self.delay_ms = delay_ms

    def stop(self) -> dict | None:
        """End the relay (end of its input); its counts, or None if it had to be killed."""
        try:
            out, _ = self.proc.communicate(input="" if self.alive else None, timeout=5)
            lines = (out or "").strip().splitlines()
            self.counts = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
        except (subprocess.TimeoutExpired, ValueError, OSError):
            self.proc.kill()
            self.proc.wait()
        return self.counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.delay_relay", description=__doc__.split("\n\n")[0])
    p.add_argument("--tun", required=True, help="the TUN device every route of the namespace leads to")
    p.add_argument("--dev", required=True, help="the site's veth, where delayed packets leave")
    p.add_argument("--mac", required=True, help="the MAC address of the veth's other end (the host's)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="the one-way delay to start with")
    a = p.parse_args(argv)
    tun = open_tun(a.tun)
    print("ready", flush=True)
    counts = relay(tun, a.dev, bytes.fromhex(a.mac.replace(":", "")), a.delay_ms / 1000, sys.stdin.fileno())
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
