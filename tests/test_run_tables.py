"""A run's rows and sentences (wantrain/telemetry/tables.py), on events written by hand."""

from wantrain.telemetry.tables import incidents, round_rows


def test_a_row_per_committed_round_with_its_sites_bytes_and_close():
    events = [
        {"kind": "site_round", "round": 0, "site": "a", "wire_bytes": 1_000_000, "raw_bytes": 4_000_000,
         "huffman_bits_per_symbol": 7.0},
        {"kind": "site_round", "round": 0, "site": "b", "wire_bytes": 3_000_000, "raw_bytes": 4_000_000,
         "huffman_bits_per_symbol": 7.5},
        {"kind": "round_end", "round": 0, "val_loss": 3.0, "round_s": 4.0, "sites": ["a", "b"], "late_sites": [],
         "missed": ["c"], "wire_bytes": 500_000, "close": "deadline"},
    ]
    [row] = round_rows(events)
    assert row == {"round": 0, "val_loss": 3.0, "round_s": 4.0, "counted": 2, "late": 0, "missed": 1,
                   "uplink_mb": 4.0, "uplink_ratio": 2.0, "huffman_bits": 7.25, "downlink_mb": 0.5,
                   "close": "deadline"}


def test_incidents_are_the_events_besides_the_rounds_in_words():
    events = [
        {"kind": "join", "elapsed_s": 1.0, "site": "a", "resumed": False},
        {"kind": "round_start", "elapsed_s": 2.0, "round": 0},
        {"kind": "fault", "elapsed_s": 3.0, "action": "link outage", "site": "a", "seconds": 5.0},
        {"kind": "leave", "elapsed_s": 4.0, "site": "a", "reason": "stream closed by the site"},
    ]
    assert incidents(events) == [(1.0, "a joined"), (3.0, "fault injected: link outage a for 5 s"),
                                 (4.0, "a left: stream closed by the site")]
