"""What a Binder session runs, in memory: the peak PSS summed over every process, the kernel included.

mybinder gives a session about 2 GB; the goal is at most 1.5 GB. Two things are measured, each in a
fresh Jupyter kernel (jupyter_client, as JupyterLab starts one), sampling the proportional set
size (PSS: shared pages divided among the processes that map them, so the sum is what the tree
really holds) of the kernel and every process under it, four times a second:

    landing      the tutorial Binder opens (notebooks/00-what-is-diloco.ipynb), every cell
    panel run    the control panel's default run, as the quickstart starts it: ControlPanel()
                 with its defaults (three sites, the three-sites scenario, the PS, the link
                 emulator), started, waited for, its static figures drawn

Printed: the peak of each, the process that held most at that peak, and each process's own peak.
Written to bench/results/binder_memory.json.

    python bench/binder_memory.py [--quick]   (--quick: the panel run at the tutorials' quick size)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MB = 1500.0


def tree(pid: int) -> list[int]:
    """`pid` and every process under it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def label(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return "?"
    if "ipykernel_launcher" in " ".join(argv):
        return "kernel"
    for flag in ("--site",):
        if flag in argv:
            return f"site {argv[argv.index(flag) + 1]}"
    if "wantrain" in argv and "ps" in argv:
        return "parameter server"
    if "testbed" in argv:
        return f"testbed {argv[argv.index('testbed') + 1]}"
    return os.path.basename(argv[0]) if argv[0] else "?"


class Sampler:
    """The PSS of a process tree, sampled in a thread: the peak of the sum and each process's peak."""

    def __init__(self, root: int, every_s: float = 0.25) -> None:
        self.root, self.every_s = root, every_s
        self.peak, self.at_peak, self.each = 0, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = {}
            for p in tree(self.root):
                name = label(p)
                now[name] = now.get(name, 0) + pss_bytes(p)
            total = sum(now.values())
            if total > self.peak:
                self.peak, self.at_peak = total, now
            for name, b in now.items():
                self.each[name] = max(self.each.get(name, 0), b)
            self._stop.wait(self.every_s)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        mb = lambda d: {k: round(v / 1e6, 1) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}
        return {"peak_mb": round(self.peak / 1e6, 1), "at_peak_mb": mb(self.at_peak), "each_peak_mb": mb(self.each)}


def in_kernel(cells: list[str], cwd: Path, env: dict, timeout_s: float) -> dict:
    """Run code cells in a fresh kernel while sampling its process tree; the sampler's figures."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(cwd=str(cwd), env={**os.environ, **env})
    try:
        sampler = Sampler(km.provisioner.process.pid)
        for code in cells:
            reply = kc.execute_interactive(code, timeout=timeout_s, output_hook=lambda msg: None)
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"a cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
        time.sleep(1.0)
        return sampler.stop()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def notebook_cells(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the panel run and 00 at the tutorials' quick size")
    args = ap.parse_args()
    env = {"WANTRAIN_QUICK": "1" if args.quick else "0"}
    landing = ROOT / "notebooks" / "00-what-is-diloco.ipynb"
    runs = ROOT / "runs"
    panel = ["from wantrain.ui import ControlPanel, sized",
             "panel = ControlPanel('three-sites', rounds=sized(8, 3), inner_steps=sized(30, 10))" if args.quick
             else "panel = ControlPanel()",
             "panel.start()\npanel.wait()", "panel.dashboard.show_static()"]
    result = {"limit_mb": LIMIT_MB, "quick": args.quick,
              "landing": in_kernel(notebook_cells(landing), landing.parent, env, 1800),
              "panel_run": in_kernel(panel, runs.parent, env, 1800)}
    path = save("binder_memory", result)
    for what in ("landing", "panel_run"):
        r = result[what]
        verdict = "within" if r["peak_mb"] <= LIMIT_MB else "OVER"
        print(f"{what}: peak {r['peak_mb']:.0f} MB PSS summed over the kernel and its processes ({verdict} "
              f"{LIMIT_MB:.0f} MB); at the peak: " + ", ".join(f"{k} {v:.0f}" for k, v in r["at_peak_mb"].items()))
    print(f"written {path}")
    return 0 if all(result[w]["peak_mb"] <= LIMIT_MB for w in ("landing", "panel_run")) else 1


if __name__ == "__main__":
    sys.exit(main())
