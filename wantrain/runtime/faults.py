"""Fault-injection points: a process told to stall in a phase sleeps there, so a test can kill it
at exactly that point (`--stall PHASE=SECONDS` or `PHASE@ROUND=SECONDS` on `wantrain ps` and
`wantrain worker`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from ..errors import ConfigError

__all__ = ["Stalls", "parse_stalls"]


def parse_stalls(specs: list[str] | None) -> dict[str, float]:
    """`--stall` arguments ("PHASE=SECONDS", "PHASE@ROUND=SECONDS") as a dict."""
    stalls = {}
    for spec in specs or []:
        phase, _, seconds = spec.partition("=")
        try:
            stalls[phase] = float(seconds)
        except ValueError:
            raise ConfigError(f"--stall takes PHASE=SECONDS, got {spec!r}") from None
    return stalls


class Stalls:
    """Where to stall and for how long: "phase" for every round, "phase@round" for one."""

    def __init__(self, stalls: dict[str, float] | Iterable[tuple[str, float]] | None = None,
                 log: logging.Logger | None = None, on_stall=None) -> None:
        self.stalls = dict(stalls or {})
        self.log = log or logging.getLogger("wantrain")
        self.on_stall = on_stall          # called (phase, round, seconds) before sleeping: telemetry

    def seconds(self, phase: str, round_: int) -> float:
        return self.stalls.get(f"{phase}@{round_}", self.stalls.get(phase, 0.0))

    def _announce(self, phase: str, round_: int) -> float:
        seconds = self.seconds(phase, round_)
        if seconds:
            self.log.warning("stalling %.1f s in phase %s of round %d (fault injection)", seconds, phase, round_)
            if self.on_stall:
                self.on_stall(phase, round_, seconds)
        return seconds

    def sleep(self, phase: str, round_: int) -> None:
        time.sleep(self._announce(phase, round_))

    async def asleep(self, phase: str, round_: int) -> None:
        await asyncio.sleep(self._announce(phase, round_))
