"""When a site's stream to the PS ends by a failure: retry after a backoff, stop, or give up.

A site retries what waiting can fix (the PS unreachable or restarting, a broken stream, a rate
limit, its own old stream still open at the PS after a reset) with exponential backoff, says
why once per streak of failures, and gives up after `connect_timeout_s` without a session.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from ..transport import net
from ..errors import ConnectionLostError, Reject, RejectedError
from ..transport.tls import TLSClient

__all__ = ["Reconnect", "RETRYABLE_STATUS", "FAILURES"]

log = logging.getLogger("wantrain.site")

RETRYABLE_STATUS = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}
# How a session can fail: a write on a call that broke raises InvalidStateError; a read returns EOF
# (ConnectionLostError); the PS refuses (RejectedError) or the call fails (AioRpcError).
FAILURES = (grpc.aio.AioRpcError, asyncio.InvalidStateError, ConnectionLostError, RejectedError)


class Reconnect:
    """The retry policy of one site; `failed` decides, `succeeded` starts a new streak."""

    def __init__(self, ps: str, site: str, timeout_s: float, tls: TLSClient | None = None,
                 tls_server_name: str = "") -> None:
        self.ps, self.site, self.timeout_s, self.tls, self.tls_server_name = ps, site, timeout_s, tls, tls_server_name
        self.succeeded()

    def succeeded(self) -> None:
        self.backoff, self.cause = 0.5, ""
        self.first_failure: float | None = None

    async def failed(self, e: BaseException, joined_before: bool, welcomed: bool = False) -> bool:
        """After a failed session: True when the run is over (nothing to do), False after waiting to
        retry; raises when retrying cannot help. A session the PS had welcomed ends a streak of
        failures: the time unreachable counts from its end, not from before it."""
        if welcomed:
            self.succeeded()
        if isinstance(e, RejectedError) and e.code == Reject.RUN_FINISHED:
            # Away at the end, or (re)started after it, e.g. by a supervisor: nothing to do.
            log.info("site %s: the run has finished (%s); nothing left to do", self.site, e)
            return True
        # Retry a refusal only when waiting helps: a rate limit, or (a PS before "replaced") our old
        # stream still open after a reset, the PS not having noticed it yet. "replaced" is not
        # retried: a newer session of this site took its place, so another process runs as it.
        if isinstance(e, RejectedError) and not (
                e.code == Reject.RATE_LIMITED or (e.code == Reject.DUPLICATE_SITE and joined_before)):
            raise e
        rpc = e if isinstance(e, grpc.aio.AioRpcError) else None
        if rpc is not None and rpc.code() not in RETRYABLE_STATUS:
            raise ConnectionLostError(f"parameter server at {self.ps} refused {self.site!r}: "
                                      f"{rpc.code().name}: {rpc.details()}") from None
        why = (rpc.details() or rpc.code().name) if rpc is not None else str(e) or type(e).__name__
        now = time.time()
        if self.first_failure is None and rpc is not None and rpc.code() == grpc.StatusCode.UNAVAILABLE:
            self.cause = "; ".join(filter(None, [await asyncio.to_thread(net.explain_unreachable, a, self.tls,
                                                                         self.tls_server_name)
                                                 for a in self.ps.split(",")]))
        first = self.first_failure = self.first_failure or now
        because = f": {self.cause}" if self.cause else ""
        if now - first > self.timeout_s:
            raise ConnectionLostError(f"parameter server at {self.ps} not reachable for {self.timeout_s:.0f} s"
                                      f"{because or f' ({why})'}; giving up") from None
        log.warning("parameter server at %s not reachable (%s)%s; retrying in %.1f s", self.ps, why, because,
                    self.backoff)
        await asyncio.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, 5.0)
        return False
