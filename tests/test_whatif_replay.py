"""The flight recorder and the what-if, end to end: a run through the three-sites scenario, its links
recorded as it measured them, `wantrain whatif` predicting its round time, and the run again over
the recording. The prediction is checked against the replayed run's rounds with a margin (a busy
machine stretches compute, which the prediction takes from the recorded run); bench/replay.py and
bench/placement.py measure how close they come."""

import json
import statistics
import subprocess
import sys

import pytest

from wantrain.config import RunConfig
from wantrain.launch.run import Run
from wantrain.telemetry import read_events, round_windows

from .helpers import wantrain


def rounds_after_the_first(run_dir) -> list[float]:
    return [t1 - t0 for r, (t0, t1) in sorted(round_windows(read_events(run_dir)).items()) if r > 0]


@pytest.mark.timeout(420)
@pytest.mark.xdist_group("heavy")     # two whole runs: never beside another heavy test (Makefile)
def test_the_whatif_prediction_holds_for_the_replayed_run(tmp_path):
    # Small batches (a quarter of the CPU a step): the round is still compute and the wire.
    cfg = RunConfig().replace(num_sites=3, **{"train.rounds": 4, "train.inner_steps": 8, "train.seed": 0,
                                              "model.seed": 0, "train.batch_size": 4, "model.block_size": 64})
    scenario: str = "three-sites"
    measured = {}
    for arm in ("recorded", "replayed"):
        with Run(cfg, run_dir=tmp_path / arm, site_threads=1, scenario=scenario) as run:
            for _ in run.follow(timeout_s=300):
                pass
        measured[arm] = statistics.median(rounds_after_the_first(tmp_path / arm))
        if arm == "recorded":
            r = subprocess.run([sys.executable, "-m", "testbed", "record", str(tmp_path / arm)], capture_output=True,
                               text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            scenario = r.stdout.strip()
            w = wantrain("whatif", str(tmp_path / arm), "--inner-steps", "16", "--json")
            assert w.returncode == 0, w.stderr
            said = json.loads(w.stdout.strip().splitlines()[-1])
    print(f"\nround s: predicted {said['predicted_round_s']:.2f}, replayed {measured['replayed']:.2f}, "
          f"recorded {measured['recorded']:.2f}")
    assert said["measured_round_s"] == pytest.approx(measured["recorded"], rel=1e-6)
    # twice the inner steps: a longer round, not more than twice as long (the wire's part is the same)
    assert said["predicted_round_s"] < said["whatif_round_s"] < 2 * said["predicted_round_s"]
    ratio = said["predicted_round_s"] / measured["replayed"]
    assert 0.5 < ratio < 2.0, (said, measured)
