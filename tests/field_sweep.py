"""Every numeric field of every delta message a site sends, at its type's extremes, through what
the PS does with it; the PS's memory measured around each (run as a script: tests/test_field_sweep.py).

The messages are a valid delta's, in each encoding a run allows: its manifest, its chunks, a
parity that rebuilds a chunk, its metrics. Each case is the valid message with one field changed
(each scalar of the protobuf message and of every message in it, to 0, 1, its type's largest
values, and for floats the infinities and NaN), or a bytes field cut or lengthened, or four
bytes of a chunk's payload (each of its first 64 offsets, and its last) set to 0 or all ones (the
payload's own header: block index, code tables, counts). It goes through the PS's path: the wire
parser (wire.parse_site_message), then, on a fresh upload that holds what the message needs, the
check (check_manifest, check_chunk, check_parity, check_claims), the decoding (extract_chunk) and
a parity's rebuild. Each either is refused with a ProtocolError (or the codec's error) or taken.

Memory: the peak resident size (VmHWM, reset before each case through /proc/self/clear_refs) and
the peak of Python's and numpy's traced allocations (tracemalloc, which sees an allocation even
where its pages are never touched), each above where it stood before the case and beyond the message's own bytes
(gRPC holds them, at most limits.max_message_bytes), in units of the run's largest chunk as
float32 (4 x its elements: what decoding it makes). Prints one JSON
object: the largest of each over all cases and the case that made it.
"""

from __future__ import annotations

import copy
import json
import math
import resource
import sys
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UINT = {"TYPE_UINT32": 32, "TYPE_FIXED32": 32, "TYPE_UINT64": 64, "TYPE_FIXED64": 64}
SINT = {"TYPE_INT32": 32, "TYPE_SINT32": 32, "TYPE_SFIXED32": 32, "TYPE_INT64": 64, "TYPE_SINT64": 64,
        "TYPE_SFIXED64": 64}


def extremes(field) -> list:
    from google.protobuf.descriptor import FieldDescriptor as F
    t = F.Type.Name(field.type) if hasattr(F, "Type") else {v: k for k, v in vars(F).items()
                                                            if k.startswith("TYPE_")}[field.type]
    if t in UINT:
        n = UINT[t]
        return [0, 1, 2 ** (n - 1) - 1, 2 ** (n - 1), 2 ** n - 2, 2 ** n - 1]
    if t in SINT:
        n = SINT[t]
        return [-(2 ** (n - 1)), -1, 0, 1, 2 ** (n - 1) - 1]
    if t in ("TYPE_DOUBLE", "TYPE_FLOAT"):
        return [0.0, -1.0, 1e-300 if t == "TYPE_DOUBLE" else 1e-38, 3e38, math.inf, -math.inf, math.nan]
    if t == "TYPE_ENUM":
        return [v.number for v in field.enum_type.values] + [99, 2 ** 31 - 1, -1]
    if t == "TYPE_BOOL":
        return [False, True]
    return []


def scalar_cases(msg, path: str = ""):
    """(name, changed copy of the top message) for each scalar field of `msg` and the messages in it."""
    for field in msg.DESCRIPTOR.fields:
        name = f"{path}{field.name}"
        if field.message_type is not None:
            if field.label == field.LABEL_REPEATED:
                items = getattr(msg, field.name)
                for i in sorted({0, len(items) - 1}) if len(items) else ():
                    yield from scalar_cases(items[i], f"{name}[{i}].")
            elif msg.HasField(field.name):
                yield from scalar_cases(getattr(msg, field.name), f"{name}.")
            continue
        if field.label == field.LABEL_REPEATED:
            continue
        for v in extremes(field):
            yield name, field.name, v


def cases(top):
    """(name, serialized message) for every change of `top` (a pb.SiteMessage)."""
    body = getattr(top, top.WhichOneof("body"))
    for name, fname, value in scalar_cases(body):
        m = copy.deepcopy(top)
        target = _resolve(getattr(m, m.WhichOneof("body")), name)
        try:
            setattr(target, fname, value)
        except (ValueError, TypeError):
            continue                   # protobuf itself refuses the value: a site cannot send it
        yield f"{name}={value}", m.SerializeToString()
    for fname in ("scales", "payload"):
        if fname in body.DESCRIPTOR.fields_by_name:
            raw = getattr(body, fname)
            for label, new in (("empty", b""), ("one byte", raw[:1]), ("cut by 1", raw[:-1]), ("half", raw[: len(raw) // 2]),
                               ("plus 4", raw + b"\xff" * 4), ("doubled", raw + raw)):
                m = copy.deepcopy(top)
                setattr(getattr(m, m.WhichOneof("body")), fname, new)
                yield f"{fname} {label}", _fix_crc(m)
    if "payload" in body.DESCRIPTOR.fields_by_name and len(body.payload) >= 8:
        raw = body.payload
        for offset in [*range(min(64, len(raw) - 4)), len(raw) - 4]:
            for word in (b"\x00" * 4, b"\xff" * 4, b"\xff\xff\xff\x7f"):
                m = copy.deepcopy(top)
                b = getattr(m, m.WhichOneof("body"))
                b.payload = raw[:offset] + word + raw[offset + 4:]
                yield f"payload[{offset}:{offset + 4}]={word.hex()}", _fix_crc(m)


def _resolve(msg, dotted: str):
    """The message that holds the last field of `dotted` ("chunks[0].nbytes" -> chunks[0])."""
    parts = dotted.split(".")[:-1]
    for p in parts:
        if "[" in p:
            fname, i = p[:-1].split("[")
            msg = getattr(msg, fname)[int(i)]
        else:
            msg = getattr(msg, p)
    return msg


def _fix_crc(m):
    """A chunk's CRC recomputed (a hostile site gets it right; it is no defence)."""
    import zlib
    if m.WhichOneof("body") == "chunk":
        m.chunk.crc32 = zlib.crc32(m.chunk.payload, zlib.crc32(m.chunk.scales))
    return m.SerializeToString()


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    import torch

    from tests.helpers import small_config
    from wantrain.transport import wire
    from wantrain.codec import Codec, EncodeStats, encode_arrays, load_kernels
    from wantrain.config import CODEC_MODES
    from wantrain.errors import CodecError, ProtocolError, WantrainError
    from wantrain.transport.messages import DELTA, DeltaParity, RoundMetrics, TensorChunk
    from wantrain.ps.model import GlobalModel
    from wantrain.ps.uploads import Upload, check_chunk, check_manifest, check_parity, extract_chunk, rebuild_member
    from wantrain.transport.manifest import build_manifest, protect
    from wantrain.transport.sending import group_parities
    from wantrain.transport.roles import roles_of
    from wantrain.models.params import named_params
    from wantrain.outer.screening import check_claims
    from wantrain.data import load_run_data

    torch.set_num_threads(1)
    modes = [m for m in CODEC_MODES if not m.startswith("topk")] + [m for m in CODEC_MODES if m.startswith("topk")][:1]
    load_kernels(modes)
    results = {"cases": 0, "refused": 0, "taken": 0, "rss_growth": 0, "rss_case": "", "traced_growth": 0,
               "traced_case": "", "largest_chunk_bytes": {}, "modes": modes, "errors": [], "quant_block": {}}
    tracemalloc.start()
    def sweep(mode: str) -> None:
        # tiny: growth is measured in units of the largest chunk, which a model as small as the
        # tests' usual one (micro) makes too small to stand above the allocator's own pages
        cfg = small_config(num_sites=1, **{"codec.mode": mode, "model.preset": "tiny"})
        tok, corpus = load_run_data(cfg.data)
        model = GlobalModel(cfg, tok.vocab_size, corpus.val)
        rng = np.random.default_rng(0)
        delta = {k: (rng.standard_normal(n) * 1e-3).astype(np.float32) for k, n in model.shapes.items()}
        stats = EncodeStats()
        chunks, values = encode_arrays(delta, Codec(cfg.codec), None, stats)
        roles = roles_of({k: tuple(p.shape) for k, p in named_params(model.model).items()})
        manifest = protect(build_manifest(0, chunks, values, roles, tokens=64, steps=1), 1.0, 4)
        msgs = [TensorChunk(DELTA, 0, i, len(chunks), s, e) for i, (s, e) in enumerate(chunks)]
        parities = group_parities(manifest, chunks)
        group, parity = next(iter(parities.items()))
        lost = manifest_members = [e.index for e in manifest.chunks if e.group == group]
        lost = manifest_members[0]
        metrics = RoundMetrics(round=0, train_loss=3.0, last_train_loss=3.0, tokens=64, steps=1,
                               raw_bytes=4 * model.num_params, wire_bytes=stats.wire_bytes, huffman_bits_per_symbol=4.0,
                               encode_s=0.1, decode_s=0.1, compute_s=0.1, send_s=0.1, chunks=len(msgs))
        largest = 4 * max(s.length for s in model.plan)        # the plan's largest chunk, as float32
        results["largest_chunk_bytes"][mode] = largest
        modes_ok, block = cfg.codec.delta_modes(), cfg.codec.quant_block

        def fresh() -> tuple[Upload, Upload]:
            """A fresh upload, and one that holds a manifest and every member of a parity group but one."""
            waiting = Upload(0)
            waiting.take_manifest(manifest)
            for i in manifest_members:
                if i != lost:
                    waiting.add("a", msgs[i])
            for f in waiting.decoding.values():
                f.result()
            return Upload(0), waiting

        def take(obj, up: Upload, waiting: Upload) -> None:
            """What the PS does with a delta message, on a fresh upload holding what it needs."""
            if isinstance(obj, RoundMetrics):
                check_claims(cfg, obj, 0.0, model.num_params, stats.wire_bytes, 0)
            elif isinstance(obj, DeltaParity):
                up = waiting
                check_parity(up, obj)
                up.take_parity(obj)
                rebuild_member(up, "a", obj.group, model.plan, model.shapes, cfg.codec)
                for f in up.decoding.values():
                    f.result()
            elif isinstance(obj, TensorChunk):
                if check_chunk(up, obj, model.plan, model.shapes, modes_ok, block):
                    extract_chunk("a", obj)
            else:
                check_manifest(cfg, up, obj, model.plan)
                up.take_manifest(obj)

        valid = [("manifest", wire.site_message(manifest)), ("parity", wire.site_message(DeltaParity(0, group, parity))),
                 ("metrics", wire.site_message(metrics))]
        big = max(range(len(msgs)), key=lambda i: msgs[i].spec.length)
        valid += [(f"chunk {i}", wire.site_message(msgs[i])) for i in sorted({0, big, len(msgs) - 1})]
        for what, top in valid:
            take(wire.parse_site_message(top.SerializeToString()), *fresh())       # the valid message is taken
            for case, raw in cases(top):
                name = f"{mode} {what} {case}"
                uploads = fresh()
                before_rss, (before_traced, _) = rss(), tracemalloc.get_traced_memory()
                reset_peak()
                tracemalloc.reset_peak()
                outcome = "taken"
                try:
                    take(wire.parse_site_message(raw), *uploads)
                    results["taken"] += 1
                except (ProtocolError, CodecError, WantrainError):
                    results["refused"] += 1
                    outcome = "refused"
                except Exception as e:          # anything else is a bug the PS would log as a traceback
                    results["errors"].append(f"{name}: {type(e).__name__}: {e}"[:300])
                # Beyond the message's own bytes (gRPC holds them: at most limits.max_message_bytes),
                # in the mode's largest chunks.
                grew_rss = (peak_rss() - before_rss - len(raw)) / largest
                grew_traced = (tracemalloc.get_traced_memory()[1] - before_traced - len(raw)) / largest
                results["cases"] += 1
                if "quant_block=" in case and mode != "fp32" and what.startswith("chunk"):
                    results["quant_block"][name] = outcome
                if grew_rss > results["rss_growth"]:
                    results["rss_growth"], results["rss_case"] = grew_rss, name
                if grew_traced > results["traced_growth"]:
                    results["traced_growth"], results["traced_case"] = grew_traced, name

    for mode in modes:
        sweep(mode)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
