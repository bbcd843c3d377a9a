"""Progress of long work: a site's model download logs each quarter off a terminal; the PS reports
downloads to watchers."""

import json
import logging

from wantrain.transport.messages import Join
from wantrain.ps import ParameterServer
from wantrain.site.progress import DownloadProgress
from wantrain.ui import site_states

from .helpers import drain, small_config


def test_download_progress_logs_quarters_and_stays_quiet_for_small_models(caplog):
    caplog.set_level(logging.INFO, "wantrain.site")
    p = DownloadProgress("eu-west", 20)
    for _ in range(20):
        p.update(1 << 20)
    p.close()
    lines = [r.getMessage() for r in caplog.records]
    assert [ln.split("download ")[1].split(" %")[0] for ln in lines] == ["25", "50", "75", "100"]
    assert "21 MB" in lines[-1]
    caplog.clear()
    small = DownloadProgress("eu-west", 3)
    for _ in range(3):
        small.update(100)
    assert not caplog.records


def test_model_download_reports_each_tenth_to_watchers(tmp_path):
    """The PS tells Watch how far each site's model download is, so a notebook shows a percentage."""
    ps = ParameterServer(small_config(num_sites=1, **{"codec.chunk_bytes": 4096}), run_dir=tmp_path)
    a = ps.join(Join("a"))
    chunks = [m for m in drain(a) if type(m).__name__ == "TensorChunk"]
    events = [json.loads(ln) for ln in ps.recorder.events]
    progress = [e for e in events if e["kind"] == "download"]
    n = len(chunks)
    assert n >= 20
    assert [e["chunks"] for e in progress] == [next(i for i in range(1, n + 1) if 10 * i // n == k) for k in range(1, 11)]
    assert all(e["site"] == "a" and e["of"] == n for e in progress)
    assert progress[-1]["mb"] == sum(c.data.wire_bytes for c in chunks) / 1e6
    half = events[:events.index(progress[4]) + 1]
    assert site_states(half)["a"].startswith("downloading the model: 50 % of")
