"""What the parameter server checkpoints, and how it comes back from it (checkpoint.py writes the file)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import RunConfig
from ..errors import ConfigError

if TYPE_CHECKING:
    from .server import ParameterServer

__all__ = ["snapshot", "restore"]


def snapshot(ps: ParameterServer) -> dict:
    """Everything a restarted PS needs to go on where this one stands (after a committed round)."""
    return {"run_id": ps.run_id, "config_json": ps.cfg.to_json(), "round": ps.round,
            **ps.global_model.state_dict(), "hashes": dict(ps.hashes), "registry": dict(ps.registry),
            "data_positions": dict(ps.data_positions), "val_loss": ps.val_loss,
            "screen_norms": ps.screen.state_dict()}


def restore(ps: ParameterServer, saved: dict) -> None:
    """Load a snapshot into a freshly built PS; ConfigError if it belongs to another run or is damaged."""
    if RunConfig.from_json(saved["config_json"]) != ps.cfg:
        raise ConfigError(f"{ps.ckpt_path} was written by a run with a different config; "
                          "use a new run folder, or the config of that run")
    ps.global_model.load_state_dict(saved)
    ps.run_id, ps.round, ps.val_loss = saved["run_id"], int(saved["round"]), float(saved["val_loss"])
    ps.hashes = {int(k): v for k, v in saved["hashes"].items()}
    ps.registry = dict(saved["registry"])
    ps.data_positions = {k: int(v) for k, v in saved.get("data_positions", {}).items()}
    ps.screen.load_state_dict(saved.get("screen_norms", []))
    ps.hash = ps.global_model.hash()
    if ps.hash != ps.hashes.get(ps.round):
        raise ConfigError(f"{ps.ckpt_path} is damaged: its parameters hash to {ps.hash}, "
                          f"it says {ps.hashes.get(ps.round)}")
