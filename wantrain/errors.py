"""The one exception tree of wantrain.

Everything wantrain raises on purpose derives from WantrainError, so callers (the CLI, the
notebook widgets) can catch one type and show its message, which always names the problem.
"""

from __future__ import annotations

__all__ = [
    "WantrainError",
    "ConfigError",
    "DataError",
    "CodecError",
    "ProtocolError",
    "NonFiniteDeltaError",
    "RejectedError",
    "ConnectionLostError",
    "ProcessError",
    "ReplicaMismatchError",
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


class RejectedError(WantrainError):
    """The parameter server refused this site (duplicate name, version mismatch, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConnectionLostError(WantrainError):
    """The parameter server could not be reached, or the stream broke."""


class ProcessError(WantrainError):
    """A process of the run (PS or site) failed to start or exited with an error."""


class ReplicaMismatchError(WantrainError):
    """A replica's parameter hash differs from the parameter server's."""
