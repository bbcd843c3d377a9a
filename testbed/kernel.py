"""The kernel link backend (root, Linux): a network namespace per site, shaped by the kernel.

Each site gets a namespace joined to the host by a veth pair (host side `wt<k>h`, 10.231.k.1;
site side `wt<k>s`, 10.231.k.2; our own test hosts, nothing else is ever addressed):

    rate     htb on the sending side of each direction (host veth for the downlink, the site's
             veth inside the namespace for the uplink)
    loss     nftables `numgen random` drops on the receiving side of each direction
    outage   nftables drops everything on the receiving side (dropping on the sender's own
             interface kills the TCP connection after about 8 s; on the receiver TCP just waits)
    delay    netem where the kernel has it; where it does not (this project's CI kernels), the
             delay comes from the proxy's delay line placed in front (see `needs_proxy_delay`),
             or, with `relay=True`, from the delay relay (delay_relay.py): every route in the
             namespace leads to a TUN device whose reader holds each packet, then sends it out
             on the veth; so any protocol, to any peer, is delayed, with no proxy in the path
    peers    with `peer_to_peer=True` the host forwards between site namespaces (gloo, libp2p:
             sites that connect to each other), and its loss and outage rules cover that traffic

Every requested effect is read back from the kernel (`tc -j`, `nft -j`) and a missing one is an
error that says which. `destroy()` (also on errors, and `cleanup_all()` for leftovers of a killed
process) removes every namespace, link and nftables table this module made.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .delay_relay import DelayRelay

__all__ = ["KernelLink", "KernelBackendError", "check_support", "netem_available", "cleanup_all", "htb_rates",
           "site_end"]

PREFIX = "wt"
SUBNET = "10.231"


class KernelBackendError(RuntimeError):
    """The kernel backend cannot do what was asked here; the message says what is missing."""


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise KernelBackendError(f"`{' '.join(argv)}` failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _bits(rate: str) -> float:
    """tc's rate text ('20Mbit', '512Kbit', '1Gbit', '800bit') in bit/s."""
    m = re.fullmatch(r"([\d.]+)([KMG]?)bit", rate)
    if not m:
        raise KernelBackendError(f"cannot read tc rate {rate!r}")
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def htb_rates(where: list[str], dev: str) -> list[float]:
    """The rates (bit/s) of the htb classes on `dev` (`where`: a prefix such as `ip netns exec NS`)."""
    text = _run(where + ["tc", "class", "show", "dev", dev]).stdout   # no JSON for classes here
    return [_bits(m) for m in re.findall(r"htb \S+ .*?rate (\S+)", text)]


def check_support() -> None:
    """Raise KernelBackendError naming the first missing requirement (root, ip, tc, nft)."""
    if os.geteuid() != 0:
        raise KernelBackendError(f"the kernel backend needs root (running as uid {os.geteuid()}); "
                                 "use the proxy backend, which needs none")
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise KernelBackendError(f"the kernel backend needs `{tool}` (Debian package {pkg})")


_netem: bool | None = None


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (probed once, on a throwaway veth pair)."""
    global _netem
    if _netem is None:
        ns = f"{PREFIX}-netem-probe-{os.getpid()}"
        try:
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
            r = _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"],
                     check=False)
            _netem = r.returncode == 0
        finally:
            _run(["ip", "netns", "del", ns], check=False)
    return _netem


def site_end(host_ip: str) -> tuple[str, str]:
    """(address, interface) of the site's end of the veth whose host end has `host_ip`: what a
    program inside the namespace advertises to its peers, and binds (gloo's GLOO_SOCKET_IFNAME)."""
    m = re.fullmatch(rf"{re.escape(SUBNET)}\.(\d+)\.1", host_ip)
    if not m:
        raise KernelBackendError(f"{host_ip} is not the host end of a kernel link ({SUBNET}.K.1)")
    return f"{SUBNET}.{m.group(1)}.2", f"{PREFIX}{m.group(1)}s"


def _free_index() -> int:
    used = set(_run(["ip", "-o", "link", "show"]).stdout.split())
    for k in range(1, 250):
        if f"{PREFIX}{k}h:" not in used and f"{PREFIX}{k}h@if" not in " ".join(used):
            if not any(tok.startswith(f"{PREFIX}{k}h") for tok in used):
                return k
    raise KernelBackendError("no free link index (250 kernel links in use?)")


@dataclass
class KernelLink:
    """One site's namespace and veth pair, shaped by htb, nftables and (if present) netem."""

    site: str
    rate_mbps: float = math.inf
    loss: float = 0.0
    delay_ms: float = 0.0           # one way, each direction
    relay: bool = False             # delay every packet by the TUN relay (no netem, no proxy needed)
    peer_to_peer: bool = False      # the host forwards between sites' namespaces

    def __post_init__(self) -> None:
        self.k: int | None = None
        self.down = False
        self._relay: DelayRelay | None = None
        self._forwards = False          # this link holds the host's forwarding on
        self._applied: tuple[float, float, float, bool] | None = None     # what apply() last put in force
        self._applied_rules = False
        self._carried: dict[tuple[str, str], list[int]] = {}     # counts of rules since flushed

    # ---------------------------------------------------------------- names
    @property
    def ns(self) -> str:
        return f"{PREFIX}-{self.k}-{self.site}"[:60]

    @property
    def host_if(self) -> str:
        return f"{PREFIX}{self.k}h"

    @property
    def site_if(self) -> str:
        return f"{PREFIX}{self.k}s"

    @property
    def host_ip(self) -> str:
        return f"{SUBNET}.{self.k}.1"

    @property
    def site_ip(self) -> str:
        return f"{SUBNET}.{self.k}.2"

    @property
    def table(self) -> str:
        return f"{PREFIX}_{self.k}"

    @property
    def tun_if(self) -> str:
        return f"{PREFIX}{self.k}d"

    @property
    def needs_proxy_delay(self) -> bool:
        return self.delay_ms > 0 and not self.relay and not netem_available()

    def exec_prefix(self) -> list[str]:
        """Prefix a command line with this to run it inside the site's namespace."""
        return ["ip", "netns", "exec", self.ns]

    # ---------------------------------------------------------------- lifecycle
    def create(self) -> KernelLink:
        check_support()
        self.k = _free_index()
        self._applied, self._applied_rules, self._carried = None, False, {}
        try:
            _run(["ip", "netns", "add", self.ns])
            _run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.site_if, "netns", self.ns])
            _run(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if])
            _run(["ip", "link", "set", self.host_if, "up"])
            _run(["ip", "-n", self.ns, "addr", "add", f"{self.site_ip}/30", "dev", self.site_if])
            _run(["ip", "-n", self.ns, "link", "set", self.site_if, "up"])
            _run(["ip", "-n", self.ns, "link", "set", "lo", "up"])
            # One packet per MTU, as on a real path: without this, veth carries 64 KB GSO/GRO
            # super-packets and a random drop would take out 45 segments at once.
            for where, dev in (([], self.host_if), (["-n", self.ns], self.site_if)):
                _run(["ip", *where, "link", "set", "dev", dev, "gso_max_size", "1500", "gro_max_size", "1500"])
            for where in ([], self.exec_prefix()):
                _run(where + ["nft", "add", "table", "inet", self.table])
                _run(where + ["nft", "add", "chain", "inet", self.table, "input",
                              "{ type filter hook input priority -10; policy accept; }"])
            if self.peer_to_peer:
                _run(["nft", "add", "chain", "inet", self.table, "forward",
                      "{ type filter hook forward priority -10; policy accept; }"])
                _forwarding(+1)
                self._forwards = True
            if self.relay:
                self._start_relay()
            self.apply(self.rate_mbps, self.loss, self.delay_ms, False)
        except Exception:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Remove the namespace (and with it the site's veth end and its rules), the host veth
        end and the host table. Never raises; safe to call twice."""
        if self.k is None:
            return
        if self._relay:
            self._relay.stop()
            self._relay = None
        if self._forwards:
            _forwarding(-1)
            self._forwards = False
        _run(["nft", "delete", "table", "inet", self.table], check=False)
        _run(["ip", "link", "del", self.host_if], check=False)
        _run(["ip", "netns", "del", self.ns], check=False)
        self.k = None

    def _start_relay(self) -> None:
        """Every route of the namespace to the TUN device, whose reader (the relay) sends each
        packet out on the veth when its delay is over."""
        ns = ["ip", "-n", self.ns]
        _run(ns + ["tuntap", "add", "dev", self.tun_if, "mode", "tun"])
        _run(ns + ["link", "set", self.tun_if, "up", "mtu", "1500"])
        # Replies come in on the veth while the route back leads to the TUN: no reverse-path check.
        for conf in ("all", "default", self.site_if):
            _run(self.exec_prefix() + ["sysctl", "-q", "-w", f"net.ipv4.conf.{conf}.rp_filter=0"])
        _run(ns + ["route", "del", f"{SUBNET}.{self.k}.0/30", "dev", self.site_if])
        _run(ns + ["route", "add", "default", "dev", self.tun_if, "src", self.site_ip])
        mac = Path(f"/sys/class/net/{self.host_if}/address").read_text().strip()
        try:
            self._relay = DelayRelay(self.exec_prefix(), self.tun_if, self.site_if, mac, 2 * self.delay_ms)
        except RuntimeError as e:
            raise KernelBackendError(str(e)) from None

    def __enter__(self) -> KernelLink:
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()

    # ---------------------------------------------------------------- shaping
    def apply(self, rate_mbps: float, loss: float, delay_ms: float, down: bool) -> None:
        """Put a link state in force (both directions), then check that the kernel has it. Only what
        changed is redone: a trace moves its delay every step, which the relay takes in stride."""
        before = self._applied
        self.rate_mbps, self.loss, self.delay_ms, self.down = rate_mbps, loss, delay_ms, down
        self._applied = (rate_mbps, loss, delay_ms, down)
        kernel_delay = delay_ms if netem_available() and not self.relay else 0.0
        if self._relay:         # the whole round trip's delay on the site's sending side
            self._relay.set_delay(2 * delay_ms)
        redo_tc = before is None or before[0] != rate_mbps or (kernel_delay > 0 and before[2] != delay_ms)
        redo_nft = before is None or (before[1], before[3]) != (loss, down)
        if redo_tc:
            self._apply_tc(rate_mbps, kernel_delay)
        if redo_nft:
            self._apply_nft(loss, down)
        if redo_tc or redo_nft:
            self.verify()

    def _apply_tc(self, rate_mbps: float, kernel_delay: float) -> None:
        for where, dev in (([], self.host_if), (self.exec_prefix(), self.site_if)):
            _run(where + ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
            if not math.isinf(rate_mbps):
                _run(where + ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])
                _run(where + ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                              "rate", f"{rate_mbps}mbit", "ceil", f"{rate_mbps}mbit"])
                if kernel_delay > 0:
                    _run(where + ["tc", "qdisc", "add", "dev", dev, "parent", "1:10", "netem", "delay",
                                  f"{kernel_delay}ms"])
            elif kernel_delay > 0:
                _run(where + ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", f"{kernel_delay}ms"])

    def _apply_nft(self, loss: float, down: bool) -> None:
        # Receiving side of each direction: the site's namespace for the downlink, the host
        # (packets arriving from the site's veth) for the uplink; with peers, the host's forward
        # hook is the receiving side of what a site sends another. The counts so far are kept.
        if self._applied_rules:
            self._carried = self._counts()
        self._applied_rules = True
        for where, chain in self._chains():
            match = ["iifname", self.host_if] if not where else []
            _run(where + ["nft", "flush", "chain", "inet", self.table, chain])
            _run(where + ["nft", "add", "rule", "inet", self.table, chain, *match, "counter"])
            if down:
                _run(where + ["nft", "add", "rule", "inet", self.table, chain, *match, "counter", "drop"])
            elif loss > 0:
                threshold = int(round(loss * 1_000_000))
                _run(where + ["nft", "add", "rule", "inet", self.table, chain, *match, "numgen", "random",
                              "mod", "1000000", "<", str(threshold), "counter", "drop"])

    def verify(self) -> None:
        """Read the shaping back from the kernel; raise naming any effect that is not in place."""
        for where, dev in (([], self.host_if), (self.exec_prefix(), self.site_if)):
            qdiscs = json.loads(_run(where + ["tc", "-j", "qdisc", "show", "dev", dev]).stdout or "[]")
            kinds = {q.get("kind") for q in qdiscs}
            if not math.isinf(self.rate_mbps) and "htb" not in kinds:
                raise KernelBackendError(f"rate limit on {dev} is not in place (qdiscs: {sorted(kinds)})")
            if self.delay_ms > 0 and netem_available() and not self.relay and "netem" not in kinds:
                raise KernelBackendError(f"netem delay on {dev} is not in place")
            if not math.isinf(self.rate_mbps):
                rates = htb_rates(where, dev)
                want = self.rate_mbps * 1e6
                if not any(abs(r - want) <= 0.01 * want for r in rates):
                    raise KernelBackendError(f"htb on {dev} has rates {rates} bit/s, wanted {want:.0f}")
        for where, chain in self._chains():
            rules = self._rules(where, chain)
            drops = [r for r in rules if any("drop" in e for e in r["expr"])]
            if (self.down or self.loss > 0) != bool(drops):
                raise KernelBackendError(f"nftables drop rule in {'the site namespace' if where else 'the host'} "
                                         f"({chain}) is {'missing' if not drops else 'left over'}")
        if self._relay and not self._relay.alive:
            raise KernelBackendError(f"the delay relay of {self.ns} has stopped (exit code {self._relay.proc.poll()})")

    def _chains(self) -> list[tuple[list[str], str]]:
        return [(self.exec_prefix(), "input"), ([], "input")] + ([([], "forward")] if self.peer_to_peer else [])

    def _rules(self, where: list[str], chain: str = "input") -> list[dict]:
        out = json.loads(_run(where + ["nft", "-j", "list", "chain", "inet", self.table, chain]).stdout)
        return [x["rule"] for x in out["nftables"] if "rule" in x]

    def _counts(self) -> dict[tuple[str, str], list[int]]:
        """{(unit, direction): [seen, dropped]} since create(), rule flushes included."""
        out = {k: list(v) for k, v in self._carried.items()}
        for where, chain in self._chains():
            direction = "downlink" if where else "uplink"
            for r in self._rules(where, chain):
                counter: dict = next((e["counter"] for e in r["expr"] if "counter" in e), {})
                for unit in ("packets", "bytes"):
                    counts = out.setdefault((unit, direction), [0, 0])
                    counts[1 if any("drop" in e for e in r["expr"]) else 0] += counter.get(unit, 0)
        return out

    def counters(self, unit: str = "packets") -> dict[str, tuple[int, int]]:
        """Packets (or `unit="bytes"`) (seen, dropped) on the receiving side of each direction:
        {'downlink': ..., 'uplink': ...}; a site's traffic to other sites counts in its uplink."""
        counts = self._counts()
        return {d: (counts.get((unit, d), [0, 0])[0], counts.get((unit, d), [0, 0])[1]) for d in ("downlink", "uplink")}


_forwarders = 0
_forwarding_was = "0"


def _forwarding(change: int) -> None:
    """Count links that need the host to forward between namespaces; on for the first, back to what
    it was after the last."""
    global _forwarders, _forwarding_was
    sysctl = Path("/proc/sys/net/ipv4/ip_forward")
    if change > 0 and _forwarders == 0:
        _forwarding_was = sysctl.read_text().strip()
        sysctl.write_text("1")
    _forwarders += change
    if change < 0 and _forwarders == 0:
        sysctl.write_text(_forwarding_was)


def cleanup_all() -> list[str]:
    """Remove every namespace, link and table this module could have left behind; returns names."""
    removed = []
    for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(f"{PREFIX}-"):
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    for tok in _run(["ip", "-o", "link", "show"], check=False).stdout.split():
        name = tok.split("@")[0].rstrip(":")
        if name.startswith(PREFIX) and name[len(PREFIX):-1].isdigit() and name.endswith("h"):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    if shutil.which("nft"):
        tables = json.loads(_run(["nft", "-j", "list", "tables"], check=False).stdout or '{"nftables": []}')
        for t in tables.get("nftables", []):
            name = t.get("table", {}).get("name", "")
            if name.startswith(f"{PREFIX}_"):
                _run(["nft", "delete", "table", "inet", name], check=False)
                removed.append(name)
    return removed
