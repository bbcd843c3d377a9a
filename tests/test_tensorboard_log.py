"""A run's telemetry as TensorBoard event files (wantrain/telemetry/tensorboard.py), read back by
TensorBoard's own reader. The live path, through `wantrain demo --tensorboard`, is checked on a real
run in tests/test_panel.py."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from wantrain.telemetry.round_time import PARTS
from wantrain.telemetry.tensorboard import TensorBoardLog


def _events():
    site = dict(train_loss=3.0, wire_bytes=2_000_000, ratio=4.4, download_s=0.0, decode_s=0.0, compute_s=2.0,
                encode_s=0.1, turnaround_s=2.2, first_in_s=2.3, arrived_s=2.8, upload_s=0.5, steps=10, steps_ahead=0,
                late=False)
    return [
        {"kind": "run_start", "t": 99.0, "val_loss": 5.5},
        {"kind": "join", "t": 99.5, "site": "a"},
        {"kind": "round_start", "t": 100.0, "round": 0},
        {"kind": "site_round", "t": 102.9, "round": 0, "site": "a", **site},
        {"kind": "round_end", "t": 104.0, "round": 0, "val_loss": 4.0, "wire_bytes": 1_000_000, "round_s": 4.0,
         "closed_s": 3.6},
        {"kind": "controller", "t": 104.5, "round": 1, "site": "a", "budget_s": 3.5, "comm_s": 0.4,
         "reason": "its link costs 0.40 s a round"},
        {"kind": "round_start", "t": 104.5, "round": 1},
        {"kind": "fault", "t": 105.0, "action": "kill site", "site": "a"},
        {"kind": "site_round", "t": 107.0, "round": 1, "site": "a", **{**site, "train_loss": 2.5}},
        {"kind": "round_end", "t": 108.0, "round": 1, "val_loss": 3.0, "wire_bytes": 1_000_000, "round_s": 3.5,
         "closed_s": 3.2},
        {"kind": "run_end", "t": 108.1, "rounds": 2},
    ]


def test_tensorboards_reader_reads_the_loss_bytes_time_decisions_and_events(tmp_path):
    with TensorBoardLog(tmp_path / "tb") as log:
        for e in _events():
            log.add(e)
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    val = acc.Scalars("loss/validation")
    assert [(s.step, s.value, s.wall_time) for s in val] == [(0, 5.5, 99.0), (1, 4.0, 104.0), (2, 3.0, 108.0)]
    assert [s.value for s in acc.Scalars("loss/train/a")] == [3.0, 2.5]
    assert [s.value for s in acc.Scalars("wire/uplink_mb/a")] == pytest.approx([2.0, 2.0])
    assert [s.value for s in acc.Scalars("wire/downlink_mb")] == pytest.approx([1.0, 1.0])
    assert {f"time/{p}/a" for p in PARTS} <= set(tags["scalars"])
    waiting = acc.Scalars("time/waiting/a")
    assert [s.step for s in waiting] == [1, 2] and waiting[0].value == pytest.approx(0.8)   # 3.6 - 2.8
    texts = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("events")]
    assert texts == ["a joined", "fault injected: kill site a"]
    # the controller's decisions: each site's budget, and why
    assert [(s.step, s.value) for s in acc.Scalars("controller/budget_s/a")] == [(2, 3.5)]
    assert acc.Tensors("controller")[0].tensor_proto.string_val[0].decode() == \
        "round 1, a: 3.50 s: its link costs 0.40 s a round"


def test_without_tensorboard_installed_the_error_says_what_to_install(monkeypatch, tmp_path):
    import builtins

    from wantrain.errors import ConfigError

    real = builtins.__import__

    def no_tensorboard(name, *args, **kw):
        if name.startswith("tensorboard"):
            raise ImportError(name)
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ConfigError, match=r"pip install 'wantrain\[tensorboard\]'"):
        TensorBoardLog(tmp_path / "tb")


def test_a_run_whose_tensorboard_files_fail_goes_on_without_them(tmp_path, caplog):
    from wantrain.launch.run import Run

    from .helpers import small_config

    run = Run(small_config(), run_dir=tmp_path / "run", tensorboard=tmp_path / "tb")

    def broken(event):
        raise OSError("disk full")

    run.tensorboard.add = broken
    run._to_tensorboard({"kind": "round_start", "t": 1.0, "round": 0})     # the watch thread's call
    assert run.tensorboard is None and "the run goes on without them" in caplog.text
    run._to_tensorboard({"kind": "round_start", "t": 2.0, "round": 1})     # and later events are let be
