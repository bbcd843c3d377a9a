"""The baseline of bench/aggregate_bench.py: the PS round's chunk step as it was before its element
loops were compiled (numpy only, up to commit 4bcd3e8): dequantize every delta, average, Nesterov
step, add the residual, quantize, dequantize what was sent, record the residual, apply. Each numpy
expression is a pass over memory with a temporary. The compiled step must give the same bits;
the bench checks it does. Not part of the package; nothing but the bench imports it."""

from __future__ import annotations

import numpy as np

from wantrain.codec import Encoded
from wantrain.codec import huffman
from wantrain.codec.quantize import QMAX, TINY, dequantize_int8, num_blocks
from wantrain.runtime.cpu_pool import map_ordered
from wantrain.transport.messages import UPDATE, TensorChunk


def quantize(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    n = x.size
    nb = num_blocks(n, block)
    padded = np.zeros(nb * block, dtype=np.float32)
    padded[:n] = x
    blocks = padded.reshape(nb, block)
    absmax = np.max(np.abs(blocks), axis=1)
    scales = np.where(absmax >= TINY, absmax / np.float32(QMAX), np.float32(0)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))
    q = np.rint(blocks / safe[:, None])
    np.clip(q, -QMAX, QMAX, out=q)
    return q.astype(np.int8).reshape(-1)[:n], scales


def aggregate_round(round_, plan, shapes, params, contributions, buf, residuals, lr, momentum, cfg):
    """The numpy round: `buf` (outer momentum) and `residuals` (downlink error feedback) are dicts of
    flat float32 arrays that exist already; int8-huffman mode, token-weighted mean."""
    keys = sorted(contributions)
    weights = [contributions[k].weight for k in keys]
    total = float(sum(weights))
    lr, momentum = np.float32(lr), np.float32(momentum)

    def step(i: int) -> TensorChunk:
        spec = plan[i]
        part = slice(spec.offset, spec.offset + spec.length)
        values = [contributions[k].parts[i].values() for k in keys]
        avg = np.zeros_like(values[0])
        for w, v in zip(weights, values):
            avg += np.float32(w / total) * v
        b = buf[spec.tensor][part]
        b *= momentum
        b += avg
        update = -lr * (avg + momentum * b) + residuals[spec.tensor][part]
        q, scales = quantize(update, cfg.quant_block)
        payload = huffman.encode(q, cfg.huffman_block, cfg.huffman_tables)
        enc = Encoded("int8-huffman", update.size, cfg.quant_block, scales.astype("<f4").tobytes(), payload)
        sent = dequantize_int8(q, scales, cfg.quant_block)
        residuals[spec.tensor][part] = update - sent
        params[spec.tensor][part] += sent
        return TensorChunk(UPDATE, round_, i, len(plan), spec, enc)

    return map_ordered(step, range(len(plan)))
