"""How a site shows a model download: a bar on a terminal, else a log line every quarter."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

__all__ = ["DownloadProgress"]

log = logging.getLogger("wantrain.site")


class DownloadProgress:
    """Progress of one model download. Small models (fewer than 8 chunks) download in a blink and say nothing."""

    def __init__(self, site: str, chunks: int) -> None:
        self.site, self.chunks, self.done, self.bytes = site, chunks, 0, 0
        self.t0 = time.monotonic()
        self.quiet = chunks < 8
        self.bar = tqdm(total=chunks, unit="chunk", desc=f"{site}: model download", leave=False,
                        disable=self.quiet or not sys.stderr.isatty())
        self.next_quarter = 1

    def update(self, nbytes: int) -> None:
        self.done += 1
        self.bytes += nbytes
        self.bar.update(1)
        if self.bar.disable and not self.quiet and 4 * self.done >= self.next_quarter * self.chunks:
            self.next_quarter += 1
            mb, s = self.bytes / 1e6, time.monotonic() - self.t0
            log.info("site %s: model download %d %% (%.0f MB in %.1f s, %.1f MB/s)", self.site,
                     100 * self.done // self.chunks, mb, s, mb / max(s, 1e-9))

    def close(self) -> None:
        self.bar.close()
