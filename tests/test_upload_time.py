"""`site_round.upload_s` is the delta's time on the wire: from the site handing over its first chunk
to the PS holding the last, on one clock. Checked against a link of known rate (the userspace
link emulator paces it); `send_s`, the site's send calls, is not wire time and says so."""

from __future__ import annotations

import statistics

import pytest

from wantrain.launch.run import Run
from wantrain.telemetry import read_events, rows

from .helpers import small_config

RATE_MBPS = 8.0
SCENARIO = f'''name = "upload-time"
ps_region = "East US"
time_scale = 1.0

[[site]]
name = "slow"
region = "East US"
bandwidth_mbps = {RATE_MBPS}

[[site]]
name = "fast"
region = "East US"
'''


@pytest.mark.timeout(300)
def test_upload_time_is_the_wire_time_of_a_link_of_known_rate(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    # fp32 deltas (3.2 MB): the link's burst allowance (64 KB at once after an idle spell) is 2 % of one.
    cfg = small_config(num_sites=2, **{"train.rounds": 4, "train.inner_steps": 10, "codec.mode": "fp32"})
    with Run(cfg, run_dir=tmp_path / "run", scenario=str(tmp_path / "s.toml")) as run:
        for _ in run.follow(timeout_s=250):
            pass
        run.wait_exit(60)
    mine = [e for e in rows(read_events(tmp_path / "run"), "site_round") if e["site"] == "slow"]
    assert len(mine) == 4
    # The link carries RATE_MBPS; the delta's bytes at that rate are its time on the wire (the link's
    # one-way delay, same region, is a few ms). Within 20 %, by the median of the rounds.
    ratios = [e["upload_s"] / (e["received_wire_bytes"] * 8 / (RATE_MBPS * 1e6)) for e in mine]
    assert 0.8 <= statistics.median(ratios) <= 1.2, ratios
    # The send calls return once gRPC and the link have the bytes buffered: not wire time.
    assert statistics.median(e["send_s"] for e in mine) < 0.5 * statistics.median(e["upload_s"] for e in mine), mine
