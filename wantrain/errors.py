"""The one exception tree of wantrain.

Everything wantrain raises on purpose derives from WantrainError, so callers (the CLI, the
notebook widgets) can catch one type and show its message, which always names the problem.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "Reject",
    "WantrainError",
    "ConfigError",
    "DataError",
    "CodecError",
    "ProtocolError",
    "NonFiniteDeltaError",
    "DeltaRejectedError",
    "RejectedError",
    "ConnectionLostError",
    "ProcessError",
    "ReplicaMismatchError",
    "CorruptModelError",
    "DivergedError",
]


class WantrainError(Exception):
    """Base of every error wantrain raises on purpose."""


class ConfigError(WantrainError, ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


class DataError(WantrainError):
    """A corpus or tokenizer cannot be found or read."""


class CodecError(WantrainError, ValueError):
    """Data handed to the codec (or decoded from the wire) is malformed."""


class ProtocolError(WantrainError):
    """A peer sent a message that breaks the wantrain wire protocol."""


class NonFiniteDeltaError(ProtocolError):
    """A site's delta holds NaN or Inf: the site is quarantined for that round."""


class DeltaRejectedError(ProtocolError):
    """A site's delta is out of all proportion (its norm against the model's): quarantined for the round."""


class Reject(str, Enum):
    """Why the parameter server refused a site or ended its stream: the `code` of the Error message it
    sends first (docs/protocol.md maps each to its gRPC status)."""

    PROTOCOL_VERSION = "protocol_version"
    UNAUTHENTICATED = "unauthenticated"
    DUPLICATE_SITE = "duplicate_site"
    UNKNOWN_SITE = "unknown_site"
    RUN_FULL = "run_full"
    RUN_FINISHED = "run_finished"
    RATE_LIMITED = "rate_limited"
    INVALID_MESSAGE = "invalid_message"
    JOIN_TIMEOUT = "join_timeout"
    INTERNAL = "internal"

    def __str__(self) -> str:
        return self.value


class RejectedError(WantrainError):
    """The parameter server refused this site (duplicate name, version mismatch, ...).

    `code` is a `Reject` on the PS's side; a site keeps whatever code string the PS sent."""

    def __init__(self, code: Reject | str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConnectionLostError(WantrainError):
    """The parameter server could not be reached, or the stream broke."""


class ProcessError(WantrainError):
    """A process of the run (PS or site) failed to start or exited with an error."""


class ReplicaMismatchError(WantrainError):
    """A replica's parameter hash differs from the parameter server's."""


class CorruptModelError(ProtocolError):
    """The parameter server sent parameters or an update with NaN or Inf: the global model is broken."""


class DivergedError(WantrainError):
    """A site's local training produced a NaN or infinite loss or delta."""
