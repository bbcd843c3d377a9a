"""Screening of site deltas at the parameter server: what a site may claim, how large its delta may be.

One site, buggy or hostile, must not be able to destroy the run with one message. Every bound
is derived from the run's config (`RunConfig.robust`, see config.py) and from what the PS has
seen, so it needs no tuning per model:

- claims: the steps and tokens a site reports bound its weight in the average; they may not
  exceed what the round asked for (`check_claims`);
- magnitude: a delta's L2 norm may not exceed `max_delta_ratio` x the larger of the global
  parameters' norm and how far its inner steps could have moved them (AdamW moves an element by
  about the learning rate per step), checked when the delta arrives (the site's stream is
  ended: no honest site gets there). This also keeps every float32 of the outer step finite;
- out of line: at the round's commit each delta is judged against the other sites' deltas of
  the round (`Screen`): one that disagrees (norm over `norm_factor` x longer or shorter, angle
  past `min_cosine`) with more than half of them is rejected, and the counted deltas' norms and
  weights are capped at multiples of their medians. Nothing one site sends enters the
  reference it is judged by, and with fewer than three sites nothing is compared at all;
- optionally, a coordinate-wise trimmed mean replaces the token-weighted mean (outer/aggregate.py).

Norms are computed from the int8 symbols and scales the PS keeps, without dequantizing; the
angles (`gram`) dequantize one chunk at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
import statistics
from dataclasses import dataclass

import numpy as np

from . import kernels
from .aggregate import Contribution
from ..codec import Extracted
from ..runtime.cpu_pool import map_ordered
from ..codec.quantize import num_blocks
from ..config import NormAction, RunConfig, Trust
from ..errors import ProtocolError
from ..transport.messages import RoundMetrics

__all__ = ["late_key", "parse_key",
           "check_claims", "check_weight", "max_delta_scale", "sum_of_squares", "l2_norm", "clipped", "gram",
           "norms_on_supports", "Verdict",
           "Screen", "counted", "max_steps"]


def max_steps(cfg: RunConfig, train_s: float) -> int:
    """The most inner steps a site may claim for a round it was asked to train for `train_s` s (0: fixed steps)."""
    if train_s > 0:
        return max(1, math.ceil(train_s * cfg.robust.max_steps_per_s))
    return cfg.train.inner_steps


def max_delta_scale(cfg: RunConfig, param_norm: float, steps: int, num_params: int) -> float:
    """What a delta's norm is measured against: the model's norm, or the distance `steps` AdamW steps
    of at most inner_lr per element can cover, whichever is larger."""
    return max(param_norm, steps * cfg.train.inner_lr * math.sqrt(num_params))


# A round's deltas are keyed by site; a late delta, counted in a later round, by "site@round" (a site
# may have both in one commit). The one place that writes and reads that key.
def late_key(site: str, round_: int) -> str:
    return f"{site}@{round_}"


def parse_key(key: str) -> tuple[str, int | None]:
    """(site, the round of a late delta or None)."""
    site, _, late_round = key.partition("@")
    return site, int(late_round) if late_round else None


def check_weight(cfg: RunConfig, what: str, steps: int, tokens: int, train_s: float) -> None:
    """ProtocolError unless `steps` and `tokens` (what a delta's weight rests on) are within what a
    round of `train_s` allowed; `what` names the claim ("round 3 metrics")."""
    steps_cap = max_steps(cfg, train_s)
    if not 1 <= steps <= steps_cap:
        raise ProtocolError(f"{what} claim {steps} inner steps; the round allowed 1 to {steps_cap}")
    tokens_cap = steps * cfg.train.batch_size * cfg.model.block_size
    if not 1 <= tokens <= tokens_cap:
        raise ProtocolError(f"{what} claim {tokens} tokens; {steps} steps of "
                            f"{cfg.train.batch_size} x {cfg.model.block_size} tokens allow 1 to {tokens_cap}")


def check_claims(cfg: RunConfig, m: RoundMetrics, train_s: float, num_params: int, received_wire_bytes: int,
                 committed_rounds: int) -> None:
    """ProtocolError unless a site's RoundMetrics stay within what its round allowed."""
    check_weight(cfg, f"round {m.round} metrics", m.steps, m.tokens, train_s)
    if m.steps_ahead > m.steps:
        raise ProtocolError(f"round {m.round} metrics claim {m.steps_ahead} of {m.steps} inner steps taken ahead")
    if m.raw_bytes != 4 * num_params:
        raise ProtocolError(f"round {m.round} metrics claim raw_bytes {m.raw_bytes}; a delta of {num_params} "
                            f"elements has {4 * num_params} bytes as float32")
    if m.wire_bytes != received_wire_bytes:
        raise ProtocolError(f"round {m.round} metrics claim wire_bytes {m.wire_bytes}; the PS received "
                            f"{received_wire_bytes} bytes of scales and payload")
    if not 0 <= m.huffman_bits_per_symbol <= 16:
        raise ProtocolError(f"round {m.round} metrics claim {m.huffman_bits_per_symbol} Huffman bits per symbol")
    # A restarted PS may be up to checkpoint_every rounds behind what its sites trained.
    position_cap = (committed_rounds + 2 + cfg.train.checkpoint_every) * max_steps(cfg, cfg.train.round_budget_s)
    if m.data_position > position_cap:
        raise ProtocolError(f"round {m.round} metrics claim data position {m.data_position}; at most "
                            f"{position_cap} batches can have been drawn by now")


SLICE = 1 << 13          # elements summed at a time: what a norm allocates stays small beside a chunk


def l2_norm(arrays) -> float:
    """L2 norm of flat float32 arrays, summed in float64 a slice at a time (no whole-tensor copy)."""
    total = 0.0
    for a in arrays:
        for i in range(0, a.size, SLICE):
            v = a[i: i + SLICE].astype(np.float64)
            total += float(np.dot(v, v))
    return math.sqrt(total)


def sum_of_squares(x: Extracted) -> float:
    """Squared L2 norm of one chunk kept as int8 symbols + scales (or fp32 values), in float64; the
    symbols squared a slice of blocks at a time (a hostile chunk must not make the PS allocate 8
    bytes an element)."""
    if x.scales is None:
        return l2_norm([x.data]) ** 2
    n, block = x.data.size, x.block
    per_block = np.empty(num_blocks(n, block), np.int64)                        # (nblocks,)
    step = max(1, SLICE // block)
    for b in range(0, per_block.size, step):
        q = x.data[b * block: (b + step) * block].astype(np.int32)
        if q.size % block:
            q = np.concatenate([q, np.zeros(block - q.size % block, np.int32)])
        per_block[b: b + step] = np.square(q).reshape(-1, block).sum(axis=1, dtype=np.int64)
    return float(np.dot(per_block.astype(np.float64), np.square(x.scales.astype(np.float64))))


def clipped(parts: Sequence[Extracted | None], factor: float) -> list[Extracted | None]:
    """The delta times `factor` (< 1), by scaling its scales: exact and cheap (a missing chunk stays missing)."""
    f = np.float32(factor)
    return [None if x is None else Extracted(x.data * f, None, 0) if x.scales is None
            else Extracted(x.data, x.scales * f, x.block) for x in parts]


def norms_on_supports(deltas: Sequence[Sequence[Extracted | None]]) -> np.ndarray | None:
    """For deltas some of whose chunks are missing (None: a partial delta, or the rest of one): (n, n)
    float64, entry [i, j] the norm of delta j over the chunks delta i has (NaN if j has none of
    them), so that a part is judged against the same part of the others (not against whole deltas,
    beside which it is always small and at a wide angle). None when every delta is whole."""
    have = np.array([[x is not None for x in d] for d in deltas], dtype=bool)        # (n, chunks)
    if have.all():
        return None
    squares = np.array([[0.0 if x is None else sum_of_squares(x) for x in d] for d in deltas])   # (n, chunks)
    shared = have.astype(np.int64) @ have.T.astype(np.int64)                          # (n, n) chunks both have
    return np.where(shared > 0, np.sqrt(have.astype(np.float64) @ squares.T), np.nan)


def gram(deltas: Sequence[Sequence[Extracted | None]], norms: list[float] | None = None) -> np.ndarray:
    """Every pair's dot product of whole deltas, (n, n) float64: the norms on the diagonal (squared;
    given, or computed), the angles off it. Chunk by chunk on every core, from the int8 symbols and
    scales without dequantizing (outer.kernels.dot_int8). A missing chunk (None) counts as zeros."""
    n = len(deltas)
    pairs = [(a, b) for a in range(n) for b in range(a if norms is None else a + 1, n)]

    def chunk(i: int) -> list[float]:
        out = []
        for a, b in pairs:
            x, y = deltas[a][i], deltas[b][i]
            if x is None or y is None:
                out.append(0.0)
            elif x.scales is None or y.scales is None:
                out.append(kernels.dot_f32(x.values(), y.values()))
            else:
                out.append(kernels.dot_int8(x.data, x.scales, y.data, y.scales, x.block))
        return out

    g = np.diag(np.square(norms)) if norms is not None else np.zeros((n, n))
    for dots in map_ordered(chunk, range(len(deltas[0])) if deltas and pairs else ()):
        for (a, b), d in zip(pairs, dots):
            g[a, b] += d
            if a != b:
                g[b, a] += d
    return g


@dataclass(frozen=True)
class Verdict:
    """What the screen decided for one delta of a round, and why."""

    action: str                   # "accept" | "reject" | "clip"
    norm: float
    weight: float                 # its weight in the round's mean (its tokens, capped: see Screen)
    factor: float = 1.0           # the delta is multiplied by this before it counts ("clip")
    reference: float = 0.0        # the median norm of the deltas it was judged against (0: not judged)
    reason: str = ""              # empty when accepted as sent
    disagrees: tuple[str, ...] = ()   # the other sites whose deltas it is out of line with


class Screen:
    """Judges each round's deltas against each other, never against itself or a history one site
    could fill, and remembers who has been out of line for how long (for the operator's alert).

    Rules (docs/protocol.md section 7), for a round with deltas from at least three sites:
    - two deltas disagree when one's norm is over `norm_factor` x the other's, or their cosine is
      under `min_cosine`; a delta that disagrees with more than half of the other sites' deltas
      is rejected (with `norm_action = "clip"`, one that is only too large is clipped instead).
      Honest deltas agree with each other, so while honest sites are a majority, none of theirs
      can be rejected: an honest delta disagrees at most with the hostile ones, fewer than half;
    - of the deltas counted, none may be longer than `clip_ratio` x their median norm, nor weigh
      more than `weight_ratio` x their median weight: what one site can move the mean by is
      bounded by these medians, which the honest majority sets.
    With one or two sites, no rule can tell an honest delta from a hostile one: nothing is
    judged (the absolute bounds on arrival still hold), disagreement is only reported, and of two
    weights the larger is capped at `weight_ratio` x the smaller.
    A site's late delta is judged against the current ones and gives no vote of its own.
    `trusted = True` (robust.trust) turns the relative rules off."""

    MIN_SITES = 3            # a majority needs three voices

    def __init__(self, cfg: RunConfig) -> None:
        self.robust = cfg.robust
        self.trusted = cfg.robust.trust is Trust.TRUSTED
        self.windows: dict[str, list[tuple[int, bool]]] = {}   # site (or "a|b") -> its last rounds: out of line?
        self.alerted: set[str] = set()

    def cannot_decide(self, num_sites: int, checked: bool = False) -> str | None:
        """What a run of `num_sites` untrusted sites must be told at its start, if anything
        (`checked`: its commits are checked on held-out data, checking.py)."""
        if self.trusted or num_sites >= self.MIN_SITES:
            return None
        if checked:
            return (f"the run has {num_sites} site(s): with fewer than {self.MIN_SITES} no rule can tell an honest "
                    f"delta from a hostile one by comparing them, so each commit is checked on held-out data "
                    f"instead (robust.check): a delta the update does better without is left out")
        return (f"robust.trust is 'untrusted' but the run has {num_sites} site(s): with fewer than "
                f"{self.MIN_SITES} no rule can tell an honest delta from a hostile one, so no delta is judged "
                f"against another (each is still bounded on arrival by robust.max_delta_ratio and its "
                f"claims)" + ("; the two weights are kept within robust.weight_ratio of each other, and an alert "
                              "is raised if the two sites' deltas keep disagreeing" if num_sites == 2 else ""))

    def judge(self, keys: list[str], g: np.ndarray, weights: list[float],
              on_support: np.ndarray | None = None) -> dict[str, Verdict]:
        """A verdict per delta: keys "site" or "site@round" (a late delta), `g` their Gram matrix
        (gram()), `weights` their tokens (discounted when late); `on_support` (norms_on_supports())
        where some are partial: each pair is then compared over the chunks both have."""
        r = self.robust
        norms = np.sqrt(np.maximum(np.diag(g), 0.0))
        site = [parse_key(k)[0] for k in keys]
        voters = [i for i, k in enumerate(keys) if parse_key(k)[1] is None]
        judged = not self.trusted and len({site[i] for i in voters}) >= self.MIN_SITES

        def norm_of(j: int, on: int) -> float:
            """Delta j's norm over the chunks delta `on` has."""
            return float(norms[j] if on_support is None else on_support[on, j])

        def disagreement(i: int, j: int) -> str:
            a, b = norm_of(i, j), norm_of(j, i)
            if math.isnan(a) or math.isnan(b):        # two parts with no chunk in common: no evidence
                return ""
            if r.norm_factor and a > r.norm_factor * b:
                return "larger"
            if r.norm_factor and b > r.norm_factor * a:
                return "smaller"
            if a > 0 and b > 0 and g[i, j] / (a * b) < r.min_cosine:
                return "against"
            return ""

        out: dict[str, Verdict] = {}
        for i, key in enumerate(keys):
            others = [j for j in voters if site[j] != site[i]]
            kinds = {site[j]: disagreement(i, j) for j in others}
            against = tuple(sorted(s for s, kind in kinds.items() if kind))
            known = [n for n in (norm_of(j, i) for j in others) if not math.isnan(n)]
            reference = float(np.median(known)) if known else 0.0
            verdict = Verdict("accept", float(norms[i]), weights[i], reference=reference, disagrees=against)
            if judged and 2 * len(against) > len(others):
                reason = _reason(norms[i], reference, kinds)
                if r.norm_action is NormAction.CLIP and all(kinds[s] == "larger" for s in against):
                    bound = r.norm_factor * reference
                    verdict = Verdict("clip", float(norms[i]), weights[i], bound / norms[i], reference,
                                      f"{reason}: clipped to {bound:.4g}", against)
                else:
                    verdict = Verdict("reject", float(norms[i]), weights[i], 0.0, reference, f"{reason}: rejected",
                                      against)
            out[key] = verdict
        if judged and all(v.action == "reject" for v in out.values()):
            # No delta is in line with a majority: nothing can be decided, so nothing is rejected.
            out = {k: Verdict("accept", v.norm, v.weight, reference=v.reference, disagrees=v.disagrees,
                              reason="no delta agrees with a majority of the others: none rejected")
                   for k, v in out.items()}
        return out if self.trusted else self._bounded(out, judged)

    def _bounded(self, verdicts: dict[str, Verdict], judged: bool) -> dict[str, Verdict]:
        """Cap the counted deltas' norms (judged rounds only) and weights at multiples of their
        medians. Two deltas: the larger weight at weight_ratio x the smaller, which keeps either
        site's share of the mean within [1 / (1 + ratio), ratio / (1 + ratio)]: a site that claims
        little gains no more than the half it gets by claiming what the other does."""
        r = self.robust
        counted = {k: v for k, v in verdicts.items() if v.action != "reject"}
        if len(counted) < 2:
            return verdicts
        norm_cap = (r.clip_ratio * statistics.median(v.norm * v.factor for v in counted.values())
                    if judged and len(counted) >= self.MIN_SITES else math.inf)
        weights = [v.weight for v in counted.values()]
        weight_cap = r.weight_ratio * (statistics.median(weights) if len(counted) >= self.MIN_SITES else min(weights))
        out = dict(verdicts)
        for k, v in counted.items():
            notes = []
            factor, weight = v.factor, v.weight
            if r.clip_ratio and v.norm * factor > norm_cap > 0:
                factor = norm_cap / v.norm
                notes.append(f"norm {v.norm:.4g} clipped to {norm_cap:.4g} (robust.clip_ratio "
                             f"{r.clip_ratio:g} x the median of the counted deltas)")
            if r.weight_ratio and weight > weight_cap:
                weight = weight_cap
                notes.append(f"weight {v.weight:.4g} capped at {weight_cap:.4g} (robust.weight_ratio "
                             f"{r.weight_ratio:g} x the {'median' if len(counted) >= self.MIN_SITES else 'other'})")
            if notes:
                reason = "; ".join(([v.reason] if v.reason else []) + notes)
                out[k] = Verdict("clip" if factor < 1 else v.action, v.norm, weight, factor, v.reference, reason,
                                 v.disagrees)
        return out

    def record(self, round_: int, verdicts: dict[str, Verdict]) -> list[dict]:
        """After a commit: who was out of line this round. Returns the alerts to raise: a site (or,
        with two sites, the pair) out of line in `alert_after` of the last 2 x `alert_after` rounds
        it sent a delta in, once until a whole window of them is clean again."""
        current = {k: v for k, v in verdicts.items() if "@" not in k}
        judged = len(current) >= self.MIN_SITES
        seen = {k: bool(v.reason) and judged for k, v in current.items()}
        if len(current) == 2:       # two sites: which one is out of line is unknown, so the pair is
            seen["|".join(sorted(current))] = any(v.disagrees or v.reason for v in current.values())
        n = self.robust.alert_after
        alerts = []
        for key, out in seen.items():
            window = self.windows.setdefault(key, [])
            window.append((round_, out))
            del window[:-2 * n]
            bad = [r for r, o in window if o]
            if not bad and len(window) == 2 * n:
                self.alerted.discard(key)
            elif len(bad) >= n and key not in self.alerted:
                self.alerted.add(key)
                alerts.append(self._alert(key, bad[0], len(bad), len(window), verdicts))
        return alerts

    def _alert(self, key: str, first: int, bad: int, of: int, verdicts: dict[str, Verdict]) -> dict:
        if "|" in key:
            a, b = key.split("|")
            return {"site": a, "sites": [a, b], "since": first, "rounds": bad, "action": "none",
                    "message": f"the deltas of {a} and {b} disagreed in {bad} of the last {of} rounds since round "
                               f"{first} (now norms {verdicts[a].norm:.4g} and {verdicts[b].norm:.4g}); with two "
                               f"sites no rule can tell which one is honest, so both were counted"}
        v = verdicts[key]
        done = {"reject": "rejected", "clip": "clipped", "accept": "counted"}[v.action]
        return {"site": key, "sites": [key], "since": first, "rounds": bad, "action": v.action,
                "message": f"{key}'s deltas were out of line with the other sites' in {bad} of its last {of} rounds "
                           f"since round {first}; this round's was {done}: {v.reason}"}

    def state_dict(self) -> dict:
        return {"windows": {k: [list(x) for x in w] for k, w in self.windows.items()}, "alerted": sorted(self.alerted)}

    def load_state_dict(self, state) -> None:
        """A checkpoint's screen state (older ones kept a list of norms: nothing to carry over)."""
        state = state if isinstance(state, dict) else {}
        self.windows = {k: [(int(r), bool(o)) for r, o in w] for k, w in state.get("windows", {}).items()}
        self.alerted = set(state.get("alerted", []))


def counted(deltas: dict[str, Sequence[Extracted | None]], verdicts: dict[str, Verdict]) -> dict[str, Contribution]:
    """The deltas that count, scaled and weighted as the screen decided (keys as in `verdicts`)."""
    return {k: Contribution(deltas[k] if v.factor == 1 else clipped(deltas[k], v.factor), v.weight)
            for k, v in verdicts.items() if v.action != "reject"}


def _reason(norm: float, reference: float, kinds: dict[str, str]) -> str:
    """Why a delta is out of line: with how many of the others, and how."""
    what = {"larger": "over robust.norm_factor x longer than", "smaller": "over robust.norm_factor x shorter than",
            "against": "at an angle past robust.min_cosine to"}
    parts = []
    for kind, text in what.items():
        names = sorted(s for s, k in kinds.items() if k == kind)
        if names:
            parts.append(f"{text} {', '.join(names)}")
    against = sum(1 for k in kinds.values() if k)
    return (f"delta norm {norm:.4g} (the other sites' median {reference:.4g}) is out of line with {against} of "
            f"the {len(kinds)} other sites' deltas: {'; '.join(parts)}")
