"""bench/robustness.py in its quick form, as CI runs it: one hostile site per attack family against
the PS's default screen, wantrain's own code in one process (wantrain.studies.inprocess). The goals of
issues 26 and 55, on one seed of short runs: with two and three sites the run ends within 2 % of
the same run without the attacker (at two, by the commit check), no honest delta rejected or left
out, an alert raised; and the default screen changes no bit of an honest run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_quick_robustness_bench_meets_its_goals(tmp_path):
    out = tmp_path / "robustness.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "robustness.py"), "--quick", "--jobs", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=560, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "vs absent" in proc.stdout and "goals: all met" in proc.stdout, proc.stdout[-3000:]
    rows = {(r["sites"], r["attack"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(n, a) for n in (2, 3) for a in ("honest", "absent", "tiny", "reversed")} | {
        (3, "honest-trusted")}
    for attack in ("tiny", "reversed"):
        three, two = rows[(3, attack)], rows[(2, attack)]
        assert three["goal"] and three["vs_absent"] <= 0.02 and three["honest_rejected"] == 0
        assert three["hostile_counted"] == "0/4"                  # rejected every round ...
        assert three["alert"] == [2]                              # ... and named after alert_after rounds
        # Two sites: the commit check leaves the hostile delta out; the run ends within 2 % of the
        # honest site alone.
        assert two["goal"] and two["vs_absent"] <= 0.02 and two["honest_rejected"] == 0 and two["alert"] == [2]
    assert rows[(2, "honest")]["goal"] and rows[(2, "honest")]["honest_rejected"] == 0   # no false alarm
    assert rows[(3, "honest-trusted")]["final"] == rows[(3, "honest")]["final"]
