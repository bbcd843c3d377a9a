"""Large-model benchmark: peak memory of the PS while the Llama-3-class 1B preset joins.

A real `wantrain ps` process holds the llama3-1b preset (1,235,814,400 parameters, 4.94 GB
fp32). A client process joins over the real wire, downloads every model chunk, says Ready,
and (with --push) pushes a full-size int8+Huffman delta generated chunk by chunk, then waits for
the round's result. The PS's VmHWM (peak resident memory) is read from /proc after each phase
and reported side by side with the baseline it must stay near: the fp32 size of the model it
has to hold anyway. The client never holds more than one chunk.

    python bench/large_model.py [--preset llama3-1b] [--push]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save
from wantrain.launch.argv import ps_command


def vm(pid: int, key: str) -> float:
    """A /proc/<pid>/status figure (VmRSS, VmHWM) in GB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024 / 1e9
    raise KeyError(key)


class RssSampler:
    """The highest VmRSS of a process seen every 20 ms since the last reset (a phase's own peak)."""

    def __init__(self, pid: int) -> None:
        import threading
        self.pid, self.peak, self.stop = pid, 0.0, False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop:
            try:
                self.peak = max(self.peak, vm(self.pid, "VmRSS"))
            except (FileNotFoundError, KeyError, ProcessLookupError):
                return
            time.sleep(0.02)

    def take(self) -> float:
        peak, self.peak = self.peak, 0.0
        return peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama3-1b")
    p.add_argument("--push", action="store_true", help="also push one full delta and wait for the round")
    a = p.parse_args()

    import numpy as np

    from wantrain.transport import net, wire
    from wantrain.codec import Codec, EncodeStats, plan_chunks
    from wantrain.config import RunConfig
    from wantrain.transport.messages import (DELTA, MODEL, Join, Ready, RoundMetrics, RoundResult, RoundStart,
                                             TensorChunk, Welcome)
    from wantrain.models import build_model
    from wantrain.models.params import named_params

    cfg = RunConfig().replace(**{"num_sites": 1, "model.preset": a.preset, "model.block_size": 32,
                                 "train.rounds": 1, "train.batch_size": 1, "train.eval_batches": 1,
                                 "train.checkpoint_every": 0})
    sizes = {k: p.numel() for k, p in named_params(build_model(a.preset, 256, 0, "meta")).items()}
    fp32_gb = 4 * sum(sizes.values()) / 1e9
    tmp = Path(tempfile.mkdtemp(prefix="wantrain-large-"))
    (tmp / "c.json").write_text(cfg.to_json())
    ps = subprocess.Popen(ps_command(sys.executable, tmp / "c.json", port_file=tmp / "port", run_dir=tmp / "run"),
                          stdout=subprocess.DEVNULL, stderr=open(tmp / "ps.log", "wb"))
    out: dict = {"preset": a.preset, "parameters": sum(sizes.values()), "fp32_gb": fp32_gb}
    try:
        t0 = time.time()
        while not (tmp / "port").exists():
            if ps.poll() is not None:
                raise SystemExit((tmp / "ps.log").read_text()[-3000:])
            time.sleep(0.2)
        out["ps_start_s"] = time.time() - t0
        out["ps_peak_after_start_gb"] = vm(ps.pid, "VmHWM")
        out["ps_rss_idle_gb"] = vm(ps.pid, "VmRSS")
        print(f"PS up in {out['ps_start_s']:.0f} s: RSS {out['ps_rss_idle_gb']:.2f} GB, "
              f"peak so far {out['ps_peak_after_start_gb']:.2f} GB (model fp32 {fp32_gb:.2f} GB)", flush=True)
        address = f"127.0.0.1:{int((tmp / 'port').read_text())}"
        sampler = RssSampler(ps.pid)
        with net.channel(address) as ch:
            import queue
            q: queue.Queue = queue.Queue()
            q.put(wire.site_message(Join("big")))
            stream = net.stub(ch).Session(iter(q.get, None))
            t0 = time.time()
            w = wire.server_message_from_proto(next(stream))
            assert isinstance(w, Welcome), w
            got = 0
            for _ in range(w.model_chunks):
                c = wire.server_message_from_proto(next(stream))
                assert c.kind == MODEL
                got += c.data.wire_bytes
            out["download_s"] = time.time() - t0
            out["download_gb"] = got / 1e9
            out["ps_peak_after_join_gb"] = vm(ps.pid, "VmHWM")
            out["ps_peak_during_join_gb"] = sampler.take()
            print(f"downloaded {got / 1e9:.2f} GB in {out['download_s']:.0f} s; PS RSS peak during the join "
                  f"{out['ps_peak_during_join_gb']:.2f} GB",
                  flush=True)
            q.put(wire.site_message(Ready(w.round, w.model_hash)))
            if a.push:
                start = wire.server_message_from_proto(next(stream))
                assert isinstance(start, RoundStart), start
                codec, rng, stats = Codec(cfg.codec), np.random.default_rng(0), EncodeStats()
                plan = plan_chunks(sizes, cfg.codec.chunk_elements())
                t0 = time.time()
                for i, spec in enumerate(plan):       # generated and encoded one chunk at a time
                    enc, _ = codec.encode((rng.standard_normal(spec.length) * 1e-3).astype(np.float32), stats)
                    q.put(wire.site_message(TensorChunk(DELTA, start.round, i, len(plan), spec, enc)))
                    while q.qsize() > 8:               # keep the client's own memory small
                        time.sleep(0.01)
                q.put(wire.site_message(RoundMetrics(
                    round=start.round, train_loss=1.0, last_train_loss=1.0, tokens=1000, steps=1,
                    raw_bytes=stats.raw_bytes, wire_bytes=stats.wire_bytes, huffman_bits_per_symbol=0.0, encode_s=0,
                    decode_s=0, compute_s=0, send_s=0, chunks=len(plan))))
                out["push_gb"] = stats.wire_bytes / 1e9
                for m in stream:
                    msg = wire.server_message_from_proto(m)
                    if isinstance(msg, RoundResult):
                        break
                out["round_s"] = time.time() - t0
                out["ps_peak_after_round_gb"] = vm(ps.pid, "VmHWM")
                out["ps_peak_during_round_gb"] = sampler.take()
                print(f"pushed {out['push_gb']:.2f} GB, round done in {out['round_s']:.0f} s; "
                      f"PS RSS peak during the round {out['ps_peak_during_round_gb']:.2f} GB", flush=True)
            q.put(None)
    finally:
        ps.kill()
        ps.wait()
    for k in [k for k in out if k.startswith("ps_peak")]:
        out[k.replace("_gb", "_x_model")] = out[k] / fp32_gb
    print(json.dumps(out, indent=2))
    save(f"large_model_{a.preset}", out)


if __name__ == "__main__":
    main()
