"""The round-time model behind `wantrain place` (wantrain/launch/round_model.py), and the command itself."""

import re

import pytest

from wantrain.launch.round_model import SiteCost, predict_round

from .helpers import wantrain


def test_the_slowest_sites_way_through_the_round_sets_it():
    sites = [SiteCost("near", compute_s=1.0, rtt_s=0.01, mbps=100, encode_s=0.1, apply_s=0.05),
             SiteCost("far", compute_s=1.0, rtt_s=0.2, mbps=8)]
    p = predict_round(sites, up_bytes=1e6, down_bytes=2e6, ps_s=0.3, lanes=False)
    assert p.slowest == "far"
    assert p.parts["far"] == pytest.approx({"latency": 0.2, "download": 2.0, "apply": 0.0, "compute": 1.0,
                                            "encode": 0.0, "upload": 1.0})
    assert p.round_s == pytest.approx(0.2 + 2.0 + 1.0 + 1.0 + 0.3)
    assert p.reason().startswith("far: 2.00 s download, 1.00 s")
    # over lanes a delta waits for its manifest's ack and its metrics for every chunk's: three round trips
    assert predict_round(sites, 1e6, 2e6, 0.3, lanes=True).parts["far"]["latency"] == pytest.approx(0.6)
    # a link that is not the bottleneck moves bytes in no time
    assert predict_round([SiteCost("lan", 1.0, 0.0)], 1e9, 1e9).round_s == 1.0
    with pytest.raises(ValueError):
        predict_round([], 1, 1)


@pytest.mark.timeout(120)
def test_place_ranks_every_region_and_names_what_sets_each():
    r = wantrain("place", "--scenario", "three-sites", "--inner-steps", "2")
    assert r.returncode == 0, r.stderr
    rows = [m.groups() for ln in r.stdout.splitlines() if (m := re.match(r"\s*\d+ (.+?)\s+(\d+\.\d+)  (.*)", ln))]
    assert len(rows) == 11                                      # every region the testbed knows
    times = [float(t) for _, t, _ in rows]
    assert times == sorted(times)
    assert [region for region, _, why in rows if "(the scenario's)" in why] == ["East US"]
    assert rows[0][0] == "Southeast Asia"                       # beside the slowest site (speed factor 1.5)
    assert all(why.split(":")[0] in ("us-west", "eu-west", "ap-southeast") for _, _, why in rows)
    # the PS's part is timed here (the codec, once the last delta is in), never a blank 0.00 s
    ps_s = {float(m.group(1)) for _, _, why in rows if (m := re.search(r"PS (\d+\.\d+) s", why))}
    assert len(ps_s) == 1 and ps_s.pop() > 0, rows
    bad = wantrain("place", "--scenario", "three-sites", "--from-run", "/no/such/run")
    assert bad.returncode == 2 and "run folder /no/such/run does not exist" in bad.stderr
