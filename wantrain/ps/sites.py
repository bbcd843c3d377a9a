"""The sites connected to a parameter server: one `SiteLink` each, and the checks on what a site
says about itself (may it join, may it open a lane, is its Ready true, is its hash report in
order). The checks are pure: they raise RejectedError or ProtocolError and change nothing; the PS
acts on them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..auth import Authenticator
from ..config import RunConfig
from ..errors import ProtocolError, Reject, RejectedError
from ..limits import Limits, TokenBucket
from ..messages import PROTOCOL_VERSION, HashReport, Join, LaneOpen, LinkProbe, Ready

__all__ = ["SiteLink", "check_join", "check_lane"]


@dataclass
class SiteLink:
    """One connected site, as the PS sees it."""

    name: str
    index: int
    device: str
    limits: Limits = field(default_factory=Limits, repr=False)
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    closed: bool = False
    ready: bool = False           # holds a model and can train (it said so after its download)
    base_round: int | None = None  # round of the model download in flight or last loaded
    last_hash_round: int = -1     # the last round whose hash the site reported
    lanes: int = 0                # Lane calls open (train.lanes: extra connections for its deltas)
    joined_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.probe_messages = TokenBucket(self.limits.probe_messages_burst, self.limits.probe_messages_per_s)
        self.probe_samples = TokenBucket(self.limits.probe_samples_burst, self.limits.probe_samples_per_s)

    def check_probe(self, p: LinkProbe) -> None:
        """Link probes are the one message the protocol does not bound per round, so they are rate-limited."""
        if not self.probe_messages.take():
            raise RejectedError(Reject.RATE_LIMITED, f"site {self.name!r} sends link probes faster than "
                                f"{self.limits.probe_messages_per_s:g} a second")
        if not self.probe_samples.take(len(p.rtt_ms)):
            raise RejectedError(Reject.RATE_LIMITED, f"site {self.name!r} reports RTT samples faster than "
                                f"{self.limits.probe_samples_per_s:g} a second")

    def check_ready(self, msg: Ready, hashes: dict[int, str]) -> None:
        if self.ready or self.base_round is None:
            raise ProtocolError(f"{self.name!r} says Ready, but no model download is waiting for it")
        if msg.round != self.base_round or hashes.get(msg.round) != msg.model_hash:
            raise ProtocolError(f"{self.name!r} says it loaded the model of round {msg.round} with hash "
                                f"{msg.model_hash}; the PS sent round {self.base_round} with hash "
                                f"{hashes.get(self.base_round)}")

    def check_hash_report(self, h: HashReport, committed: int) -> bool:
        """Each committed round at most once, in order; False when the report is about a model the
        site has already dropped (an update applied before the resync in flight): ignore it."""
        if h.round + 1 > committed:
            raise ProtocolError(f"hash report for round {h.round}, which has not been committed "
                                f"({committed} rounds are)")
        if h.round <= self.last_hash_round:
            raise ProtocolError(f"hash report for round {h.round} after one for round {self.last_hash_round}")
        self.last_hash_round = h.round
        return self.ready or (self.base_round is not None and h.round >= self.base_round)


def check_join(msg: Join, cfg: RunConfig, auth: Authenticator, connected: dict, registry: dict[str, int],
               finished_after: int | None) -> None:
    """May this site join now? RejectedError (with its Reject code) or ProtocolError if not."""
    if msg.protocol_version != PROTOCOL_VERSION:
        raise RejectedError(Reject.PROTOCOL_VERSION, f"site {msg.site!r} speaks wire protocol "
                            f"{msg.protocol_version}, this parameter server speaks {PROTOCOL_VERSION}")
    if auth.check(msg.site, msg.token) is not None:
        raise RejectedError(Reject.UNAUTHENTICATED, f"site {msg.site!r} is not allowed to join this run "
                                                    "(unknown site or wrong token)")
    if msg.resume_round > cfg.train.rounds:
        raise ProtocolError(f"join says the site's replica holds round {msg.resume_round}; "
                            f"the run has {cfg.train.rounds} rounds")
    if msg.site in connected:
        raise RejectedError(Reject.DUPLICATE_SITE, f"a site named {msg.site!r} is already connected; "
                                                   "each site needs its own name")
    if cfg.sites and msg.site not in cfg.sites:
        raise RejectedError(Reject.UNKNOWN_SITE, f"{msg.site!r} is not one of the run's sites "
                                                 f"({', '.join(cfg.sites)})")
    if msg.site not in registry and len(registry) >= cfg.num_sites:
        raise RejectedError(Reject.RUN_FULL, f"the run already has its {cfg.num_sites} sites "
                            f"({', '.join(sorted(registry))}); {msg.site!r} is not one of them")
    if finished_after is not None:
        raise RejectedError(Reject.RUN_FINISHED, f"the run finished after {finished_after} rounds")


def check_lane(msg: LaneOpen, auth: Authenticator, connected: dict[str, SiteLink], limits: Limits) -> SiteLink:
    """The joined site a Lane belongs to; RejectedError if the token is wrong, the site has no
    Session open, or it has `limits.max_lanes_per_site` lanes open already."""
    if auth.check(msg.site, msg.token) is not None:
        raise RejectedError(Reject.UNAUTHENTICATED, f"lane {msg.lane} of site {msg.site!r}: unknown site or "
                                                    "wrong token")
    link = connected.get(msg.site)
    if link is None or link.closed:
        raise RejectedError(Reject.UNKNOWN_SITE, f"lane {msg.lane} of site {msg.site!r}: the site has no Session "
                                                 "open (a lane carries a joined site's deltas)")
    if link.lanes >= limits.max_lanes_per_site:
        raise RejectedError(Reject.RATE_LIMITED, f"site {msg.site!r} has {link.lanes} lanes open already (at most "
                                                 f"{limits.max_lanes_per_site})")
    return link
