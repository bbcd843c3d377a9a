"""The embedded WAN testbed: link traces and a userspace link emulator (no root needed).

`testbed` may import `wantrain`; `wantrain` never imports `testbed`: the training system runs
on a real WAN with no emulator. Kernel (namespaces, htb, nftables) and tcconfig backends are
not built yet.
"""

from .proxy import LinkProxy, LinkStats, mathis_rate_bps
from .regions import regions, rtt_ms
from .trace import LinkState, Outage, Spike, Trace, TraceError, synthetic

__all__ = ["LinkProxy", "LinkStats", "mathis_rate_bps", "regions", "rtt_ms", "LinkState", "Outage", "Spike",
           "Trace", "TraceError", "synthetic"]
