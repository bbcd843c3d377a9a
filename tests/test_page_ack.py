"""The dashboard's flow control (wantrain/ui/page_ack.py): the next batch of charts goes to the page
once the page says it drew the last one, or after ANSWER_WAIT_S without an answer."""

from types import SimpleNamespace

import pytest

import wantrain.ui.dashboard as dashboard_module
import wantrain.ui.page_ack as page_ack_module
from wantrain.ui import Dashboard
from wantrain.ui.page_ack import ANSWER_WAIT_S


def _round(r: int) -> list[dict]:
    return [{"kind": "site_round", "t": 100.0 + r, "elapsed_s": float(r), "site": "a", "round": r, "train_loss": 4.0 - r,
             "wire_bytes": 1000, "raw_bytes": 4000, "huffman_bits_per_symbol": 6.0},
            {"kind": "round_end", "t": 100.0 + r, "elapsed_s": float(r), "round": r, "val_loss": 3.0 - r / 10,
             "wire_bytes": 1000, "round_s": 1.0}]


@pytest.fixture
def clock(monkeypatch):
    """The dashboard's and the page's clock, moved by hand; redraws cost nothing on it."""
    now = SimpleNamespace(t=1000.0)
    fake = SimpleNamespace(monotonic=lambda: now.t, thread_time=lambda: 0.0, time=lambda: now.t)
    monkeypatch.setattr(dashboard_module, "time", fake)
    monkeypatch.setattr(page_ack_module, "time", fake)
    return now


def test_the_next_charts_wait_for_the_page_to_draw_the_last(clock):
    dash = Dashboard(min_interval_s=1.0)
    page = dash._page

    def answer(content) -> None:          # what the page's code sends back, through the widget's comm
        page._handle_custom_msg(content, [])

    dash.add({"kind": "run_start", "t": 100.0, "elapsed_s": 0.0, "val_loss": 5.0})
    assert (dash.redraws, page.sent) == (1, 1)
    clock.t += 2
    for e in _round(0):                   # due, but the page has not drawn batch 1: nothing sent
        dash.add(e)
    assert (dash.redraws, page.sent) == (1, 1)
    # Neither a malformed answer nor one for a batch never sent counts as drawn.
    for bad in ({"drawn": "1"}, {"drawn": True}, {"drawn": 7}, {"drawn": 0}, {}, ["drawn", 1]):
        answer(bad)
    assert (dash.redraws, page.drawn) == (1, 0)
    answer({"drawn": 1})                  # drawn: what came meanwhile goes at once
    assert (dash.redraws, page.sent, page.drawn) == (2, 2, 1)
    assert [len(d.x) for d in dash.charts[0].data if d.name.startswith("validation")] == [2]
    answer({"drawn": 2})                  # drawn, nothing new: nothing sent
    assert dash.redraws == 2
    clock.t += 0.5
    for e in _round(1):                   # drawn, but not due (min_interval_s)
        dash.add(e)
    assert dash.redraws == 2
    clock.t += 1
    dash.add(_round(2)[0])
    assert (dash.redraws, page.sent) == (3, 3)
    # No answer (no page open, or the kernel busy in a cell): sent anyway after ANSWER_WAIT_S.
    clock.t += ANSWER_WAIT_S - 0.5
    dash.add(_round(2)[1])
    assert dash.redraws == 3
    clock.t += 0.5
    dash.add(_round(3)[0])
    assert (dash.redraws, page.sent) == (4, 4)
    dash.add({"kind": "run_end", "t": 110.0, "elapsed_s": 10.0})     # the end is always drawn
    assert dash.redraws == 5 and "finished" in dash.status.value
