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
import asyncio
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
from server_bench import SITES, median, peak_rss_mb


def client(addresses: list[str], name: str, rounds: int, results: mp.Queue) -> None:
    import numpy as np

    from wantrain import net, wire
    from wantrain.codec import Codec, encode_arrays
    from wantrain.messages import (DELTA, MODEL, HashReport, Join, Ready, RoundMetrics, RoundResult, RoundStart,
                                   TensorChunk, Welcome)
    from wantrain.models import build_model
    from wantrain.replica import named_params
    from wantrain.shards import ShardLayout

    async def shard(call, i: int, starts: asyncio.Queue, results_q: asyncio.Queue, setup: asyncio.Future) -> None:
        """Everything but the push on shard i's stream: the model download, Ready, hash reports."""
        left, welcome = 0, None
        while True:
            msg = wire.server_message_from_proto(await call.read())
            if isinstance(msg, Welcome):
                welcome, left = msg, msg.model_chunks
                if not setup.done():
                    setup.set_result(msg.config)
            elif isinstance(msg, TensorChunk) and msg.kind == MODEL:
                left -= 1
                if left == 0 and welcome is not None:
                    await call.write(wire.site_message(Ready(welcome.round, welcome.model_hash)))
            elif isinstance(msg, RoundStart):
                starts.put_nowait(msg.round)
            elif isinstance(msg, RoundResult):
                await call.write(wire.site_message(HashReport(msg.round, msg.model_hash)))
                results_q.put_nowait(msg.round)
                if msg.round + 1 >= rounds:
                    return

    async def push(call, round_: int, chunks, raw: int, wire_bytes: int) -> None:
        for k, (spec, enc) in enumerate(chunks):
            await call.write(wire.site_message(TensorChunk(DELTA, round_, k, len(chunks), spec, enc)))
        await call.write(wire.site_message(RoundMetrics(
            round=round_, train_loss=1.0, last_train_loss=1.0, tokens=1000, steps=1, raw_bytes=raw,
            wire_bytes=wire_bytes, huffman_bits_per_symbol=0.0, encode_s=0, decode_s=0, compute_s=0, comm_s=0,
            chunks=len(chunks))))

    async def run() -> None:
        n = len(addresses)
        channels = [net.channel(a, aio=True) for a in addresses]
        calls = [net.stub(ch).Session() for ch in channels]
        starts = [asyncio.Queue() for _ in calls]
        done = [asyncio.Queue() for _ in calls]
        setup = asyncio.get_running_loop().create_future()
        for call in calls:
            await call.write(wire.site_message(Join(name)))
        readers = [asyncio.create_task(shard(c, i, starts[i], done[i], setup)) for i, c in enumerate(calls)]
        cfg = await setup
        model = build_model(cfg.model.preset, 256, cfg.model.seed, "meta")
        rng = np.random.default_rng(SITES.index(name))
        delta = {k: (rng.standard_normal(p.numel()) * 1e-3).astype(np.float32) for k, p in named_params(model).items()}
        layout = ShardLayout.balanced({k: v.size for k, v in delta.items()}, n)
        parts = []
        for i in range(n):
            chunks, _ = encode_arrays(layout.part(delta, i), Codec(cfg.codec), None)
            parts.append((chunks, 4 * sum(v.size for v in layout.part(delta, i).values()),
                          sum(e.wire_bytes for _, e in chunks)))
        stats = []
        for _ in range(rounds):
            rs = {await q.get() for q in starts}
            (r,) = rs
            t0 = time.time()
            await asyncio.gather(*(push(calls[i], r, *parts[i]) for i in range(n)))
            stats.append((r, t0, time.time(), sum(p[2] for p in parts)))
            for q in done:
                await q.get()
        await asyncio.gather(*readers)
        for call in calls:
            await call.done_writing()
        for ch in channels:
            await ch.close()
        results.put((name, stats))

    asyncio.run(run())


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
                    [sys.executable, "-m", "wantrain", "ps", "--config", str(Path(tmp) / "c.json"), "--port", "0",
                     "--port-file", str(port_file), "--run-dir", str(Path(tmp) / f"shard{i}"),
                     "--shard", f"{i}/{n}", "--run-id", "ingest"],
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
    per_round = []
    for r in range(rounds):
        entries = [next(x for x in stats[s] if x[0] == r) for s in SITES]
        start, end = min(e[1] for e in entries), max(e[2] for e in entries)
        per_round.append(sum(e[3] for e in entries) / (end - start) / 1e6)
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
