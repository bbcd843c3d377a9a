"""A model download to one site: chunks encoded one at a time, never a copy per site.

A download reads the PS's live parameters as it goes. If a round commits while downloads are
in flight, the PS first freezes the old parameters once (`freeze`), shared by every download
still at that round, so each site receives exactly the model its Welcome announced; a frozen
download keeps its copy through any later commits. Memory per download is one chunk; per PS
one extra copy of the model per round that committed during a download still in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .codec import Codec, plan_chunks
from .messages import MODEL, TensorChunk, Welcome

__all__ = ["ModelDownload", "live_views"]


def live_views(model) -> dict[str, np.ndarray]:
    """Flat float32 numpy views (no copy) of a CPU float32 model's parameters."""
    from .replica import named_params
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
        self.welcome = Welcome(welcome.run_id, welcome.site_index, welcome.config, welcome.round,
                               welcome.model_hash, len(self.plan), welcome.data_position)
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
