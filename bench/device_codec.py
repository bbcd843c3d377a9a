"""The codec's torch path (wantrain/codec/on_device.py) beside the compiled CPU path, on one real
delta: encode (quantize + Huffman) and decode (Huffman + dequantize) in MB/s of parameters, the
payloads checked byte-identical and the values bit-identical. On a GPU the torch figures include
the copy of the coded bytes to and from the host, not of the float32 values (which stay there).

    python bench/device_codec.py [--device cuda] [--preset small] [--steps 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save

import numpy as np
import torch

from wantrain.codec import Codec
from wantrain.config import CodecConfig
from wantrain.studies.compression import best_of, real_delta


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    codec = Codec(CodecConfig())
    flat = real_delta(args.preset, args.steps)["flat"]
    step = codec.cfg.chunk_elements()
    parts = [flat[i:i + step] for i in range(0, flat.size, step)]
    on_dev = [torch.from_numpy(p).to(dev) for p in parts]

    cpu = [codec.encode(p) for p in parts]
    dev_out = [codec.encode_on_device(t) for t in on_dev]
    encs = [e for e, _ in cpu]
    if encs != [e for e, _ in dev_out]:
        raise SystemExit("the torch path's payloads differ from the CPU path's")
    decoded_cpu, decoded_dev = Codec.decode_many(encs), Codec.decode_on_device(encs, dev)
    if not all(np.array_equal(a.view(np.uint32), b.cpu().numpy().view(np.uint32)) for a, b in zip(decoded_cpu, decoded_dev)):
        raise SystemExit("the torch path decodes other values than the CPU path")

    def timed(fn) -> float:
        def run():
            fn()
            sync()
        run()                                              # warm-up (kernels, caches)
        return best_of(run, 3)

    mb = flat.size / 1e6
    t = {"compiled encode": timed(lambda: [codec.encode(p) for p in parts]),
         "compiled decode": timed(lambda: Codec.decode_many(encs)),
         "torch encode": timed(lambda: [codec.encode_on_device(x) for x in on_dev]),
         "torch decode": timed(lambda: Codec.decode_on_device(encs, dev))}
    mbps = {k: mb / v for k, v in t.items()}
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "the CPU build of torch"
    print(f"{args.preset}: {flat.size / 1e6:.1f} M parameters in {len(parts)} chunks, torch on {name}")
    print("MB/s of parameters: " + ", ".join(f"{k} {v:.0f}" for k, v in mbps.items()))
    print(f"torch on {dev.type} / compiled on the CPU: encode {mbps['torch encode'] / mbps['compiled encode']:.2f}x, "
          f"decode {mbps['torch decode'] / mbps['compiled decode']:.2f}x; payloads and values identical")
    print("wrote", save(f"device_codec_{dev.type}", {"device": name, "params": int(flat.size), "MBps": mbps}))


if __name__ == "__main__":
    main()
