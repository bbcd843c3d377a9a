"""How far the page's charts lag behind the kernel's dashboard, in a real browser.

A notebook in JupyterLab (127.0.0.1, port 0; Debian's chromium driven by Playwright) replays a
synthetic three-site run (`dashboard_bench.synthetic_run`: a link row per site per second, a round
every 30 s) into a live `Dashboard`, `--speed` times faster than real time, and notes when each
round reached the dashboard. The browser side polls the loss chart and notes when each round's
validation point is drawn. Lag of a round = drawn - reached; "behind at the end" = the last round
drawn - the last round reached. Two arms, one after the other, each in a fresh JupyterLab: the
dashboard as it is (it waits for the page to say it drew the last batch before sending the
next), and the baseline that sends a batch every `min_interval_s` whatever the page has drawn.
`--busy N` runs `stress-ng --cpu N` beside both arms (a loaded CI machine).

    python bench/dashboard_lag.py [--minutes 30] [--speed 30] [--busy 2]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save

BENCH = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"

# The kernel's side: replay the run into a dashboard, note when each round reached it.
CELL = """\
import json, sys, time
sys.path.insert(0, {bench!r})
from dashboard_bench import synthetic_run
from wantrain.ui import Dashboard

class Baseline(Dashboard):
    def _page_ready(self) -> bool:        # the way it was: send whatever the page has drawn
        return True

events = synthetic_run({minutes})
reached = []
def replay():
    t0, first = time.monotonic(), events[0]["t"]
    for e in events:
        wait = (e["t"] - first) / {speed} - (time.monotonic() - t0)
        if wait > 0:
            time.sleep(wait)
        if e["kind"] == "round_end":
            reached.append(time.time())
        yield e
    time.sleep(2)                                   # the last answers
    with open({out!r}, "w") as f:
        json.dump({{"reached": reached, "sent": dash._page.sent, "drawn": dash._page.drawn}}, f)

dash = {arm}(rounds=sum(e["kind"] == "round_end" for e in events))
dash.follow(replay())
dash
"""

# The page's side: how many validation points the loss chart has (the run's start is one).
POINTS = """() => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const t = gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title);
    if (typeof t === 'string' && t.startsWith('Loss'))
      return Math.max(0, ...(gd.data || []).filter(d => (d.name || '').startsWith('validation')).map(d => (d.x || []).length));
  }
  return 0;
}"""


def notebook(source: str) -> str:
    return json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                                  "source": source}],
                       "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                       "nbformat": 4, "nbformat_minor": 5})


def run_arm(arm: str, minutes: float, speed: float, work: Path) -> dict:
    from playwright.sync_api import sync_playwright

    work.mkdir()
    out = work / "reached.json"
    (work / "lag.ipynb").write_text(notebook(CELL.format(bench=str(BENCH), minutes=minutes, speed=speed,
                                                         out=str(out), arm=arm)))
    token = secrets.token_hex(16)
    env = {**os.environ, **{v: str(work / v.lower()) for v in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR",
                                                              "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR",
                                                              "IPYTHONDIR")}}
    log = work / "lab.log"
    lab = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
                            "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0", f"--IdentityProvider.token={token}",
                            f"--ServerApp.root_dir={work}"], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.time() + 60
        while "http://127.0.0.1:" not in log.read_text():
            if lab.poll() is not None or time.time() > deadline:
                raise SystemExit(f"JupyterLab did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
        port = int(log.read_text().split("http://127.0.0.1:")[1].split("/")[0])
        seen: list[tuple[float, int]] = []
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(str(work / "chromium"), executable_path=CHROMIUM, headless=True,
                                                       args=["--no-sandbox", "--disable-gpu", "--no-first-run"],
                                                       viewport={"width": 1000, "height": 3400})
            try:
                page = ctx.new_page()
                page.set_default_timeout(120_000)
                page.goto(f"http://127.0.0.1:{port}/lab/tree/lag.ipynb?reset&token={token}")
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
                page.wait_for_function("() => (document.querySelector('#jp-main-statusbar') || "
                                       "{innerText: ''}).innerText.includes('Idle')", timeout=90_000)
                page.locator(".jp-Notebook .jp-Cell").first.click()
                page.keyboard.press("Control+Enter")
                rounds = int(60 * minutes // 30)
                limit = time.time() + 60 * minutes / speed + 600
                while time.time() < limit:
                    n = page.evaluate(POINTS)
                    if not seen or n > seen[-1][1]:
                        seen.append((time.time(), n))
                    if n >= rounds + 1 and out.exists():
                        break
                    time.sleep(0.25)
            finally:
                ctx.close()
    finally:
        lab.terminate()
        try:
            lab.wait(30)
        except subprocess.TimeoutExpired:
            lab.kill()
    kernel = json.loads(out.read_text()) if out.exists() else {"reached": [], "sent": 0, "drawn": 0}
    reached = kernel["reached"]
    lags = []
    for k, t in enumerate(reached, start=1):            # round k's point is the (k+1)-th
        drawn = next((when for when, n in seen if n >= k + 1), None)
        lags.append(None if drawn is None else drawn - t)
    done = [x for x in lags if x is not None]
    return {"arm": arm, "rounds": len(reached), "drawn": len(done), "batches_sent": kernel["sent"],
            "batches_the_page_said_it_drew": kernel["drawn"],
            "median_lag_s": round(statistics.median(done), 2) if done else None,
            "max_lag_s": round(max(done), 2) if done else None,
            "behind_at_end_s": round(done[-1], 2) if len(done) == len(reached) and done else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30, help="length of the synthetic run")
    ap.add_argument("--speed", type=float, default=30, help="times faster than real time")
    ap.add_argument("--busy", type=int, default=0, help="stress-ng --cpu N beside the browser")
    args = ap.parse_args()
    stress = None
    if args.busy:
        if not shutil.which("stress-ng"):
            raise SystemExit("--busy needs stress-ng (apt-get install stress-ng)")
        stress = subprocess.Popen(["stress-ng", "--cpu", str(args.busy), "--quiet"])
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="dashboard-lag-") as tmp:
            for arm in ("Dashboard", "Baseline"):
                row = run_arm(arm, args.minutes, args.speed, Path(tmp) / arm)
                rows.append(row)
                print(f"{arm:9s}: {row['drawn']}/{row['rounds']} rounds drawn, lag median {row['median_lag_s']} s, "
                      f"max {row['max_lag_s']} s, behind at the end {row['behind_at_end_s']} s; batches sent "
                      f"{row['batches_sent']}, answered {row['batches_the_page_said_it_drew']}", flush=True)
    finally:
        if stress:
            stress.terminate()
            stress.wait(10)
    print("saved", save("dashboard_lag", {"minutes": args.minutes, "speed": args.speed, "busy": args.busy,
                                          "rows": rows}))


if __name__ == "__main__":
    main()
