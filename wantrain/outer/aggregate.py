"""One round's aggregation at the parameter server: average, outer step, encode, apply.

`aggregate_round` runs in a worker thread while the event loop keeps serving. It works chunk by
chunk of the plan, the chunks on every core at once (cpu_pool.py; numpy and the compiled coder release
the GIL), so the PS's memory stays at the model, the outer momentum, the downlink residual and
each site's int8 delta plus a few chunks in flight, with no whole-model temporaries. Chunks touch
disjoint elements, and every element sees the same float32 operations as a whole-tensor
computation would (tests/test_server.py checks), whatever thread ran it.

The average is the token-weighted mean, sites in name order, or (robust.aggregate =
"trimmed_mean") a coordinate-wise trimmed mean. Inputs were screened before (screening.py):
finite, bounded by the model's norm, so no float32 below can overflow.

Two inputs serve deltas, or parts of them, that missed their round (studies/late.py measures the
policies they make): a chunk missing from a delta (a None part; a delta that did not come at all
has every part None) is substituted as `substitute` says, "peer" (the mean over the deltas that
hold it) or "zero" (its weight kept in that chunk's denominator; a chunk no delta holds averages to
zero); and `side` holds deltas of earlier rounds, or their chunks, added to the update outside the
outer momentum, each scaled by its share of its own round (`Contribution.weight`), so delayed mass
is never amplified by the momentum buffer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import kernels
from ..runtime.cpu_pool import map_ordered
from ..codec import ChunkSpec, Codec, EncodeStats, ErrorFeedback, Extracted
from ..config import Aggregation
from ..errors import WantrainError
from ..transport.messages import UPDATE, TensorChunk
from .nesterov import OuterNesterov

__all__ = ["Contribution", "aggregate_round", "weighted_mean", "weighted_sum", "trim_count", "trimmed_mean", "apply_sent"]


@dataclass(frozen=True)
class Contribution:
    """One delta in a round's aggregate: its chunks (as kept by the PS; None where a chunk did not
    arrive in time) and its weight."""

    parts: Sequence[Extracted | None]
    weight: float


def weighted_mean(parts: list[Extracted] | list[np.ndarray], weights: list[float],
                  absent_weight: float = 0.0) -> np.ndarray:
    """sum_i w_i v_i / (sum_i w_i + absent_weight) in float32 (v_i: float32 values, or chunks kept
    as int8), accumulated in the order given (the PS passes sites in name order, so the result does
    not depend on who arrived first): acc += float32(w_i / total) * v_i, without dequantizing into
    a temporary. `absent_weight` > 0 counts members whose delta is missing as zeros."""
    total = float(sum(weights))
    if not total > 0:
        raise WantrainError("the deltas carry no weight")
    return weighted_sum(parts, [w / (total + absent_weight) for w in weights])


def weighted_sum(parts: list[Extracted] | list[np.ndarray], coefficients: list[float]) -> np.ndarray:
    """sum_i c_i v_i in float32, in the order given (see weighted_mean)."""
    acc: np.ndarray | None = None
    for c, p in zip(coefficients, parts):
        x = p if isinstance(p, Extracted) else Extracted(np.asarray(p, np.float32), None, 0)
        if acc is None:
            acc = np.zeros(x.data.size, np.float32)
        if x.scales is None:
            kernels.add_weighted(acc, x.data, np.float32(c))
        else:
            kernels.add_weighted_int8(acc, x.data, x.scales, x.block, np.float32(c))
    assert acc is not None
    return acc


def trim_count(n: int, fraction: float) -> int:
    """Deltas dropped at each end of every coordinate: ceil(fraction x n), leaving at least one."""
    t = math.ceil(fraction * n) if fraction > 0 else 0
    return max(0, min(t, (n - 1) // 2))


def trimmed_mean(values: list[np.ndarray], trim: int) -> np.ndarray:
    """Coordinate-wise: sort the deltas' values, drop `trim` at each end, average the rest (float32,
    summed in sorted order, so the result does not depend on the order of the sites)."""
    stacked = np.sort(np.stack(values), axis=0)                  # (n, length)
    kept = stacked[trim: stacked.shape[0] - trim]
    acc = np.zeros(stacked.shape[1], np.float32)
    for row in kept:
        acc += row
    acc /= np.float32(kept.shape[0])
    return acc


def aggregate_round(round_: int, plan: list[ChunkSpec], shapes: dict[str, int], params: dict[str, np.ndarray],
                    contributions: dict[str, Contribution], outer: OuterNesterov, feedback: ErrorFeedback | None,
                    codec: Codec, aggregate: Aggregation = Aggregation.MEAN, trim_fraction: float = 0.0,
                    side: dict[str, Contribution] | None = None, substitute: str = "peer",
                    only: frozenset[str] | None = None) -> tuple[list[TensorChunk], EncodeStats]:
    """Apply one round to `params` (flat float32 views of the global model); returns the update chunks
    every replica adds, and their encoding statistics (`seconds`: encoding time summed over chunks).
    Missing chunks, `substitute` and `side`: see the module's docstring (the trimmed mean takes the
    chunks there are and ignores the rest). `only`: the tensors this round synchronizes (a fragment,
    wantrain/outer/fragments.py); every other tensor's update is zero, its momentum untouched and what a
    delta of this round carries for it ignored, unless a late delta of `side` moves it (its residual
    then goes with it)."""
    if substitute not in ("peer", "zero"):
        raise WantrainError(f"unknown substitute {substitute!r}: 'peer' or 'zero'")
    keys = sorted(contributions)
    if not keys:
        raise WantrainError(f"round {round_} has no deltas to aggregate")
    weights = [contributions[k].weight for k in keys]
    if not sum(weights) > 0:
        raise WantrainError(f"round {round_}: the deltas carry no weight")
    side_keys = sorted(side or {})
    side_coefficients = [-float(outer.lr) * side[k].weight for k in side_keys] if side else []
    outer.prepare(shapes)                  # buffers exist before threads step parts of them
    if feedback is not None:
        feedback.prepare(shapes)

    def late_sum(i: int) -> np.ndarray | None:
        """-lr x the late deltas' chunk i, each at its share (None: no late delta holds it)."""
        late = [(p, c) for k, c in zip(side_keys, side_coefficients) if (p := side[k].parts[i]) is not None] \
            if side else []
        return weighted_sum([p for p, _ in late], [c for _, c in late]) if late else None

    def step(i: int) -> tuple[TensorChunk, EncodeStats]:
        spec, stats = plan[i], EncodeStats()
        part = slice(spec.offset, spec.offset + spec.length)
        residual = feedback.residuals[spec.tensor][part] if feedback is not None else kernels.NO_RESIDUAL
        late = late_sum(i)
        if late is not None and residual.size:
            late += residual                    # the residual goes out with the late deltas
        if only is not None and spec.tensor not in only:
            # Another fragment's: it trains on at the sites, and moves here only by a late delta of a
            # round that synchronized it (every site moves its training by the update: site/schedule.py).
            if late is None or not late.any():
                enc, _ = codec.compress(np.zeros(spec.length, np.float32), stats)
                return TensorChunk(UPDATE, round_, i, len(plan), spec, enc), stats
            update = late
        else:
            parts = [contributions[k].parts[i] for k in keys]
            chunks = [c for c in parts if c is not None]
            if not chunks:                      # nobody's chunk arrived: the momentum alone moves it
                avg = np.zeros(spec.length, np.float32)
            elif aggregate is Aggregation.TRIMMED_MEAN:
                avg = trimmed_mean([c.values() for c in chunks], trim_count(len(chunks), trim_fraction))
            else:
                missing = sum(w for w, c in zip(weights, parts) if c is None) if substitute == "zero" else 0.0
                avg = weighted_mean(chunks, [w for w, c in zip(weights, parts) if c is not None], missing)
            plus = residual if late is None else late     # outside the momentum
            update = outer.update_part(spec.tensor, shapes[spec.tensor], part, avg, plus=plus)
        t0 = time.perf_counter()
        enc, sent = codec.compress(update, stats)
        stats.seconds += time.perf_counter() - t0
        apply_sent(params[spec.tensor][part], update, sent, residual)   # and the residual: update - sent
        return TensorChunk(UPDATE, round_, i, len(plan), spec, enc), stats

    done = map_ordered(step, range(len(plan)))
    return [msg for msg, _ in done], EncodeStats.total(s for _, s in done)


def apply_sent(params: np.ndarray, corrected: np.ndarray, sent: Extracted, residual: np.ndarray) -> None:
    """params += what was sent; residual = corrected - sent (unless NO_RESIDUAL: no error feedback)."""
    if sent.scales is None:
        if residual.size:
            np.subtract(corrected, sent.data, out=residual)
        params += sent.data
    else:
        kernels.record_and_apply(params, corrected, sent.data, sent.scales, sent.block, residual)
