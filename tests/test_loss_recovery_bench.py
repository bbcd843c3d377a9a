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
sys.path.insert(0, str(ROOT / "bench"))           # the bench's summary: bench/lr_report.py
import lr_report  # noqa: E402


@pytest.mark.timeout(400)
def test_quick_loss_recovery_bench_counts_what_came_and_closes_without_the_rest(tmp_path):
    out = tmp_path / "loss_recovery.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "loss_recovery.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=360, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["arm"]: r for r in result["rows"]}
    # SALR without hedges (the quick size's: with them, the few lost chunks all go again in time)
    assert set(rows) == {"reliable", "salr-no-hedge"} and result["late_s"] == 4.5 and result["deadline_s"] == 3.0
    reliable, salr = rows["reliable"], rows["salr-no-hedge"]
    assert reliable["rounds"] == salr["rounds"] == 5
    assert reliable["closes"]["complete"] == 5 and reliable["partial"] == reliable["substituted"] == 0
    assert salr["closes"]["complete"] < 5 and salr["partial"] > 0 and salr["substituted"] > 0
    assert salr["late_deltas"]["deferred"] + salr["late_deltas"]["dropped"] > 0    # the tails came
    assert "salr-no-hedge" in proc.stdout and "reliable" in proc.stdout
    for r in (reliable, salr):          # what the links carried, as the testbed counted it: the model and more
        assert r["link_down_mb"] > r["downlink_mb"] > 0 and r["link_up_mb"] > 0.5 * r["uplink_mb"] > 0, r
    table = (tmp_path / "loss_recovery" / "table.md").read_text()      # the run folder, beside the rows
    assert "| 5 % | salr-no-hedge | 0.7 | 1 |" in table and "| 5 % | reliable | 0.7 | 1 |" in table
    assert (tmp_path / "loss_recovery" / "curves.html").stat().st_size > 0
    assert (tmp_path / "loss_recovery" / "plotly.min.js").exists()       # the page opens offline


def _row(arm: str, seed: int, final: float, to_target: float | None, p99: float, up: float, lr: float = 0.7) -> dict:
    return dict(arm=arm, seed=seed, outer_lr=lr, final_val_loss=final, reached=to_target is not None,
                time_to_target_s=to_target, p50_after_warmup_s=p99 / 2, p99_after_warmup_s=p99, link_up_mb=up,
                chunk_loss=0.05, burst=1.0, blackout_every_s=0.0, blackout_s=0.0, spikes_per_min=0.0,
                packet_loss=0.0, region="", bandwidth_mbps=0.0, curve=[(1.0, 3.0), (2.0, 2.4)],
                closes=dict(complete=3, early=1, deadline=12, extended=0))


def test_the_summary_pairs_each_run_with_b0_of_its_seed_at_each_arms_best_rate():
    rows = [_row("reliable", 0, 2.0, 100.0, 10.0, 40.0), _row("reliable", 1, 2.5, 120.0, 12.0, 40.0),
            _row("salr", 1, 2.5 * 1.02, 40.0, 3.0, 44.0), _row("salr", 0, 2.0 * 1.01, None, 5.0, 42.0),
            _row("salr", 0, 9.0, 10.0, 1.0, 40.0, lr=1.0), _row("salr", 1, 9.0, 10.0, 1.0, 40.0, lr=1.0)]
    by_arm = {e["arm"]: e for e in lr_report.summary(rows)}
    salr = by_arm["salr"]
    assert salr["outer_lr"] == 0.7 and salr["seeds"] == salr["paired"] == 2      # lr 1.0 diverged: not shown
    assert salr["gap_pct"][0] == pytest.approx(1.5) and salr["gap_pct"][1] == pytest.approx(0.7071, abs=1e-4)
    assert salr["speedup"] == (pytest.approx(3.0), 0.0) and salr["never"] == 1     # seed 1 only: 120 / 40
    assert salr["p99_ratio"] == pytest.approx((10 / 5 + 12 / 3) / 2) and salr["up_ratio"] == pytest.approx(1.075)
    assert by_arm["reliable"]["gap_pct"] == (0.0, 0.0)
    assert "| 5 % | salr | 0.7 | 2 | 2.2850 ±0.3748 | +1.50 % ±0.71 | 3.00x (1 never) |" in lr_report.markdown(rows, 2.4)

