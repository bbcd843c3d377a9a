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
    "SshError",
    "ShapingError",
    "ReplicaMismatchError",
    "CorruptModelError",
    "DivergedError",
    "TelemetryError",
    "MissingTelemetryError",
    "CheckpointError",
    "StateError",
    "WaitTimeoutError",
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
    DUPLICATE_SITE = "duplicate_site"    # sent by a PS before "replaced" (a site still retries it)
    UNKNOWN_SITE = "unknown_site"
    RUN_FULL = "run_full"
    RUN_FINISHED = "run_finished"
    RATE_LIMITED = "rate_limited"
    INVALID_MESSAGE = "invalid_message"
    JOIN_TIMEOUT = "join_timeout"
    REPLACED = "replaced"           # a new session of the same site joined: the old one ends
    INTERNAL = "internal"
    UNKNOWN = "unknown"             # a code this version does not know (never sent by this PS)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def from_wire(cls, code: str) -> Reject:
        """The Reject a received code string names; UNKNOWN for a code from a newer peer."""
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN


class RejectedError(WantrainError):
    """The parameter server refused this site (duplicate name, version mismatch, ...).

    `code` says why (`Reject`); a code a site does not know arrives as `Reject.UNKNOWN`."""

    def __init__(self, code: Reject, message: str) -> None:
        super().__init__(message)
        self.code = Reject(code)


class ConnectionLostError(WantrainError):
    """The parameter server could not be reached, or the stream broke."""


class ProcessError(WantrainError):
    """A process of the run (PS or site) failed to start or exited with an error."""


class SshError(ProcessError):
    """A remote host could not be used over SSH: unreachable, a key or host key refused, a lost
    connection. The message names the host and what to check; it never holds a secret."""


class ShapingError(ProcessError):
    """A site's link cannot be shaped on its host as the plan asks (no netem, no root, no such
    interface): the message says why, and nothing was left in place."""


class ReplicaMismatchError(WantrainError):
    """A replica's parameter hash differs from the parameter server's."""


class CorruptModelError(ProtocolError):
    """The parameter server sent parameters or an update with NaN or Inf: the global model is broken."""


class DivergedError(WantrainError):
    """A site's local training produced a NaN or infinite loss or delta."""


class TelemetryError(WantrainError, ValueError):
    """A telemetry event of an unknown kind, or an events.jsonl that cannot be read; names the line."""


class MissingTelemetryError(TelemetryError, FileNotFoundError):
    """There is no events.jsonl where one was expected."""


class CheckpointError(WantrainError, ValueError):
    """A checkpoint file this wantrain cannot use (another version, damaged)."""


class StateError(WantrainError, RuntimeError):
    """The run or the panel is not in a state where this can be done (start twice, act with no run)."""


class WaitTimeoutError(WantrainError, TimeoutError):
    """What was waited for did not happen in time (a process to exit, an event to arrive)."""
