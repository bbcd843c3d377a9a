"""No field a site sends sizes the PS's memory (issue 55): tests/field_sweep.py, in a process of its
own so that its resident size is its own, sweeps every numeric field of every delta message (and
their bytes, and a chunk payload's own header words) to its extremes through the PS's checks and
decoding, and reports how far memory rose above where it stood, beyond the message itself."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_no_field_a_site_sends_sizes_the_ps_memory():
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "field_sweep.py")], capture_output=True, text=True,
                          timeout=280, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["errors"] == []                           # every case refused as bad input, or taken
    assert r["cases"] > 5000 and r["refused"] > 3000 and r["taken"] > 500
    # Python's and numpy's allocations, exactly; the resident size with 2 MiB for the allocator's
    # arenas (pages come in blocks), both in units of the run's largest chunk as float32.
    assert r["traced_growth"] <= 2.0, (r["traced_growth"], r["traced_case"])
    slack = 2 * (1 << 20) / max(r["largest_chunk_bytes"].values())
    assert r["rss_growth"] <= 2.0 + slack, (r["rss_growth"], r["rss_case"])
    # The reported attack: a valid-looking chunk whose quant_block is not the run's.
    assert r["quant_block"] and set(r["quant_block"].values()) == {"refused"}, r["quant_block"]
    assert any(k.endswith("quant_block=4294967295") for k in r["quant_block"])
