"""What starting a PS process costs, forked warm (wantrain/launch/warm.py) against started cold.

Starts `wantrain ps` through the local launcher `--starts` times each way, alternating, and
measures from the start call to its "listening on" line: the wall time, the CPU the process had
used by then, and its proportional memory (PSS: pages shared with the starter count in part).
The starter's own start (once) is reported apart. Medians.

    python bench/warm_start.py [--starts 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save

from wantrain.config import RunConfig
from wantrain.launch import LocalLauncher, ProcessSpec
from wantrain.launch.argv import ps_command

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_once(launcher: LocalLauncher, tmp: Path, i: int, warm: bool) -> dict:
    os.environ["WANTRAIN_WARM_START"] = "1" if warm else "0"
    argv = ps_command(sys.executable, tmp / "config.json", port=0, run_dir=tmp / f"run-{i}")
    t0 = time.perf_counter()
    h = launcher.start(ProcessSpec(f"ps-{i}", argv, log_path=tmp / f"ps-{i}.log"))
    try:
        while "listening on" not in h.log_tail():
            if h.poll() is not None:
                raise SystemExit(f"the PS ended: {h.log_tail()}")
            time.sleep(0.01)
        return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_s(h.pid), "pss_mb": pss_mb(h.pid)}
    finally:
        h.stop(grace_s=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=5)
    args = ap.parse_args()
    launcher = LocalLauncher()
    rows: dict[str, list[dict]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="warm-start-") as d:
        tmp = Path(d)
        (tmp / "config.json").write_text(RunConfig().to_json())
        t0 = time.perf_counter()
        start_once(launcher, tmp, 0, warm=True)               # starts the starter, then forks
        starter_s = time.perf_counter() - t0                 # the whole first start
        for i in range(1, args.starts + 1):
            rows["cold"].append(start_once(launcher, tmp, 2 * i, warm=False))
            rows["warm"].append(start_once(launcher, tmp, 2 * i + 1, warm=True))
    med = {arm: {k: round(statistics.median(r[k] for r in rs), 3) for k in ("wall_s", "cpu_s", "pss_mb")}
           for arm, rs in rows.items()}
    for arm in ("cold", "warm"):
        print(f"{arm}: to listening {med[arm]['wall_s']:.2f} s, CPU {med[arm]['cpu_s']:.2f} s, "
              f"PSS {med[arm]['pss_mb']:.0f} MB (median of {args.starts})")
    ratio = {k: round(med["warm"][k] / med["cold"][k], 3) for k in ("wall_s", "cpu_s", "pss_mb")}
    print(f"warm / cold: wall {ratio['wall_s']:.2f}, CPU {ratio['cpu_s']:.2f}, PSS {ratio['pss_mb']:.2f}; "
          f"the first start, the starter's imports included: {starter_s:.2f} s")
    print("saved", save("warm_start", {"starts": args.starts, "median": med, "warm_over_cold": ratio,
                                       "first_start_s": round(starter_s, 3)}))


if __name__ == "__main__":
    main()
