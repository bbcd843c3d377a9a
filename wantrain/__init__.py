"""wantrain: train one language model across GPU sites joined only by the WAN.

The public surface: configuration (`RunConfig` and its sections), the exception tree, the
codec, the processes of a run (`Run`), and the two roles (`ParameterServer`, `Site`). Heavy
modules (torch, gRPC) are imported on first use, so `import wantrain` stays cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# Every process wantrain forks execs at once (subprocess), so gRPC's fork handlers have nothing to
# do; when they run while another thread is in a call they print a warning into the notebook
# ("skipping fork() handlers"). Read when grpc is first imported, so set here, before that.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from .config import (CodecConfig, DataConfig, ModelConfig, RecoveryConfig, RenamedKeyWarning, RobustConfig, RunConfig,
                     ScheduleConfig, TrainConfig)
from .errors import (CodecError, ConfigError, ConnectionLostError, DataError, ProcessError, ProtocolError,
                     RejectedError, ReplicaMismatchError, WantrainError)

__version__ = "0.1.0"

_LAZY = {
    "Run": "wantrain.launch.run",
    "RunPlan": "wantrain.launch.plan",
    "ParameterServer": "wantrain.ps",
    "serve": "wantrain.ps",
    "Site": "wantrain.site",
    "SiteOptions": "wantrain.site",
    "Codec": "wantrain.codec",
    "ErrorFeedback": "wantrain.codec",
    "read_events": "wantrain.telemetry",
    "write_report": "wantrain.telemetry.report",
    "build_model": "wantrain.models",
}

__all__ = ["RunConfig", "ModelConfig", "DataConfig", "TrainConfig", "ScheduleConfig", "RecoveryConfig", "CodecConfig",
           "RobustConfig", "RenamedKeyWarning",
           "WantrainError", "ConfigError", "DataError", "CodecError", "ProtocolError", "RejectedError",
           "ConnectionLostError", "ProcessError", "ReplicaMismatchError", *_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'wantrain' has no attribute {name!r}")
