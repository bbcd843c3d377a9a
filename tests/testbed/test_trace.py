import math

import numpy as np
import pytest

from testbed import Outage, Spike, Trace, TraceError, regions, rtt_ms, synthetic


def test_csv_round_trip_and_queries(tmp_path):
    t = Trace.from_rows([(0, 10, 100, 0), (2, 50, math.inf, 0.01), (5, 20, 0, 0)], name="x")
    t.save_csv(tmp_path / "x.csv")
    back = Trace.load_csv(tmp_path / "x.csv")
    assert np.array_equal(back.t_s, t.t_s) and np.array_equal(back.bandwidth_mbps, t.bandwidth_mbps)
    assert back.at(1.99).delay_ms == 10 and back.at(2).delay_ms == 50 and back.at(100).down
    assert back.duration_s == 8.0
    looped = back.looped()
    assert looped.at(8.5).delay_ms == 10 and looped.at(10.5).delay_ms == 50


def test_scaling_and_resampling():
    t = synthetic(40, 100, 600, outages=(Outage(100, 200),), seed=1)
    fast = t.scaled(0.01)
    assert fast.time_scale == 0.01 and fast.duration_s == pytest.approx(6.0)
    assert fast.at(1.5).down and not fast.at(0.5).down and not fast.at(3.5).down
    assert fast.events[0] == Outage(1.0, 2.0)
    r = t.resampled(10.0)
    assert r.t_s.size == 60 and r.at(150).down


def test_synthetic_is_seeded_and_heavy_tailed():
    a = synthetic(50, 100, 3600, jitter_ms=5, spikes_per_min=2, seed=7)
    b = synthetic(50, 100, 3600, jitter_ms=5, spikes_per_min=2, seed=7)
    c = synthetic(50, 100, 3600, jitter_ms=5, spikes_per_min=2, seed=8)
    assert np.array_equal(a.delay_ms, b.delay_ms) and not np.array_equal(a.delay_ms, c.delay_ms)
    spikes = np.array([s.extra_delay_ms for s in a.events if isinstance(s, Spike)])
    assert 60 < spikes.size < 180 and spikes.min() >= 50
    assert spikes.max() > 5 * np.median(spikes)          # Pareto: a few very large spikes
    assert a.delay_ms.min() >= 50
    with pytest.raises(TraceError, match="200"):
        synthetic(50, 100, 600, outages=(Outage(10, 250),))


@pytest.mark.parametrize("text, match", [
    ("t_s,delay,bandwidth_mbps,loss\n0,1,1,0\n", ":1: header"),
    ("t_s,delay_ms,bandwidth_mbps,loss\n0,1,1,0\n1,abc,1,0\n", ":3: field delay_ms is not a number"),
    ("t_s,delay_ms,bandwidth_mbps,loss\n0,1,1,0\n0,1,1,0\n", ":3: field t_s must increase"),
    ("t_s,delay_ms,bandwidth_mbps,loss\n1,1,1,0\n", ":2: field t_s of the first sample must be 0"),
    ("t_s,delay_ms,bandwidth_mbps,loss\n0,1,1,1.5\n", ":2: field loss out of range"),
    ("t_s,delay_ms,bandwidth_mbps,loss\n0,1,1\n", ":2: expected 4 fields"),
])
def test_malformed_csv_names_file_line_and_field(tmp_path, text, match):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(TraceError, match="bad.csv" + match.replace(".", r"\.")):
        Trace.load_csv(p)


def test_published_rtts_cover_three_continents():
    from testbed.regions import CONTINENT
    assert len(regions()) >= 5 and len({CONTINENT[r] for r in regions()}) >= 3
    assert rtt_ms("East US", "West US 2") == 68 and rtt_ms("East US", "Southeast Asia") == 222
    with pytest.raises(KeyError, match="known regions"):
        rtt_ms("East US", "Mars")


def test_recorded_rtts_replay_as_a_trace(tmp_path):
    # as the PS records them (docs/protocol.md section 10): `t` the event's, `times` the probes'
    events = [{"kind": "link_rtt", "t": 103.5, "site": "a", "times": [100.0, 100.4, 101.2, 103.1],
               "rtt_ms": [80, 84, 120, 60]},
              {"kind": "link_rtt", "t": 100.5, "site": "b", "times": [100.0], "rtt_ms": [10]}]
    t = Trace.from_telemetry(events, "a")
    assert list(t.t_s) == [0, 1, 2, 3]
    assert [t.at(x).delay_ms for x in (0.5, 1.5, 2.5, 3.5)] == [41, 60, 60, 30]   # bin 2 empty: holds
    t.save_csv(tmp_path / "rec.csv")
    assert Trace.load_csv(tmp_path / "rec.csv").at(1.5).delay_ms == 60
    with pytest.raises(TraceError, match="no RTT probes from site 'c'"):
        Trace.from_telemetry(events, "c")
