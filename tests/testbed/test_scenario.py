import pytest

from testbed import Outage
from testbed.scenario import BUILTIN, ScenarioError, load_scenario


def test_builtin_scenarios_load():
    assert {"three-sites", "loopback"} <= set(BUILTIN)
    sc = load_scenario("three-sites")
    assert len(sc.sites) == 3 and sc.time_scale == 0.05
    rtts = [sc.rtt_ms(s) for s in sc.sites]
    assert len(set(rtts)) == 3 and max(rtts) > 200
    up, down = sc.traces(sc.sites[2])
    assert up.time_scale == 0.05 and any(isinstance(e, Outage) for e in up.events)
    assert not (up.delay_ms == down.delay_ms).all()        # each direction has its own jitter
    assert [s.speed_factor for s in sc.sites] == [1.0, 1.25, 1.5]


GOOD = '''name = "t"
ps_region = "East US"
time_scale = 0.5

[[site]]
name = "a"
region = "West Europe"
bandwidth_mbps = 100

[[site]]
name = "b"
region = "Japan East"
speed_factor = 2
'''


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace('bandwidth_mbps = 100', 'bandwidth_mbps = "fast"'), r":8: field site\[0\]\.bandwidth_mbps"),
    (lambda t: t.replace('speed_factor = 2', 'speed_factor = 0.5'), r":13: field site\[1\]\.speed_factor"),
    (lambda t: t.replace('region = "Japan East"', 'region = "Atlantis"'), r":12: field site\[1\]\.region"),
    (lambda t: t.replace('time_scale = 0.5', 'time_scale = -1'), r":3: field time_scale"),
    (lambda t: t.replace('ps_region = "East US"', 'ps_region = "Moon"'), r":2: field ps_region"),
    (lambda t: t + 'colour = "red"\n', r":14: field site\[1\]\.colour is unknown"),
    (lambda t: t.replace('name = "b"', 'name = "a"'), r"site names must be unique"),
    (lambda t: t.replace('[[site]]\nname = "a"', '[[site]\nname = "a"'), r"s\.toml: .*line 5"),
    (lambda t: t + 'backend = "proxy"\ninterface = "eth0"\n', r":14: field site\[1\]\.backend of a site can only be "
                                                                 r"\"tcconfig\" or \"kernel\""),
    (lambda t: t + 'backend = "tcconfig"\n', r"field site\[1\]\.interface and a site's backend go together"),
    (lambda t: t + 'interface = "eth0"\n', r"field site\[1\]\.backend and a site's backend go together"),
    (lambda t: t + 'chunk_loss = 0.95\n', r":14: field site\[1\]\.chunk_loss must be a number in \[0, 0.9\]"),
])
def test_malformed_scenarios_name_file_line_and_field(tmp_path, edit, match):
    p = tmp_path / "s.toml"
    p.write_text(edit(GOOD))
    with pytest.raises(ScenarioError, match=match):
        load_scenario(p)


def test_good_file_and_unknown_name(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(GOOD)
    sc = load_scenario(p)
    assert [s.name for s in sc.sites] == ["a", "b"] and sc.sites[1].speed_factor == 2.0
    p.write_text(GOOD + 'chunk_loss = 0.05\nchunk_burst = 3\n')
    b = load_scenario(p).sites[1]
    assert (b.chunk_loss, b.chunk_burst, b.chunk_late_s) == (0.05, 3.0, 30.0)
    p.write_text(GOOD + 'backend = "tcconfig"\ninterface = "eth1"\n')
    b = load_scenario(p).sites[1]
    assert (b.backend, b.interface) == ("tcconfig", "eth1")
    with pytest.raises(ScenarioError, match="not one of"):
        load_scenario("no-such-scenario")


def test_outages_happen_on_top_of_a_replayed_trace(tmp_path):
    """Finding 10: a site with both `trace` and `outages` silently lost its outages."""
    (tmp_path / "t.csv").write_text("t_s,delay_ms,bandwidth_mbps,loss\n0,40,100,0\n5,60,50,0\n10,40,100,0\n")
    p = tmp_path / "s.toml"
    p.write_text(GOOD.replace('bandwidth_mbps = 100', 'trace = "t.csv"\noutages = [{ start_s = 3, duration_s = 4 },'
                                                    ' { start_s = 31, duration_s = 2 }]'))
    sc = load_scenario(p)
    up, down = sc.traces(sc.sites[0])
    scale = sc.time_scale                                   # 0.5: trace seconds -> real seconds
    assert up.at(2 * scale).bandwidth_mbps == 100 and up.at(3.5 * scale).bandwidth_mbps == 0
    assert up.at(6.9 * scale).down and up.at(7 * scale).bandwidth_mbps == 50 and up.at(8 * scale).delay_ms == 60
    assert up.at(32 * scale).down and not up.at(33.5 * scale).down      # the trace repeats until the last outage
    assert sum(isinstance(e, Outage) for e in up.events) == 2 and down.at(4 * scale).down
