"""The flight recorder (testbed/record.py): a run's measured links written as a scenario the testbed
loads and replays, on a run folder written by hand with the PS's own recorder. Replaying a real run
and comparing its round times is bench/replay.py's."""

import time

import pytest

from testbed.record import record
from testbed.scenario import ScenarioError, load_scenario
from wantrain.launch.emulator import describe_scenario
from wantrain.telemetry import Recorder


def test_a_runs_links_replay_as_it_measured_them(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(describe_scenario("three-sites").to_json())
    t0 = time.time() - 100
    rec = Recorder(run / "events.jsonl", start_time=t0)
    rec.record_reported({"kind": "links_start", "t": t0})
    rec.record_reported({"kind": "link_rtt", "t": t0 + 10, "site": "us-west", "times": [t0 + 0.5, t0 + 1.2, t0 + 3.1],
                         "rtt_ms": [80.0, 90.0, 70.0]})
    for site in ("eu-west", "ap-southeast"):
        rec.record_reported({"kind": "link_rtt", "t": t0 + 10, "site": site, "times": [t0 + 1.0], "rtt_ms": [200.0]})
    rec.record_reported({"kind": "outage_start", "t": t0 + 20, "site": "ap-southeast"})
    rec.record_reported({"kind": "outage_end", "t": t0 + 26.5, "site": "ap-southeast"})
    rec.close()

    sc = load_scenario(record(run))
    assert (sc.name, sc.ps_region, sc.time_scale) == ("replay-run", "East US", 1.0)
    sites = {s.name: s for s in sc.sites}
    assert [s.speed_factor for s in sc.sites] == [1.0, 1.25, 1.5]          # three-sites' speeds kept
    up, _ = sc.traces(sites["us-west"])
    # one-way delays a second from the links' start: RTT / 2, the first sample's before it came
    assert [up.at(t).delay_ms for t in (0.2, 1.5, 2.5, 3.5)] == [40.0, 45.0, 45.0, 35.0]
    assert up.at(0.5).bandwidth_mbps == 1000.0                              # the plan's bandwidth
    assert [(o.start_s, o.duration_s) for o in sites["ap-southeast"].outages] == [(20.0, 6.5)]
    down, _ = sc.traces(sites["ap-southeast"])
    assert down.at(22.0).bandwidth_mbps == 0.0 and down.at(30.0).bandwidth_mbps == 50.0


def test_a_run_without_a_plan_has_no_links_to_record(tmp_path):
    with pytest.raises(ScenarioError, match="no plan.json"):
        record(tmp_path)
