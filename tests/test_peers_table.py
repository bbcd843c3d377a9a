"""bench/peers.py's reading of a run, from the events any arm writes (wantrain's PS, Flower's server,
the namespaced peers' evaluated rounds, and the links' rows): what the table says of an outage. The
runs themselves need the peers' venv and root (`make peers`; docs/peers.md), so they are the bench's."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))           # bench/peers.py
import peers  # noqa: E402


def _run(*rounds, outage=(10.0, 20.0)):
    """Round 0 starting at 4 s, rounds ending at the times given, site c dark over `outage`."""
    return [{"kind": "round_start", "t": 4.0, "round": 0},
            {"kind": "outage_start", "t": outage[0], "site": "c"}, {"kind": "outage_end", "t": outage[1], "site": "c"},
            *({"kind": "round_end", "t": t, "round": r, "val_loss": 3.0, "sites": sites} for r, t, sites in rounds)]


def test_an_outage_the_run_went_on_through_and_the_site_came_back_from():
    events = _run((0, 5.0, ["a", "b", "c"]), (1, 12.0, ["a", "b"]), (2, 18.0, ["a", "b"]), (3, 21.0, ["a", "b"]),
                  (4, 24.5, ["a", "b", "c"]))
    assert peers.outage_outcomes(events) == [{"site": "c", "dark_s": 10.0, "rounds_during": 2, "back_s": 4.5,
                                              "ended": True}]


def test_a_run_that_waited_for_the_dark_site_and_one_that_stopped_before_it_was_back():
    waited = _run((0, 9.0, ["a", "b", "c"]), (1, 23.0, ["a", "b", "c"]))
    assert peers.outage_outcomes(waited) == [{"site": "c", "dark_s": 10.0, "rounds_during": 0, "back_s": 3.0,
                                              "ended": True}]
    stopped = _run((0, 9.0, ["a", "b", "c"]), (1, 15.0, ["a", "b"]))
    assert peers.outage_outcomes(stopped) == [{"site": "c", "dark_s": 10.0, "rounds_during": 1, "back_s": None,
                                               "ended": False}]      # the run stopped while it was dark
    later = _run((0, 9.0, ["a", "b", "c"]), (1, 15.0, ["a", "b"]), (2, 21.0, ["a", "b"]))
    assert peers.outage_outcomes(later) == [{"site": "c", "dark_s": 10.0, "rounds_during": 1, "back_s": None,
                                             "ended": True}]


def test_an_outage_over_before_round_0_or_after_the_last_round_is_not_the_runs():
    assert peers.outage_outcomes(_run((0, 9.0, ["a", "b", "c"]), outage=(1.0, 3.0))) == []     # start-up
    assert peers.outage_outcomes(_run((0, 9.0, ["a", "b", "c"]), outage=(12.0, 15.0))) == []   # after the run


def test_the_verdict_compares_wantrains_best_with_the_best_peer_that_reached_the_target():
    from wantrain.telemetry.compare import peers_verdict

    published = {"command": "python bench/peers.py", "seeds": 3, "seeds_by_scenario": {"b": 1}, "scenarios": {
        "a": {"wantrain-paper": [40, 38, 44], "wantrain-best": [30, 28, 32], "torchft-diloco": [50, 48, 52],
              "flower-fedavgm": [70, 66, 72]},
        "b": {"wantrain-best": [32, 32, 32], "torchft-diloco": [96, 96, 96], "flower-fedavgm": None},
        "c": {"wantrain-best": [20, 20, 20], "hivemind-diloco": None}}}
    lines = peers_verdict(published)
    assert lines[2] == "  wantrain-best against the best peer, torchft-diloco: 1.67x sooner (goal >= 2x): not met"
    assert lines[3].startswith("b (1 seed): ") and lines[3].endswith("; not reached within the cap: flower-fedavgm")
    assert lines[4] == "  wantrain-best against the best peer, torchft-diloco: 3.00x sooner (goal >= 2x): met"
    assert lines[6] == "  wantrain-best: no peer reached the target"
