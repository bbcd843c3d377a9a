"""docs/telemetry.md, the reader's guide to a run's events and charts, names every event kind and
every chart the report draws (the fields themselves are protocol.md's, checked elsewhere)."""

import re
from pathlib import Path

from wantrain.telemetry.charts import figures
from wantrain.telemetry import EVENT_KINDS

GUIDE = (Path(__file__).resolve().parent.parent / "docs" / "telemetry.md").read_text()


def test_the_guide_explains_every_event_kind():
    named = set(re.findall(r"`([a-z_]+)`", GUIDE))
    assert not set(EVENT_KINDS) - named, f"kinds the guide does not explain: {sorted(set(EVENT_KINDS) - named)}"


def test_the_guide_explains_every_chart():
    t0 = 1.7e9
    events = [{"kind": "run_start", "t": t0, "elapsed_s": 0.0, "val_loss": 5.5, "config": {"sites": ["a"]}},
              {"kind": "site_round", "t": t0 + 2, "elapsed_s": 2.0, "site": "a", "round": 0, "train_loss": 4.0,
               "wire_bytes": 1000, "raw_bytes": 4000, "huffman_bits_per_symbol": 7.9},
              {"kind": "round_end", "t": t0 + 3, "elapsed_s": 3.0, "round": 0, "val_loss": 4.5, "wire_bytes": 1000,
               "raw_bytes": 4000},
              {"kind": "link_rtt", "t": t0 + 3, "elapsed_s": 3.0, "site": "a", "times": [t0 + 1], "rtt_ms": [80.0]},
              {"kind": "link", "t": t0 + 1, "elapsed_s": 1.0, "site": "a", "trace_rtt_ms": 80.0, "bytes_up": 0,
               "bytes_down": 0},
              {"kind": "link", "t": t0 + 2, "elapsed_s": 2.0, "site": "a", "trace_rtt_ms": 80.0, "bytes_up": 9000,
               "bytes_down": 0}]
    charts = re.search(r"## The charts\n(.*?)\n## ", GUIDE, re.S).group(1)
    headings = re.findall(r"\*\*([^*]+?)\.\*\*", charts)
    titles = [f.layout.title.text for f in figures(events)]
    assert len(titles) == 5
    for title in titles:
        assert any(title.startswith(h) for h in headings), f"chart {title!r} is not in docs/telemetry.md ({headings})"
