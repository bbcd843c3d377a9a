"""Progress of long work off a terminal: a site's model download logs each quarter."""

import logging

from wantrain.worker import DownloadProgress


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
