"""bench/loss_recovery.py in its quick form, as CI runs it: real processes (a PS, three sites, the
link emulator), every site losing 5 % of its delta's chunks on purpose, each 4.5 s after the others.
The reliable arm waits for every chunk; SALR counts the chunks in by the deadline (3 s, about four
times a round's compute: a busy machine must not make sites miss it whole), closes early within its
loss budget, and reconciles the rest when it comes, while the site trains on. How much sooner is
the bench's to measure (a busy machine moves every round time): this checks what each arm did."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(400)
def test_quick_loss_recovery_bench_counts_what_came_and_closes_without_the_rest(tmp_path):
    out = tmp_path / "loss_recovery.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "loss_recovery.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=360, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["arm"]: r for r in result["rows"]}
    assert set(rows) == {"reliable", "salr"} and result["late_s"] == 4.5 and result["deadline_s"] == 3.0
    reliable, salr = rows["reliable"], rows["salr"]
    assert reliable["rounds"] == salr["rounds"] == 5
    assert reliable["closes"]["complete"] == 5 and reliable["partial"] == reliable["substituted"] == 0
    assert salr["closes"]["complete"] < 5 and salr["partial"] > 0 and salr["substituted"] > 0
    assert salr["late_deltas"]["deferred"] + salr["late_deltas"]["dropped"] > 0    # the tails came
    assert "salr" in proc.stdout and "reliable" in proc.stdout
    for r in (reliable, salr):          # what the links carried, as the testbed counted it: the model and more
        assert r["link_down_mb"] > r["downlink_mb"] > 0 and r["link_up_mb"] > 0.5 * r["uplink_mb"] > 0, r
