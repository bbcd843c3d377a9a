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
    with pytest.raises(ScenarioError, match="not one of"):
        load_scenario("no-such-scenario")
