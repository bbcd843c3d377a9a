"""What a round should take, from what each site's round costs: the model behind `wantrain place`
(and, later, the what-if and the controller). Pure: numbers in, numbers out.

A round's wall time on the PS's clock is its slowest site's way through it (round_time.py's parts,
in order) and then the PS's own time:

    round_s = max over sites of (in flight + download + apply + compute + encode + upload) + ps_s

with a site's time in flight one round trip (the update's first chunk out, the delta's first back),
or three over lanes (the chunks wait for the manifest's acknowledgement, and the metrics that
close the delta for every chunk's: protocol.md 4b), and its
download and upload the update's and the delta's bytes at the link's bandwidth. What it leaves
out: TCP's slow start and loss (a lossy or long path carries less than its bandwidth), spikes
and outages, and the sites' waiting on each other beyond the slowest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SiteCost", "Prediction", "predict_round"]


@dataclass(frozen=True)
class SiteCost:
    """One site's round, as measured or assumed."""

    name: str
    compute_s: float              # its inner steps
    rtt_s: float                  # its link's round trip to the PS
    mbps: float | None = None     # its link's bandwidth each way; None: not the bottleneck
    encode_s: float = 0.0
    apply_s: float = 0.0          # decoding and adding the update


@dataclass(frozen=True)
class Prediction:
    round_s: float
    slowest: str                                   # the site whose way through the round sets it
    parts: dict[str, dict[str, float]] = field(default_factory=dict)   # site -> part -> seconds (round_time's names)
    ps_s: float = 0.0

    def reason(self) -> str:
        """Why the round takes what it does, in words."""
        p = self.parts[self.slowest]
        big = sorted(((s, k) for k, s in p.items() if s >= 0.005), reverse=True)
        ps = f"{self.ps_s:.2f}" if self.ps_s >= 0.1 else f"{self.ps_s:.3f}"     # milliseconds at small sizes
        return f"{self.slowest}: " + ", ".join(f"{s:.2f} s {k}" for s, k in big) + f"; PS {ps} s"


def predict_round(sites: list[SiteCost], up_bytes: float, down_bytes: float, ps_s: float = 0.0,
                  lanes: bool = True) -> Prediction:
    """The round's wall time: each site's parts (seconds), the slowest, and the PS's time after it."""
    if not sites:
        raise ValueError("a round needs at least one site")
    parts = {}
    for s in sites:
        per_byte = 8 / (s.mbps * 1e6) if s.mbps else 0.0
        parts[s.name] = {"latency": s.rtt_s * (3 if lanes else 1), "download": down_bytes * per_byte,
                         "apply": s.apply_s, "compute": s.compute_s, "encode": s.encode_s, "upload": up_bytes * per_byte}
    slowest = max(parts, key=lambda n: sum(parts[n].values()))
    return Prediction(sum(parts[slowest].values()) + ps_s, slowest, parts, ps_s)
