"""Server benchmark: wire MB/s a real PS process ingests from three concurrent sites over loopback.

A real `wantrain ps` process runs the real round protocol; three client processes (separate OS
processes, the real wire code) join, download the model, and for each round push a pre-encoded
int8+Huffman delta as fast as gRPC flow control lets them. Ingest rate per round = all sites'
delta bytes / (first chunk sent -> last site's metrics accepted by the stream). The baseline,
side by side in the same run: the same bytes over plain TCP sockets on loopback (3 senders, one
receiver process that reads them), reported as a ratio.

    python bench/server_bench.py [--preset small] [--rounds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import queue
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save
from wantrain.launch.argv import ps_command

SITES = ("us-east", "eu-west", "ap-southeast")


def client(addresses: list[str], name: str, rounds: int, results: mp.Queue) -> None:
    """One site's pushes, without training: it joins the PS (or every shard of a sharded one), and
    each round pushes every shard its part of a pre-encoded delta, to all at once; it puts
    (name, [(round, push start, push end, wire bytes)]) on `results`."""
    import numpy as np

    from wantrain.transport import net, wire
    from wantrain.codec import Codec, encode_arrays
    from wantrain.transport.messages import (DELTA, MODEL, HashReport, Join, Ready, RoundMetrics, RoundResult,
                                             RoundStart, TensorChunk, Welcome)
    from wantrain.models import build_model
    from wantrain.models.params import named_params
    from wantrain.models.shards import ShardLayout

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
            wire_bytes=wire_bytes, huffman_bits_per_symbol=0.0, encode_s=0, decode_s=0, compute_s=0, send_s=0,
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


def tcp_baseline(nbytes: int, senders: int = 3) -> float:
    """MB/s of one receiving process reading `nbytes` from each of `senders` processes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(senders)
    port = srv.getsockname()[1]
    code = (f"import socket,time; s=socket.create_connection(('127.0.0.1',{port})); b=bytes(1<<20); n={nbytes}\n"
            "while n>0:\n s.sendall(b[:min(n,len(b))]); n-=len(b)\ns.close()")
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(senders)]
    conns = [srv.accept()[0] for _ in range(senders)]
    t0 = time.time()
    got = 0
    import selectors
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    buf = bytearray(1 << 20)
    open_conns = len(conns)
    while open_conns:
        for key, _ in sel.select():
            k = key.fileobj.recv_into(buf)
            if k == 0:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                open_conns -= 1
            got += k
    dt = time.time() - t0
    for p in procs:
        p.wait()
    srv.close()
    return got / dt / 1e6


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MB; 0 once it is gone."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def ingest_per_round(stats: dict, rounds: int) -> list[float]:
    """MB/s of each round: all sites' delta bytes over first push start -> last push end."""
    per_round = []
    for r in range(rounds):
        entries = [next(x for x in stats[s] if x[0] == r) for s in SITES]
        start, end = min(e[1] for e in entries), max(e[2] for e in entries)
        per_round.append(sum(e[3] for e in entries) / (end - start) / 1e6)
    return per_round


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else float("nan")


def run_ps(preset: str, rounds: int, checkpoint_every: int) -> dict:
    """One run of a real PS and three pushing clients; the PS's round figures and peak memory."""
    from wantrain.config import RunConfig
    from wantrain.telemetry import read_events, rows

    cfg = RunConfig().replace(**{"model.preset": preset, "train.rounds": rounds, "train.eval_batches": 0,
                                 "train.checkpoint_every": checkpoint_every})
    peak = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.json").write_text(cfg.to_json())
        port_file = Path(tmp) / "port"
        ps = subprocess.Popen(ps_command(sys.executable, Path(tmp) / "c.json", port_file=port_file, run_dir=tmp),
                              stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "ps.log", "w"))
        try:
            while not port_file.exists():
                if ps.poll() is not None:
                    raise SystemExit((Path(tmp) / "ps.log").read_text())
                time.sleep(0.05)
            address = f"127.0.0.1:{int(port_file.read_text())}"
            ctx = mp.get_context("spawn")
            q: mp.Queue = ctx.Queue()
            clients = [ctx.Process(target=client, args=([address], s, rounds, q)) for s in SITES]
            for c in clients:
                c.start()
            stats: dict = {}
            while len(stats) < len(clients):          # sample the PS's peak memory while it works
                try:
                    name, st = q.get(timeout=0.5)
                    stats[name] = st
                except queue.Empty:
                    pass
                peak = max(peak, peak_rss_mb(ps.pid))
            for c in clients:
                c.join(60)
            while ps.poll() is None:
                peak = max(peak, peak_rss_mb(ps.pid))
                time.sleep(0.2)
        finally:
            if ps.poll() is None:
                ps.kill()
        events = read_events(tmp)
    per_round = ingest_per_round(stats, rounds)
    # Where the PS's part of a round goes: aggregate = outer step + update encode + apply (+ hash);
    # encode_s sums the chunks' encode times over the threads; checkpoint_s: the full state, written
    # in the background (not part of the round since the journal, ps/journal.py).
    ends = rows(events, "round_end")
    return {"wire_MB_per_round_all_sites": sum(next(x for x in stats[s] if x[0] == 0)[3] for s in SITES) / 1e6,
            "ingest_MBps_per_round": per_round, "ingest_MBps_median": median(per_round),
            "ps_round_s_median": median([e["round_s"] for e in ends]),
            "aggregate_s_median": median([e["aggregate_s"] for e in ends]),
            "update_encode_s_summed_median": median([e["encode_s"] for e in ends]),
            "checkpoint_s_median": median([e["seconds"] for e in rows(events, "checkpoint")]),
            "ps_peak_rss_MB": peak}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()

    # Side by side: the PS as it runs (a journal record per round, the full state in the
    # background every round) and with no durability at all (checkpoint_every 0): the difference
    # is what durability costs a round.
    durable = run_ps(args.preset, args.rounds, checkpoint_every=1)
    bare = run_ps(args.preset, args.rounds, checkpoint_every=0)
    baseline = tcp_baseline(int(durable["wire_MB_per_round_all_sites"] * 1e6) // 3)
    result = {"preset": args.preset, "rounds": args.rounds, "durable": durable, "no_durability": bare,
              "round_durable_vs_none": durable["ps_round_s_median"] / bare["ps_round_s_median"],
              "raw_tcp_loopback_MBps": baseline, "ingest_vs_raw_tcp": durable["ingest_MBps_median"] / baseline}
    print(f"PS ingest from 3 concurrent sites ({args.preset}, {durable['wire_MB_per_round_all_sites']:.1f} MB of "
          f"int8+Huffman deltas per round): median {durable['ingest_MBps_median']:.0f} MB/s (rounds: "
          f"{', '.join(f'{x:.0f}' for x in durable['ingest_MBps_per_round'])})")
    print(f"baseline, same bytes over plain TCP on loopback into one process: {baseline:.0f} MB/s; "
          f"gRPC ingest / raw TCP = {result['ingest_vs_raw_tcp']:.2f}")
    for label, r in (("durable (journal + background checkpoint)", durable), ("no durability", bare)):
        print(f"{label}: whole round at the PS (push + decode + aggregate + encode + send) median "
              f"{r['ps_round_s_median']:.2f} s; aggregate {r['aggregate_s_median']:.2f} s, update encode "
              f"{r['update_encode_s_summed_median']:.2f} s summed, full checkpoint {r['checkpoint_s_median']:.2f} s "
              f"(background); PS peak memory {r['ps_peak_rss_MB']:.0f} MB")
    print(f"round with durability / without: {result['round_durable_vs_none']:.2f}")
    print("wrote", save("server", result))


if __name__ == "__main__":
    main()
