"""Where a round goes (wantrain/telemetry/round_time.py), on events written by hand: each part is read from
the fields that measure it, the wall time from the rounds' starts, and the parts add up to it."""

import pytest

from wantrain.telemetry.round_time import PARTS, round_splits, site_totals
from wantrain.telemetry import utilization


def _site(r, site, **kw):
    fields = dict(download_s=0.3, decode_s=0.05, compute_s=2.0, encode_s=0.1, turnaround_s=2.5, first_in_s=2.6,
                  arrived_s=3.0, upload_s=0.4, steps=10, steps_ahead=0, late=False)
    return {"kind": "site_round", "t": 0.0, "round": r, "site": site, **{**fields, **kw}}


def _events():
    return [
        {"kind": "round_start", "t": 100.0, "round": 0},
        _site(0, "a", download_s=0.0, decode_s=0.0, turnaround_s=2.2, first_in_s=2.3, arrived_s=2.8),
        _site(0, "b", compute_s=2.8, turnaround_s=3.3, first_in_s=3.4, arrived_s=3.5),
        {"kind": "round_end", "t": 104.0, "round": 0, "closed_s": 3.6},
        {"kind": "round_start", "t": 104.5, "round": 1},
        _site(1, "a", steps_ahead=5, compute_s=4.0),             # half its steps were taken ahead
        _site(1, "b", late=True, first_in_s=None, arrived_s=None),   # missed the round: no split
        {"kind": "round_end", "t": 108.0, "round": 1, "closed_s": 3.2},
    ]


def test_each_part_is_read_from_what_measures_it():
    splits = {(s["round"], s["site"]): s for s in round_splits(_events())}
    assert set(splits) == {(0, "a"), (0, "b"), (1, "a")}
    a0 = splits[0, "a"]
    assert a0["wall_s"] == pytest.approx(4.5)               # to the next round's start
    assert a0["latency_s"] == pytest.approx(2.3 - 2.2)      # its first chunk in, less the site's turnaround
    assert (a0["download_s"], a0["apply_s"], a0["compute_s"], a0["encode_s"]) == (0.0, 0.0, 2.0, 0.1)
    assert a0["other_s"] == pytest.approx(2.2 - 2.0 - 0.1)  # the turnaround its timers did not explain
    assert a0["upload_s"] == pytest.approx(2.8 - 2.3)       # first chunk in to last, both at the PS
    assert a0["waiting_s"] == pytest.approx(3.6 - 2.8)      # its last chunk in, to the round closing
    assert a0["ps_s"] == pytest.approx(4.5 - 3.6)           # the close to the next start
    assert splits[0, "b"]["waiting_s"] == pytest.approx(0.1)
    a1 = splits[1, "a"]
    assert a1["wall_s"] == pytest.approx(3.5)               # the last round ends at its round_end
    assert a1["compute_s"] == pytest.approx(2.0)            # the steps after its RoundStart
    assert a1["other_s"] == pytest.approx(2.5 - 0.3 - 0.05 - 2.0 - 0.1)
    for s in splits.values():
        assert sum(s[f"{p}_s"] for p in PARTS) == pytest.approx(s["wall_s"])


def test_totals_add_up_the_rounds_and_utilization_reads_the_same_windows():
    totals = site_totals(round_splits(_events()))
    assert totals["a"]["rounds"] == 2 and totals["a"]["wall_s"] == pytest.approx(8.0)
    assert totals["a"]["compute_s"] == pytest.approx(4.0)
    use = utilization(_events())
    assert use["a"]["wall_s"] == pytest.approx(totals["a"]["wall_s"])
    assert use["a"]["compute_s"] == pytest.approx(2.0 + 4.0)  # steps taken ahead count as computing


def test_a_log_without_the_fields_has_no_split():
    old = [{k: v for k, v in e.items() if k not in ("first_in_s", "closed_s")} for e in _events()]
    assert round_splits(old) == []
    assert utilization(old)["a"]["rounds"] == 2
