"""A run's telemetry as TensorBoard event files, for users who already look there.

`TensorBoardLog(dir).add(event)` takes the run's events as they come (Run does, with
`tensorboard=DIR`; `wantrain demo --tensorboard DIR`), and `export(run_dir, dir)` writes a finished
run's. Every scalar's step is the number of rounds committed when it was true (validation loss
at step 0 is the model before training; round r's figures are at step r + 1), its wall time the
event's own:

    loss/validation                  the global model's validation loss
    loss/train/<site>                a site's mean training loss over its round
    wire/uplink_mb/<site>            a site's delta on the wire, MB
    wire/uplink_ratio/<site>         how many times smaller than fp32
    wire/downlink_mb                 the round's update, as each site downloads it, MB
    round/seconds                    the round's start to its commit
    time/<part>/<site>               seconds of the site's round spent on each part of
                                     wantrain.telemetry.round_time (written once the next round starts)
    controller/budget_s/<site>       the compute budget schedule.controller "adaptive" gave it

and two text summaries: `controller`, each decision with its reason, and `events`, what happened to
the run besides its rounds (run_tables.py: faults, outages, alerts, quarantines, missed deadlines,
joins and leaves), one entry per event. TensorBoard's own reader (EventAccumulator) reads them
back: tests/test_tensorboard_log.py. The `tensorboard` package is an extra (`pip install
wantrain[tensorboard]`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .round_time import PARTS, round_splits
from .tables import INCIDENT_KINDS, describe
from . import on_wire, read_events

__all__ = ["TensorBoardLog", "export"]

class TensorBoardLog:
    """Event files in `log_dir`, written as the run's events are added."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise ConfigError("TensorBoard event files need the tensorboard package: "
                              "pip install 'wantrain[tensorboard]'") from None
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.log_dir))
        self._rounds: list[dict] = []       # round_start, site_round, round_end: what the split reads
        self._split_done: set[tuple[int, str]] = set()
        self.round = 0                      # rounds committed so far: the step of what comes now

    def add(self, e: dict) -> None:
        kind, t = e["kind"], e["t"]
        if kind == "run_start" and e.get("val_loss") is not None:
            self._scalar("loss/validation", e["val_loss"], 0, t)
        elif kind == "site_round" and not e.get("late"):
            step, site = e["round"] + 1, e["site"]
            self._scalar(f"loss/train/{site}", e["train_loss"], step, t)
            self._scalar(f"wire/uplink_mb/{site}", on_wire(e) / 1e6, step, t)
            self._scalar(f"wire/uplink_ratio/{site}", e["ratio"], step, t)
        elif kind == "round_end":
            self.round = e["round"] + 1
            self._scalar("loss/validation", e["val_loss"], self.round, t)
            self._scalar("wire/downlink_mb", on_wire(e) / 1e6, self.round, t)
            self._scalar("round/seconds", e["round_s"], self.round, t)
        elif kind == "controller":
            self._scalar(f"controller/budget_s/{e['site']}", e["budget_s"], e["round"] + 1, t)
            self._text("controller", f"round {e['round']}, {e['site']}: {e['budget_s']:.2f} s: {e['reason']}",
                       e["round"] + 1, t)
        elif kind in INCIDENT_KINDS:
            self._text("events", describe(e), self.round, t)
        if kind in ("round_start", "site_round", "round_end"):
            self._rounds.append(e)
        if kind in ("round_start", "run_end"):      # a round's window has closed: its split is known
            self._write_splits(t)

    def _write_splits(self, t: float) -> None:
        for s in round_splits(self._rounds):
            if (s["round"], s["site"]) not in self._split_done:
                self._split_done.add((s["round"], s["site"]))
                for part in PARTS:
                    self._scalar(f"time/{part}/{s['site']}", s[f"{part}_s"], s["round"] + 1, t)

    def _scalar(self, tag: str, value: float, step: int, t: float) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step, t)

    def _text(self, tag: str, text: str, step: int, t: float) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[text.encode()],          # 7: DT_STRING
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self._event(Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=tensor)]), step, t)

    def _event(self, summary, step: int, t: float) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self._writer.add_event(Event(wall_time=t, step=step, summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def export(run_dir: str | Path, log_dir: str | Path) -> Path:
    """A finished (or stopped) run's events.jsonl as event files in `log_dir`; returns it."""
    with TensorBoardLog(log_dir) as log:
        for e in read_events(run_dir):
            log.add(e)
    return Path(log_dir)
