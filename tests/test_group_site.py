"""A site that is a torch.distributed group (issue 13): `wantrain worker --nproc 2` runs two CPU
processes under torchrun on gloo, beside single-process sites. Rank 0 speaks to the PS; both
ranks take DDP inner steps on their own batches; their replicas are compared (hashes gathered on
rank 0) after every round, and the site's replica matches the PS's like any other site's."""

import re

import pytest

from wantrain.launch.run import Run
from wantrain.telemetry import read_events, rows

from .cluster import check_run
from .helpers import small_config


@pytest.mark.timeout(300)
def test_a_two_process_gloo_site_trains_beside_single_process_sites(tmp_path):
    rounds = 3
    cfg = small_config(**{"sites": ["a", "b", "c"], "train.rounds": rounds, "train.inner_steps": 10})
    with Run(cfg, run_dir=tmp_path / "run", nproc={"b": 2}) as run:      # b: `wantrain worker --nproc 2`
        assert list(run.follow(timeout_s=240))[-1]["kind"] == "run_end"
        codes = run.wait_exit(60)
    assert all(code == 0 for name, code in codes.items() if name.startswith("site")), codes
    events = read_events(tmp_path / "run")
    log = (tmp_path / "run" / "site-b.log").read_text()
    check_run(events, rounds)                 # b's replica (rank 0's) equals the PS's every round
    assert all(e["sites"] == ["a", "b", "c"] for e in rows(events, "round_end"))
    agree = re.findall(r"round (\d+), 2 ranks agree on replica (\w+) after (\d+) steps", log)
    assert [int(r) for r, _, _ in agree] == list(range(rounds)), log[-3000:]
    hashes = {e["round"]: e["model_hash"] for e in rows(events, "round_end")}
    b_checks = [c for c in rows(events, "hash_check") if c["site"] == "b"]
    assert b_checks and all(c["ok"] and c["site_hash"] == hashes[c["round"]] for c in b_checks)
