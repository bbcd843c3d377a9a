"""Model downloads to sites: chunks encoded one at a time, never a copy per site.

A download reads the PS's live parameters as it goes. If a round commits while downloads are
in flight, the PS first freezes the old parameters once (`freeze`), shared by every download
still at that round, so each site receives exactly the model its Welcome announced; a frozen
download keeps its copy through any later commits. Memory per download is one chunk; per PS
one extra copy of the model per round that committed during a download still in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from ..codec import Codec, plan_chunks
from ..errors import Reject, RejectedError
from ..transport.limits import Limits
from ..transport.messages import MODEL, TensorChunk, Welcome
from ..models.params import named_params
from ..telemetry import Recorder

__all__ = ["ModelDownload", "Downloads", "live_views"]


def live_views(model) -> dict[str, np.ndarray]:
    """Flat float32 numpy views (no copy) of a CPU float32 model's parameters."""
    return {k: p.detach().view(-1).numpy() for k, p in named_params(model).items()}


class ModelDownload:
    """Welcome, then the model chunks, produced lazily by `messages()`.

    `on_progress(chunks_sent, chunks, bytes_sent)` is called each time another tenth of the
    chunks has been handed to the stream (HTTP/2 flow control keeps that close to what arrived),
    so a watcher far away can show a download's progress."""

    def __init__(self, welcome: Welcome, source: dict[str, np.ndarray], codec: Codec,
                 on_progress: Callable[[int, int, int], None] | None = None) -> None:
        self.codec = codec
        self.plan = plan_chunks({k: v.size for k, v in source.items()}, codec.cfg.chunk_elements())
        self.welcome = dataclasses.replace(welcome, model_chunks=len(self.plan))
        self.source = source
        self.frozen = False       # True once `source` is a copy, no longer the live parameters
        self.sent = 0
        self.bytes_sent = 0
        self.finished = False
        self.on_progress = on_progress

    def freeze(self, copy: dict[str, np.ndarray]) -> None:
        """Read from `copy` (the parameters at this download's round) from now on."""
        self.source, self.frozen = copy, True

    def messages(self) -> Iterator[Welcome | TensorChunk]:
        yield self.welcome
        n = len(self.plan)
        for i, spec in enumerate(self.plan):
            part = self.source[spec.tensor][spec.offset: spec.offset + spec.length]
            enc, _ = self.codec.encode(part)
            yield TensorChunk(MODEL, self.welcome.round, i, n, spec, enc)
            self.sent, self.bytes_sent = i + 1, self.bytes_sent + enc.wire_bytes
            if self.on_progress and 10 * self.sent // n > 10 * i // n:      # another tenth is out
                self.on_progress(self.sent, n, self.bytes_sent)
        self.finished = True


class Downloads:
    """Every model download of one PS: what each site may still download, and those in flight.

    A download costs the PS the model's size in bandwidth, so a site gets a bounded number per
    window (`Limits.downloads_allowed`)."""

    def __init__(self, views: dict[str, np.ndarray], codec: Codec, limits: Limits, recorder: Recorder,
                 num_params: int) -> None:
        self.views, self.codec, self.limits, self.recorder = views, codec, limits, recorder   # live parameters
        self.model_bytes = 4 * num_params
        self.in_flight: list[ModelDownload] = []     # reading the live parameters, or a frozen copy
        self.started: dict[str, deque[float]] = {}  # when each site's recent downloads began

    def charge(self, site: str) -> None:
        """Count one download against `site`; RejectedError(RATE_LIMITED) when it has had its share."""
        recent = self.started.setdefault(site, deque())
        now = time.monotonic()
        while recent and now - recent[0] > self.limits.download_window_s:
            recent.popleft()
        if len(recent) >= self.limits.downloads_allowed(self.model_bytes):
            wait = self.limits.download_window_s - (now - recent[0])
            raise RejectedError(Reject.RATE_LIMITED, f"site {site!r} has downloaded the model {len(recent)} times "
                                f"in {self.limits.download_window_s:.0f} s; try again in {wait:.0f} s")
        recent.append(now)

    def start(self, site: str, welcome: Welcome) -> ModelDownload:
        """A download of the live model to `site`, announced by `welcome`; progress goes to the telemetry."""
        def progress(sent: int, chunks: int, nbytes: int) -> None:     # for watchers: a tenth more is out
            self.recorder.emit("download", site=site, chunks=sent, of=chunks, mb=nbytes / 1e6)

        download = ModelDownload(welcome, self.views, self.codec, on_progress=progress)
        self.in_flight = [d for d in self.in_flight if not d.finished] + [download]
        return download

    async def freeze(self, round_: int) -> None:
        """Before the parameters change: downloads still reading the live parameters get one shared
        frozen copy of them. A download frozen at an earlier round keeps its copy: it must deliver
        the model its Welcome announced, however many rounds commit while it is in flight."""
        self.in_flight = [d for d in self.in_flight if not d.finished]
        live = [d for d in self.in_flight if not d.frozen]
        if live:
            frozen = await asyncio.to_thread(lambda: {k: v.copy() for k, v in self.views.items()})
            for d in live:
                d.freeze(frozen)
            self.recorder.emit("downloads_frozen", round=round_, downloads=len(live))
