"""The time-to-target harness (bench/time_to_target.py) in its quick form, as CI runs it: every arm is
a real run (a PS, three sites, the emulated links of the three-sites scenario). What it checks is
what does not depend on how busy the machine is: every arm ran and was measured, and the bytes
each arm's codec and schedule put on the wire per round stand in the order they must."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from wantrain.telemetry.compare import time_to_target

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))           # the harness's arms: bench/time_to_target.py


def _event(kind, t, **fields):
    return {"kind": kind, "t": t, **fields}


def test_time_to_target_from_events():
    events = []
    for r, (loss, start, end) in enumerate([(4.0, 10.0, 12.0), (3.0, 12.5, 15.0), (2.5, 15.5, 19.0)]):
        events.append(_event("round_start", start, round=r))
        for site, compute in (("a", 1.5), ("b", 2.5)):
            events.append(_event("site_round", end - 0.5, round=r, site=site, compute_s=compute, wire_bytes=1_000_000,
                                 steps=10, tokens=5120))
        events.append(_event("round_end", end, round=r, val_loss=loss, wire_bytes=500_000))
    o = time_to_target(events, 3.0)
    assert o.reached and o.round == 1 and o.time_s == 5.0 and o.val_loss == 3.0
    assert o.uplink_mb == 4.0 and o.downlink_mb == 2 * 1.0 and o.mb == 6.0
    # compute seconds / the rounds' wall time (round 0: 10 -> 12.5, the next start; round 1, the
    # target's: 12.5 -> 15, its commit)
    assert o.utilization == pytest.approx({"a": 3.0 / 5.0, "b": 5.0 / 5.0})
    assert (o.steps, o.tokens, o.compute_s) == (40, 4 * 5120, pytest.approx(2 * (1.5 + 2.5)))   # two sites, two rounds
    missed = time_to_target(events, 1.0)
    assert not missed.reached and missed.round == 2 and missed.time_s == 9.0
    assert time_to_target([], 3.0) is None
    # on a 2 s grid from round 0's start: round 1 committed 5 s in, so the model is first seen at
    # or below 3.0 at the 6 s tick; a commit on a tick is read at that tick
    on_grid = time_to_target(events, 3.0, cadence_s=2.0)
    assert (on_grid.round, on_grid.time_s, on_grid.commit_s) == (1, 6.0, 5.0)
    assert time_to_target(events, 1.0, cadence_s=3.0).time_s == 9.0


def bytes_per_round(arm: str) -> int:
    """One round of `arm`'s codec and schedule in this process (wantrain.studies.inprocess): every site's
    delta as sent, and the update as each of the three sites downloads it."""
    from time_to_target import SIZES, arm_config

    from wantrain.data import load_run_data
    from wantrain.studies.inprocess import InProcessRun

    size = {**SIZES["quick"], "inner_steps": 2}
    cfg = arm_config(arm, size, 0, ["us-west", "eu-west", "ap-southeast"])
    tok, corpus = load_run_data(cfg.data)
    run = InProcessRun(cfg, tok, corpus)
    start = run.start()
    sent = {name: run.train(name, 0, start)[1] for name in run.names}
    run.commit(0, sent)
    return sum(s.wire_bytes for s in sent.values()) + len(sent) * run.update_bytes[0]


@pytest.mark.timeout(300)
def test_each_arm_puts_the_bytes_its_codec_must_on_the_wire():
    """The byte ratios the quick harness once asserted over six real runs, from the same configs
    (bench/time_to_target.py's arms) in one process: they depend on the codec, not on the machine."""
    per_round = {arm: bytes_per_round(arm) for arm in ("sync-dp", "diloco-fp32", "diloco-int8", "diloco-int8-huffman")}
    # fp32 both ways is about 4x int8 (one fp32 scale per block of int8); Huffman takes a bit more off.
    assert 3.5 < per_round["diloco-fp32"] / per_round["diloco-int8"] < 4.1, per_round
    assert per_round["diloco-int8-huffman"] < 0.99 * per_round["diloco-int8"], per_round
    # A round of sync-dp (one inner step, fp32) costs exactly what a round of DiLoCo fp32 costs.
    assert per_round["sync-dp"] == per_round["diloco-fp32"], per_round


@pytest.mark.timeout(600)
@pytest.mark.xdist_group("heavy")     # never beside another heavy test (Makefile)
def test_the_quick_harness_measures_a_real_arm(tmp_path):
    """The harness itself, on one arm (a PS, three sites, the three-sites scenario's emulated links):
    it runs, stops, and measures what the table reports."""
    out = tmp_path / "ttt.json"
    arm = "diloco-int8-huffman"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_target.py"), "--quick", "--arms", arm,
                           "--out", str(out)], capture_output=True, text=True, timeout=540, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    arms = json.loads(out.read_text())["arms"]
    assert list(arms) == [arm] and arm in proc.stdout
    a = arms[arm]
    (rounds,) = a["rounds"]
    assert rounds >= 1 and all(math.isfinite(v) for v in a["val_loss"]) and a["mb"] > 0
    assert set(a["utilization"]) == {"us-west", "eu-west", "ap-southeast"}
    assert all(0 < u <= 1.05 for u in a["utilization"].values()), a["utilization"]
    # the work it took beside the time: every site's steps of every round up to the target
    assert a["steps"] >= 3 * rounds and a["tokens"] > a["steps"] and a["compute_s"] > 0


def test_counted_tokens_are_the_deltas_that_reached_the_model_in_time():
    from wantrain.telemetry.compare import counted_tokens

    events = [_event("round_start", 100.0, round=0), _event("round_start", 104.0, round=1)]
    for site, tokens in (("a", 10), ("b", 20), ("c", 40)):
        events.append(_event("site_round", 103.0, round=0, site=site, tokens=tokens))
    events += [_event("round_end", 104.0, round=0, sites=["a", "b"]),       # c missed round 0 ...
               _event("late_delta", 106.0, round=0, site="c", action="deferred"),   # ... and counts in round 1
               _event("site_round", 107.0, round=1, site="a", tokens=10),
               _event("site_round", 107.0, round=1, site="b", tokens=20),   # b's round 1 was dropped
               _event("late_delta", 109.0, round=1, site="b", action="dropped"),
               _event("round_end", 108.0, round=1, sites=["a"])]
    assert counted_tokens(events, 10.0) == {"a": 20, "b": 20, "c": 40}
    assert counted_tokens(events, 5.0) == {"a": 10, "b": 20}                 # round 1 committed 8 s in
    assert counted_tokens([], 5.0) == {}


def test_a_stored_figure_meets_a_goal_only_where_its_whole_spread_does():
    from wantrain.telemetry.compare import Spread, against, faster

    assert Spread.of([1.82, 0.46]) == Spread(1.82, 1.82 - 0.46, 1.82 + 0.46)        # mean ± sd
    assert Spread.of([32, 22, 32]) == Spread(32, 22, 32) and Spread.of(2.81) == Spread(2.81, 2.81, 2.81)
    assert against(Spread.of([1.82, 0.46]), at_least=1.3) == "met"
    assert against(Spread.of([1.83, 0.20]), at_least=2.0).startswith("cannot tell")
    assert against(Spread.of([1.24, 0.11]), at_least=2.0) == "not met"
    assert against(Spread.of(1.07), at_most=1.05) == "not met" and against(Spread.of(1.03), at_most=1.05) == "met"
    assert faster("a", Spread(20, 18, 22), "b", Spread(30, 25, 35)).startswith("a is faster")
    assert faster("a", Spread(32, 22, 32), "b", Spread(36, 32, 36)).startswith("cannot tell a and b apart")


def test_the_tutorials_verdicts_come_from_the_stored_figures_whatever_a_run_measured():
    """07 and 08 print their verdict from bench/published: the same lines every time they run."""
    from pathlib import Path

    from wantrain.telemetry.compare import loss_recovery_verdict, read_published, time_to_target_verdict

    published = Path(__file__).resolve().parents[1] / "bench" / "published"
    lines = loss_recovery_verdict(read_published(published / "loss_recovery.json"))
    assert any(ln.startswith("time to the target at 1 % loss") and ln.endswith(": met") for ln in lines)
    assert any(ln.startswith("time to the target at 10 % loss") and ln.endswith(": not met") for ln in lines)
    ttt = read_published(published / "time_to_target.json")
    lines = time_to_target_verdict(ttt, "three-sites")
    assert "cannot tell controller and time-budget apart" in lines[2]
    assert sum(ln.endswith(": not met") for ln in lines) == 3            # 2x, 95 %, 88 %: none met
    assert lines == time_to_target_verdict(ttt, "three-sites")
    assert set(ttt["scenarios"]) == {"three-sites", "comm-bound", "heterogeneous", "spiky"}
