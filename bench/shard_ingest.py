"""PS ingest with the model sharded over 1, 2 and 4 PS processes, side by side in one run.

For each shard count N, N real `wantrain ps --shard i/N` processes serve one run and three
client processes (the real wire code) join every shard, download its tensors, and each round
push every shard its part of a pre-encoded int8+Huffman delta, to all shards at once, as fast
as gRPC flow control lets them (a site's real session does the same through site/sharded.py;
here without training, so only the PS side is measured). Ingest per round = all sites' delta
bytes / (first chunk sent -> last push done). No durability (checkpoint_every 0) in every arm:
the journal's disk writes would measure the disk. Reported as MB/s and as a ratio to one shard.

    python bench/shard_ingest.py [--preset gpt2] [--rounds 3] [--shards 1,2,4]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save
from wantrain.launch.argv import ps_command
from server_bench import SITES, client, ingest_per_round, median, peak_rss_mb


def run_shards(preset: str, rounds: int, n: int) -> dict:
    from wantrain.config import RunConfig

    cfg = RunConfig().replace(**{"model.preset": preset, "train.rounds": rounds, "train.eval_batches": 0,
                                 "train.checkpoint_every": 0})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.json").write_text(cfg.to_json())
        procs, ports = [], []
        try:
            for i in range(n):
                port_file = Path(tmp) / f"port{i}"
                procs.append(subprocess.Popen(
                    ps_command(sys.executable, Path(tmp) / "c.json", port_file=port_file, run_dir=Path(tmp) / f"shard{i}",
                               shard=f"{i}/{n}", run_id="ingest"),
                    stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / f"ps{i}.log", "w")))
                while not port_file.exists():
                    if procs[-1].poll() is not None:
                        raise SystemExit((Path(tmp) / f"ps{i}.log").read_text())
                    time.sleep(0.05)
                ports.append(int(port_file.read_text()))
            ctx = mp.get_context("spawn")
            q: mp.Queue = ctx.Queue()
            addresses = [f"127.0.0.1:{p}" for p in ports]
            clients = [ctx.Process(target=client, args=(addresses, s, rounds, q)) for s in SITES]
            for c in clients:
                c.start()
            stats: dict = {}
            peak = 0.0
            while len(stats) < len(clients):
                try:
                    name, st = q.get(timeout=0.5)
                    stats[name] = st
                except queue.Empty:
                    pass
                peak = max(peak, sum(peak_rss_mb(p.pid) for p in procs))
            for c in clients:
                c.join(60)
            for p in procs:
                p.wait(120)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    per_round = ingest_per_round(stats, rounds)
    return {"shards": n, "ingest_MBps_per_round": per_round, "ingest_MBps_median": median(per_round),
            "wire_MB_per_round_all_sites": sum(stats[s][0][3] for s in SITES) / 1e6, "ps_peak_rss_MB_summed": peak}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shards", default="1,2,4")
    args = ap.parse_args()
    arms = [run_shards(args.preset, args.rounds, int(n)) for n in args.shards.split(",")]
    one = arms[0]["ingest_MBps_median"]
    print(f"PS ingest from 3 concurrent sites, {args.preset}, {arms[0]['wire_MB_per_round_all_sites']:.0f} MB of "
          f"int8+Huffman deltas per round, {os.cpu_count()} cores for PS shards and clients together:")
    for a in arms:
        a["vs_one_shard"] = a["ingest_MBps_median"] / one
        print(f"  {a['shards']} shard(s): median {a['ingest_MBps_median']:.0f} MB/s ({a['vs_one_shard']:.2f}x one "
              f"shard; rounds {', '.join(f'{x:.0f}' for x in a['ingest_MBps_per_round'])}), shards' peak memory "
              f"summed {a['ps_peak_rss_MB_summed']:.0f} MB")
    print("wrote", save("shard_ingest", {"preset": args.preset, "rounds": args.rounds, "cores": os.cpu_count(),
                                         "arms": arms}))


if __name__ == "__main__":
    main()
