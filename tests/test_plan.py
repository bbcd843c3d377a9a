"""The run plan: one typed object from the scenario to the link emulator and the site's command line."""

import dataclasses
import json
import subprocess
import sys
import time

import pytest

from wantrain.launch.argv import links_command, site_args
from wantrain.launch.plan import PLAN_VERSION, Outage, PlanError, RunPlan
from wantrain.launch.run import describe_scenario

from .helpers import free_port


def test_a_plan_round_trips_through_json_and_names_a_bad_field(tmp_path):
    plan = describe_scenario("three-sites")
    assert plan.version == PLAN_VERSION and plan.names == ["us-west", "eu-west", "ap-southeast"]
    assert RunPlan.from_json(plan.to_json()) == plan
    assert RunPlan.read(plan.write(tmp_path / "p.json")) == plan
    d = plan.to_dict()
    d["sites"][1]["bandwith_mbps"] = 5                      # a typo names the field
    with pytest.raises(PlanError, match=r"field sites\[1\]\.bandwith_mbps is unknown"):
        RunPlan.from_dict(d)
    with pytest.raises(PlanError, match="version"):
        RunPlan.from_dict({**plan.to_dict(), "version": PLAN_VERSION + 1})
    with pytest.raises(PlanError, match="no site 'nowhere'"):
        plan.with_site("nowhere", speed_factor=2.0)


def test_testbed_rejects_an_edited_plan_it_cannot_run(tmp_path):
    plan = describe_scenario("three-sites").with_site("eu-west", loss=0.9)      # the emulator allows <= 0.5
    r = subprocess.run([sys.executable, "-m", "testbed", "links", "--plan", str(plan.write(tmp_path / "p.json")),
                        "--target", "127.0.0.1:1", "--listening", str(tmp_path / "l.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "site[1].loss" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_the_plan_wantrain_writes_is_the_plan_testbed_runs(tmp_path):
    """An edit made in wantrain (a speed factor, a bandwidth, an outage) reaches the running link
    emulator, which writes back exactly that plan plus where each site dials; that entry becomes
    the site's command line."""
    plan = describe_scenario("three-sites")
    plan = plan.with_site("eu-west", bandwidth_mbps=12.5, speed_factor=3.0, outages=(Outage(30.0, 5.0),),
                          chunk_loss=0.05, chunk_burst=4.0, chunk_late_s=2.5)
    plan = plan.with_site("ap-southeast", bandwidth_mbps=None)
    ps_port = free_port()
    listening = tmp_path / "links.json"
    argv = links_command(sys.executable, plan.write(tmp_path / "plan.json"), f"127.0.0.1:{ps_port}", listening,
                         tmp_path / "links.jsonl", tmp_path / "links.control")
    links = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while not listening.exists():
            assert links.poll() is None, links.stderr.read().decode()
            assert time.time() < deadline, "the link emulator did not listen"
            time.sleep(0.05)
        ran = RunPlan.read(listening)
        undialled = ran.replace(sites=tuple(dataclasses.replace(s, host=None, port=None, exec_prefix=())
                                            for s in ran.sites))
        assert undialled == plan
        eu = ran.site("eu-west")
        assert eu.dial is not None and eu.dial != f"127.0.0.1:{ps_port}"
        # The link logs the bandwidth in force, from the plan.
        deadline = time.time() + 30
        while True:
            log = tmp_path / "links.jsonl"      # written after links.json: maybe not there yet
            rows = [json.loads(ln) for ln in (log.read_text() if log.exists() else "").splitlines() if ln]
            samples = {r["site"]: r for r in rows if r["kind"] == "link"}
            if {"eu-west", "ap-southeast"} <= samples.keys():
                break
            assert time.time() < deadline, rows
            time.sleep(0.1)
        assert samples["eu-west"]["bandwidth_mbps"] == 12.5 and samples["ap-southeast"]["bandwidth_mbps"] is None
    finally:
        links.terminate()
        links.wait(10)
    # The site's command line carries its link's address, speed factor, RTT and bandwidth.
    args = site_args(f"127.0.0.1:{ps_port}", "eu-west", link=eu, token_file="/t")
    assert args[:3] == ("worker", "--ps", eu.dial)
    flags = dict(zip(args[1::2], args[2::2]))
    assert (float(flags["--speed-factor"]), float(flags["--link-mbps"]), float(flags["--link-rtt-ms"])) == \
        (3.0, 12.5, eu.rtt_ms)
    assert (float(flags["--chunk-loss"]), float(flags["--chunk-burst"]), float(flags["--chunk-late-s"])) == (0.05, 4.0, 2.5)
