"""The sites connected to a parameter server: one `SiteLink` each; `Sites`, which owns them and how
each comes and goes (admitted or refused on Join, sent the model or the updates it missed, resynced,
gone when its stream ends); and the checks on what a site says about itself (may it join, may it
open a lane, is its Ready true, is its hash report in order). The checks are pure: they raise
RejectedError or ProtocolError and change nothing. The rounds (server.py) read which sites are
ready and post to their outboxes; they never add or remove one."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ..transport.auth import Authenticator
from ..config import RunConfig
from ..errors import ProtocolError, Reject, RejectedError
from ..transport.limits import Limits, TokenBucket, safe_text
from ..transport.messages import PROTOCOL_VERSION, HashReport, Join, LaneOpen, LinkProbe, Ready, Welcome
from ..telemetry import Recorder
from .catchup import Catchup
from .downloads import Downloads
from .ledger import Ledger
from .model import GlobalModel

__all__ = ["SiteLink", "Sites", "check_join", "check_lane"]

log = logging.getLogger("wantrain.ps")


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
    lanes: int = 0                # Lane calls open (recovery.lanes: extra connections for its deltas)
    joined_at: float = field(default_factory=time.time)
    ended: tuple[Reject, str] | None = None   # why the PS ended this session (a new one replaced it)

    def __post_init__(self) -> None:
        self.probe_messages = TokenBucket(self.limits.probe_messages_burst, self.limits.probe_messages_per_s)
        self.probe_samples = TokenBucket(self.limits.probe_samples_burst, self.limits.probe_samples_per_s)

    def end(self, code: Reject, message: str) -> None:
        """The PS ends this session: its stream sends what is queued, then `code` (servicer.py)."""
        self.closed, self.ended = True, (code, message)
        self.outbox.put_nowait(None)

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


class Sites:
    """The connected sites by name, and their comings and goings. A site joins (or is refused),
    gets the model, or only the updates it missed if it holds an earlier one, says Ready, may be
    resynced after a hash mismatch, and leaves when its stream ends."""

    def __init__(self, cfg: RunConfig, auth: Authenticator, limits: Limits, ledger: Ledger, model: GlobalModel,
                 downloads: Downloads, catchup: Catchup, recorder: Recorder) -> None:
        self.cfg, self.auth, self.limits = cfg, auth, limits
        self.ledger, self.model, self.downloads, self.catchup, self.recorder = (ledger, model, downloads, catchup,
                                                                               recorder)
        self.links: dict[str, SiteLink] = {}    # connected now
        self.awaiting_model: set[str] = set()   # joined while a round was aggregating: the model after it
        self.told_finished: set[str] = set()    # sites that hold the final model, or were told the run is over

    def join(self, msg: Join, finished: bool, aggregating: bool) -> SiteLink:
        """Admit a site or raise RejectedError; queues the Welcome and the model download (or, while
        a round is `aggregating`, holds it until the commit: `send_awaited_models`). A site that
        is connected already replaces its session (`replace`)."""
        try:
            check_join(msg, self.cfg, self.auth, self.ledger.registry, self.ledger.round if finished else None)
        except RejectedError as e:
            if e.code == Reject.RUN_FINISHED:
                self.told_finished.add(msg.site)
            raise
        self.downloads.charge(msg.site)
        if (old := self.links.get(msg.site)) is not None:      # last: a refused Join changes nothing
            self.replace(old)
        # Named sites keep their place (and data shard) whatever order they join in.
        index, resumed = self.ledger.enrol(msg.site, self.cfg.sites.index(msg.site) if self.cfg.sites
                                           else len(self.ledger.registry))
        link = SiteLink(msg.site, index, msg.device, self.limits)
        self.links[msg.site] = link
        missed = self.catchup.for_join(msg, self.ledger.hashes) if resumed else None
        self.recorder.emit("join", site=msg.site, site_index=index, device=msg.device, resumed=resumed,
                           data_position=self.ledger.data_positions.get(msg.site, 0), catchup=missed is not None)
        log.info("site %s joined (index %d, %s)%s", msg.site, index, safe_text(msg.device, 64),
                 " again" if resumed else "")
        if missed is not None:     # it holds the model of resume_round: only the updates since follow
            self.send_model(link, (msg.resume_round, missed))
        elif aggregating:          # the model is about to change: send it after the round commits
            self.awaiting_model.add(link.name)
        else:
            self.send_model(link)
        return link

    def mark_ready(self, link: SiteLink, msg: Ready) -> None:
        """The site loaded its model: from now on it counts for rounds."""
        link.check_ready(msg, self.ledger.hashes)
        link.ready = True
        if msg.round == self.cfg.train.rounds:      # joined at the end
            self.holds_final(link.name)
        self.recorder.emit("ready", site=link.name, round=msg.round, since_join_s=time.time() - link.joined_at)

    def holds_final(self, name: str) -> None:
        """Site `name` holds the final model: the PS need not wait for it at the end (serve.py)."""
        self.told_finished.add(name)

    def ready(self) -> set[str]:
        return {name for name, link in self.links.items() if link.ready}

    def replace(self, old: SiteLink) -> None:
        """A site joined again while the PS still holds its session: the site restarted, or its end
        of the stream broke where the PS could not tell (a dead host, a dropped forward: found only
        by the keepalive, minutes later). The name's token proved it, so the new session takes the
        site's place and the old one ends with `replaced`, which a site does not retry: were two
        processes running under one name, the older stops and says why."""
        del self.links[old.name]
        self.awaiting_model.discard(old.name)
        old.end(Reject.REPLACED, f"this session of site {old.name!r} was replaced by a new one that joined the "
                                 "parameter server (the site restarted, or another process runs under its name)")
        self.recorder.emit("leave", site=old.name, reason="replaced by a new session of the site")
        log.warning("site %s joined again while its session was open: the new session replaces it", old.name)

    def leave(self, link: SiteLink, reason: str) -> bool:
        """Forget a site whose stream ended; False if `link` is no longer the site's (it rejoined)."""
        if self.links.get(link.name) is not link:
            return False
        link.closed = True
        del self.links[link.name]
        self.recorder.emit("leave", site=link.name, reason=reason)
        log.info("site %s left: %s", link.name, reason)
        return True

    def send_model(self, link: SiteLink, catchup: tuple[int, list] | None = None) -> None:
        """The Welcome and the model; or, with `catchup` (the round of the model the site holds and the
        messages since: catchup.py), a Welcome without model chunks and the updates of the rounds it missed."""
        ledger = self.ledger
        link.ready = False
        link.base_round = ledger.round if catchup is None else catchup[0]
        welcome = Welcome(ledger.run_id, link.index, self.cfg, link.base_round, ledger.hashes[link.base_round], 0,
                          ledger.data_positions.get(link.name, 0), *self.model.shard)
        if catchup is None:
            link.outbox.put_nowait(self.downloads.start(link.name, welcome))
            return
        for m in (welcome, *catchup[1]):
            link.outbox.put_nowait(m)
        self.recorder.emit("catchup", site=link.name, round=catchup[0], rounds=self.catchup.next_round - catchup[0],
                           mb=self.catchup.wire_bytes_since(catchup[0]) / 1e6, model_mb=4 * self.model.num_params / 1e6)

    def resync(self, link: SiteLink, h: HashReport, expected: str | None) -> None:
        """The site's replica differs from the PS's after round h.round: send it the model again."""
        self.recorder.emit("error", site=link.name, code="replica_mismatch",
                           message=f"site {link.name} has hash {h.model_hash} after round {h.round}, "
                                   f"the PS has {expected}; resyncing the site")
        log.error("replica mismatch at %s after round %d; resyncing", link.name, h.round)
        self.downloads.charge(link.name)
        self.send_model(link)

    def heard(self) -> list[SiteLink]:
        """The sites a committed round's update goes to: all but those waiting for the model."""
        return [link for name, link in self.links.items() if name not in self.awaiting_model]

    def send_awaited_models(self) -> None:
        """After a commit: the model to each site that joined while the round was aggregating."""
        for name in sorted(self.awaiting_model):
            if name in self.links:
                self.send_model(self.links[name])
        self.awaiting_model.clear()


def check_join(msg: Join, cfg: RunConfig, auth: Authenticator, registry: dict[str, int],
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
