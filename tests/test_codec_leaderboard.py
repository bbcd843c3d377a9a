"""bench/codec_leaderboard.py in its quick form, as CI runs it: DiLoCo in one process with fp32,
INT8 + Huffman and top-k deltas, every byte counted; what the bits and losses are is the bench's
to measure at its full size, this checks that it counts them and writes its run folder."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(400)
def test_quick_codec_leaderboard_counts_every_byte_and_writes_its_folder(tmp_path):
    out = tmp_path / "codec_leaderboard.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "codec_leaderboard.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=360, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["codec"]: r for r in result["rows"]}
    assert set(rows) == {"fp32", "int8-huffman", "topk-1b"}
    for r in rows.values():
        assert {"codec", "bits_per_param", "loss_gap_pct", "encode_mb_s", "decode_mb_s"} <= set(r)
        assert r["encode_mb_s"] > 0 and r["decode_mb_s"] > 0
        assert r["val"][-1] < r["val"][0]                       # it trained
    # fp32 is 32 bits a parameter, and the chunks' framing a little more; up, a site's protection
    # besides (manifest, critical copies, parity: full in its first round, fading on a clean link)
    assert 32 < rows["fp32"]["downlink_bits_per_param"] < 32.5
    assert rows["fp32"]["downlink_bits_per_param"] + 0.5 < rows["fp32"]["bits_per_param"] < 36
    assert rows["fp32"]["loss_gap_pct"] == 0
    assert 7 < rows["int8-huffman"]["bits_per_param"] < 8.5              # the paper's codec: under 8 bits
    assert rows["topk-1b"]["bits_per_param"] < 0.3                      # 1/64 kept: positions, signs, scales
    assert result["speeds"]["tiny"]["zstd-1"]["encode_mb_s"] > 0         # zstd beside them, same delta
    folder = tmp_path / "codec_leaderboard"
    table = (folder / "table.md").read_text()
    assert "| tiny | topk-1b | 1 |" in table and "zstd level 1" in table
    assert (folder / "pareto.html").stat().st_size > 0 and (folder / "plotly.min.js").exists()
