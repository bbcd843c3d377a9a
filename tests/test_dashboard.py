"""The live dashboard, fed by a real run's Watch stream in a background thread."""

import json
import time

import numpy as np
import pytest

from wantrain.launch.plan import JsonlTail
from wantrain.telemetry.charts import figures, thin
from wantrain.launch.run import Run
from wantrain.ui import Dashboard

from .helpers import small_config


def test_thin_keeps_ends_extremes_and_caps_points():
    assert thin(range(10), 20).tolist() == list(range(10))
    assert thin(range(10), None).tolist() == list(range(10))
    y = np.full(10_000, 70.0)
    y[4321], y[7000] = 450.0, 0.0                      # a one-sample delay spike and a dip
    idx = thin(y, 400)
    assert len(idx) <= 400 and idx[0] == 0 and idx[-1] == 9_999 and (np.diff(idx) > 0).all()
    assert 4321 in idx and 7000 in idx                 # evenly spaced picks would miss both
    assert len(thin(range(1000), 3)) == 3


def test_jsonl_tail_reads_only_complete_new_lines(tmp_path):
    log = tmp_path / "links.jsonl"
    tail = JsonlTail(log)
    assert tail.read() == []                           # no file yet
    log.write_text(json.dumps({"kind": "link", "t": 1}) + "\n" + '{"kind": "li')     # a line being written
    assert [r["t"] for r in tail.read()] == [1]
    with log.open("a") as f:
        f.write('nk", "t": 2}\nnot json\n[1, 2]\n' + json.dumps({"kind": "link", "t": 3}) + "\n")
    assert [r["t"] for r in tail.read()] == [2, 3] and tail.malformed == 2
    assert tail.read() == []                           # nothing new: nothing read twice
    log.write_text(json.dumps({"kind": "link", "t": 9}) + "\n")                       # replaced
    assert [r["t"] for r in tail.read()] == [9]


@pytest.mark.timeout(180)
def test_dashboard_follows_a_run_without_blocking(tmp_path):
    cfg = small_config(num_sites=2, **{"train.rounds": 3})
    with Run(cfg, run_dir=tmp_path / "run") as run:
        live = Dashboard(min_interval_s=0.5)
        capped = Dashboard(max_points=3, min_interval_s=3600)     # redraws only at the start and the end
        events = []

        def tee():
            for ev in run.follow(timeout_s=150):
                events.append(ev)
                capped.add(ev)
                yield ev

        thread = live.follow(tee())
        assert thread.is_alive()                  # follow() returned at once: the caller is free
        thread.join(160)
        assert not thread.is_alive()
    titles = [w.layout.title.text for w in live.charts]
    assert any(t.startswith("Loss") for t in titles) and any(t.startswith("Timeline") for t in titles)
    loss = next(w for w in live.charts if w.layout.title.text.startswith("Loss"))
    val = next(tr for tr in loss.data if tr.name.startswith("validation"))
    assert len(val.y) == 4 and val.y[-1] < val.y[0]             # run_start + 3 rounds, falling
    timeline = next(w for w in live.charts if w.layout.title.text.startswith("Timeline"))
    joins = next(tr for tr in timeline.data if tr.name == "join")
    assert sorted(joins.y) == sorted(run.sites)
    assert "finished: 3 rounds" in live.status.value
    assert "alert" in live.status.value and "no rule can tell" in live.status.value   # two untrusted sites
    assert 2 <= live.redraws <= len(events)
    # Rate cap and thinning: a redraw for the first event and one for run_end (one, if both came
    # while the first was drawing), and the last one shows the end.
    assert 1 <= capped.redraws <= 2 < len(events) and "finished: 3 rounds" in capped.status.value
    assert all(len(tr.x) <= 3 for w in capped.charts for tr in w.data if tr.x is not None)
    static = live.static_figures()                               # for saved notebooks: the real curves
    assert [f.layout.title.text for f in static] == titles
    # One colour per site in every chart; the time axes span the whole run, on the run's clock.
    colours: dict[str, set] = {}
    for w in live.charts:
        for tr in w.data:
            site = next((s for s in run.sites if tr.name and tr.name.split()[-1] == s), None)
            if site is not None:
                colours.setdefault(site, set()).add((getattr(tr, "line", None) and tr.line.color) or tr.marker.color)
    assert set(colours) == set(run.sites) and all(len(c) == 1 for c in colours.values()), colours
    assert len({c for cs in colours.values() for c in cs}) == len(run.sites)
    last = max(e["elapsed_s"] for e in events)
    for w in live.charts:
        if w.layout.xaxis.title.text == "seconds since start":
            assert w.layout.xaxis.range[0] == 0 and w.layout.xaxis.range[1] >= last - 1e-6, w.layout.title.text


def test_figures_thin_every_series_and_tolerate_empty_probe_batches():
    t0 = 1.7e9
    events = [{"kind": "run_start", "t": t0, "elapsed_s": 0.0, "val_loss": 5.5},
              {"kind": "link_rtt", "t": t0, "times": [], "site": "a", "rtt_ms": []},
              {"kind": "link_rtt", "t": t0 + 999, "times": [t0 + i for i in range(1000)], "site": "b",
               "rtt_ms": [900.0 if i == 613 else 80.0 for i in range(1000)]}]
    events += [{"kind": "link", "t": t0 + i, "site": "b", "trace_rtt_ms": 80.0, "bytes_up": 1000 * i, "bytes_down": 0}
               for i in range(1000)]
    full = figures(events)
    thinned = figures(events, max_points=50)
    assert [f.layout.title.text for f in full] == [f.layout.title.text for f in thinned]
    rtt = next(f for f in thinned if f.layout.title.text.startswith("Links: RTT"))
    b = next(tr for tr in rtt.data if tr.name == "measured RTT b")
    assert len(b.y) <= 50 and max(b.y) == 900.0                      # the spike survives thinning
    axis = rtt.layout.yaxis                                           # a log axis labelled 1-2-5 in ms only
    assert axis.type == "log" and list(axis.ticktext[3:6]) == ["10", "20", "50"] and axis.minor.showgrid is False
    assert max(len(tr.x) for f in full for tr in f.data if tr.x is not None) == 1000


@pytest.mark.timeout(60)
def test_wait_for_waits_for_a_follow_thread_that_has_not_started_yet(monkeypatch):
    """Under load the follow thread may exist some time before it runs. wait_for must wait for
    it, not report that the run's events ended (notebook 04 once failed so)."""
    import threading

    import wantrain.ui.dashboard as dashboard
    from wantrain.errors import ProcessError

    class SlowToStart(threading.Thread):
        def start(self):
            time.sleep(1.0)
            super().start()

    monkeypatch.setattr(dashboard.threading, "Thread", SlowToStart)
    dash = Dashboard(min_interval_s=3600)
    joined = {"v": 2, "seq": 0, "kind": "join", "t": 1.0, "elapsed_s": 0.0, "site": "a", "resumed": False}
    follower = threading.Thread(target=dash.follow, args=(iter([joined]),))
    follower.start()
    time.sleep(0.2)                              # follow() has not started its thread yet
    assert dash.wait_for("join", site="a", timeout_s=30) == joined
    follower.join()
    with pytest.raises(ProcessError, match="ended without a 'round_end' event"):   # the source is exhausted
        dash.wait_for("round_end", timeout_s=30)
