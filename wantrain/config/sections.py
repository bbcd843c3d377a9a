"""The run config's sections, one per owner: each a frozen dataclass whose fields are checked by
name in its `validate` (rules that join two sections are RunConfig's, config/__init__.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .presets import PRESETS
from .policies import (Aggregation, BudgetMode, CheckMode, Importance, LatePolicy, NormAction, Policy, ScheduleMode,
                       Trust)

__all__ = ["ModelConfig", "DataConfig", "TrainConfig", "ScheduleConfig", "RecoveryConfig", "CodecConfig",
           "RobustConfig", "CODEC_MODES", "MAX_LANES"]

CODEC_MODES = ("fp32", "int8", "int8-huffman", "int4-huffman", "ternary-huffman", "sign", "topk")
TOKENIZERS = ("byte", "gpt2")
SHARDINGS = ("contiguous", "document")
MAX_LANES = 8            # a site's Lane calls (a PS's limits.max_lanes_per_site must allow them)


def _check(cond: bool, field_name: str, message: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{field_name} {message}, got {value!r}")


POLICIES: dict[str, type[Policy]] = {cls.__name__: cls for cls in (LatePolicy, ScheduleMode, BudgetMode, Importance,
                                                                    Trust, NormAction, Aggregation, CheckMode)}


def parse_policy(cls: type[Policy], value: Any, name: str) -> Policy:
    """`value` (a string, or already the policy) as a `cls`; the error names the field and the choices."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        raise ConfigError(f"{name} must be one of {cls.values()}, got {value!r}") from None


class _Section:
    """A section of the run config: its policy fields are parsed here, once, whether it was built
    from JSON or in Python (`RecoveryConfig(late_policy="drop")` holds LatePolicy.DROP)."""

    NAME = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            cls = POLICIES.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
            if cls is not None:
                object.__setattr__(self, f.name, parse_policy(cls, getattr(self, f.name), f"{self.NAME}.{f.name}"))


@dataclass(frozen=True)
class ModelConfig(_Section):
    """Which model to train: a preset name (see wantrain.config.presets.PRESETS) and its context."""

    NAME = "model"

    preset: str = "tiny"
    block_size: int = 128   # tokens per training sequence; <= the preset's maximum context
    seed: int = 0           # initial weights; every party builds the same model from it

    def validate(self, prefix: str = "model") -> None:
        _check(self.preset in PRESETS, f"{prefix}.preset", f"must be one of {sorted(PRESETS)}", self.preset)
        _check(self.block_size >= 1, f"{prefix}.block_size", "must be >= 1", self.block_size)


@dataclass(frozen=True)
class DataConfig(_Section):
    """What every site trains on: a corpus, a tokenizer, and how it is cut into shards."""

    NAME = "data"

    corpus: str = "shakespeare"      # "shakespeare" or a path to a text file or a folder of them
    tokenizer: str = "byte"          # "byte" (vocabulary 256) or "gpt2" (BPE, 50257)
    sharding: str = "contiguous"     # "contiguous" slices or whole "document"s per site
    val_fraction: float = 0.05       # held-out tail of the corpus for validation

    def validate(self, prefix: str = "data") -> None:
        _check(bool(self.corpus), f"{prefix}.corpus", "must name a corpus or a path", self.corpus)
        _check(self.tokenizer in TOKENIZERS, f"{prefix}.tokenizer", f"must be one of {TOKENIZERS}", self.tokenizer)
        _check(self.sharding in SHARDINGS, f"{prefix}.sharding", f"must be one of {SHARDINGS}", self.sharding)
        _check(0.0 < self.val_fraction < 0.5, f"{prefix}.val_fraction", "must be in (0, 0.5)", self.val_fraction)


@dataclass(frozen=True)
class TrainConfig(_Section):
    """The DiLoCo loop: inner AdamW steps per round at each site, outer Nesterov at the PS."""

    NAME = "train"

    rounds: int = 12
    inner_steps: int = 25
    batch_size: int = 8
    inner_lr: float = 3e-3
    inner_weight_decay: float = 0.1
    warmup_steps: int = 20           # counted in inner steps over the whole run
    min_lr_ratio: float = 0.1        # cosine decays to inner_lr * min_lr_ratio
    grad_clip: float = 1.0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    eval_batches: int = 4            # validation batches the PS evaluates after each round
    checkpoint_every: int = 1        # the PS writes its full state every N rounds, in the background;
                                     # every round is journaled before it is announced (0: neither)
    seed: int = 0                    # data order; each site adds its index
    # Heterogeneous sites: > 0 makes a round a compute budget, so a fast site takes more inner
    # steps than a slow one in the same wall time (inner_steps then only sets the LR warm-up
    # scale); the PS weights deltas by the tokens each site trained.
    round_budget_s: float = 0.0
    # Streaming DiLoCo (wantrain/outer/fragments.py): 1, every round synchronizes the whole model; P > 1,
    # the tensors are cut into P fragments and round r synchronizes fragment r mod P alone (the
    # others train on at the sites). Run P times the rounds of 1/P the inner steps. Sync schedule only.
    fragments: int = 1

    def validate(self, prefix: str = "train") -> None:
        for name in ("rounds", "inner_steps", "batch_size"):
            _check(getattr(self, name) >= 1, f"{prefix}.{name}", "must be >= 1", getattr(self, name))
        for name in ("warmup_steps", "eval_batches", "checkpoint_every"):
            _check(getattr(self, name) >= 0, f"{prefix}.{name}", "must be >= 0", getattr(self, name))
        for name in ("inner_lr", "outer_lr"):
            v = getattr(self, name)
            _check(math.isfinite(v) and v > 0, f"{prefix}.{name}", "must be a positive number", v)
        _check(0 <= self.outer_momentum < 1, f"{prefix}.outer_momentum", "must be in [0, 1)", self.outer_momentum)
        _check(0 <= self.min_lr_ratio <= 1, f"{prefix}.min_lr_ratio", "must be in [0, 1]", self.min_lr_ratio)
        _check(self.grad_clip >= 0, f"{prefix}.grad_clip", "must be >= 0 (0 disables it)", self.grad_clip)
        _check(self.inner_weight_decay >= 0, f"{prefix}.inner_weight_decay", "must be >= 0", self.inner_weight_decay)
        _check(math.isfinite(self.round_budget_s) and self.round_budget_s >= 0, f"{prefix}.round_budget_s",
               "must be >= 0 seconds", self.round_budget_s)
        _check(self.fragments >= 1, f"{prefix}.fragments", "must be >= 1 (1: the whole model every round)",
               self.fragments)


@dataclass(frozen=True)
class ScheduleConfig(_Section):
    """When rounds start and close, and when sites compute: the PS's round driving (ps/rounds.py,
    ps/controller.py) and each site's schedule (site/schedule.py)."""

    NAME = "schedule"

    # SYNC: a site waits for the round's update before it trains again. OVERLAP: it trains the next
    # round ahead, from where its last round ended, while its delta goes up and the update comes
    # down, then moves those steps onto the new global model.
    mode: ScheduleMode = ScheduleMode.SYNC
    # Each site's compute budget under train.round_budget_s: FIXED, the same for every site;
    # ADAPTIVE, the time its link leaves it before the costliest link's site delivers, so that no
    # site waits idle for another's delta (a budget from 1 to 2 x round_budget_s).
    controller: BudgetMode = BudgetMode.FIXED
    # Rounds never wait forever: the PS aggregates what has arrived at the deadline and moves on.
    deadline_s: float = 0.0          # fixed deadline after a round's start; 0: derived, see below
    deadline_factor: float = 3.0     # derived: budget + factor x typical (arrival - budget) (ps/rounds.py)
    deadline_min_s: float = 10.0     # floor of the derived deadline
    deadline_initial_s: float = 600.0  # derived deadline before any delta has been timed
    # A minimum quorum (Decoupled DiLoCo's, a baseline: bench/loss_recovery.py's B7): once this share
    # of a round's members have delivered, its deadline comes forward to a grace after, grace_factor
    # x how much later than the quorum's the slowest member usually delivers (0: off).
    quorum_share: float = 0.0
    grace_factor: float = 2.0
    quorum_wait_s: float = 5.0       # after round 0, start a round this long after the last even
                                     # when some sites are missing (they join it when they return)

    def validate(self, prefix: str = "schedule") -> None:
        for name in ("deadline_s", "quorum_wait_s"):
            v = getattr(self, name)
            _check(math.isfinite(v) and v >= 0, f"{prefix}.{name}", "must be >= 0 seconds", v)
        for name in ("deadline_min_s", "deadline_initial_s"):
            v = getattr(self, name)
            _check(math.isfinite(v) and v > 0, f"{prefix}.{name}", "must be > 0 seconds", v)
        _check(math.isfinite(self.deadline_factor) and self.deadline_factor >= 1, f"{prefix}.deadline_factor",
               "must be >= 1", self.deadline_factor)
        _check(0 <= self.quorum_share <= 1, f"{prefix}.quorum_share", "must be in [0, 1]", self.quorum_share)
        _check(self.grace_factor >= 0, f"{prefix}.grace_factor", "must be >= 0", self.grace_factor)


@dataclass(frozen=True)
class RecoveryConfig(_Section):
    """Loss recovery: what a round does about deltas, or parts of them, that do not arrive in time,
    and how a site protects what it sends (docs/loss_recovery.md; the profile the PS's close
    rules (ps/closing.py), its uploads and a site's uplink act on)."""

    NAME = "recovery"

    # A delta that misses its round (LatePolicy; docs/protocol.md 3; bench/late_policy.py). The
    # default: on the transformer (tiny, 4 sites, 20 rounds, 3 seeds) with 10 % / 30 % of sites late
    # a round, final loss +0.20 % / +0.58 % over nothing late; DROP +0.86 % / +3.14 %.
    late_policy: LatePolicy = LatePolicy.ZERO_OUTSIDE
    staleness_discount: float = 0.5  # weight factor per round of staleness (STALE)
    # Count the chunks of a late delta that arrived by the deadline, when its manifest did (the rest
    # is what late_policy says: zeros and outside the momentum later, zeros and carried, or the others'
    # mean). Only under a late_policy that allows it (LatePolicy.allows_partial) and on an unsharded
    # PS (a shard counts whole deltas); elsewhere it does nothing. The default: with chunks lost on
    # the uplink (1-10 %, bench/loss_recovery.py) it keeps the final loss within 0.5 % of waiting for
    # every chunk while whole deltas lose 6 %; on a lossless link it changes nothing.
    partial_deltas: bool = True
    reliable_rounds: int = 5         # the first rounds (warm-up) count no partial delta and never close early
    # With partial_deltas: close a round before its deadline once every member's manifest and critical
    # chunks are in and what is still missing holds at most this share of the round's importance
    # (each delta weighted by its tokens; 0: never early).
    loss_budget: float = 0.05
    # With partial deltas, after the warm-up: a round that at its deadline still misses a critical
    # chunk, or more than this share of its importance, from members that all sent their manifests
    # waits up to one deadline more, closing ("extended") as soon as neither holds (0: never).
    extend_above: float = 0.0
    # Role weights of a delta's importance (site/probe.py): every this many rounds a site measures
    # on a held-out batch how much its step loses without each role's change, and weighs the roles
    # by it (0: never; all roles weigh 1, importance is energy alone).
    probe_every: int = 0
    importance: Importance = Importance.ENERGY
    # A delta's chunks protected on the wire (transport/sending.py; docs/protocol.md 4a): each critical
    # chunk sent twice, and XOR parity over the most important other chunks that hold parity_share of
    # the delta's importance, in groups of parity_group_size (the PS rebuilds one lost member of a
    # group; 0: no parity). An unsharded PS: a sharded site sends each chunk once. The defaults (with
    # lanes): at 10 % of chunks lost, without parity 1.45x as fast to the target as waiting for every
    # chunk and +0.23 % final loss, with it 1.73x and -0.04 % (bench/loss_recovery.py); they cost
    # 2-7 % more bytes up whether or not anything was lost, before they followed the loss seen
    # (protection_adapts, below).
    critical_copies: bool = True
    parity_share: float = 0.5
    parity_group_size: int = 8
    # critical_copies and parity_share as the most a delta carries: each site sizes its parity by
    # the share of its chunks its link lost lately (hedged or sent again; full from 2 %, none below
    # 0.2 %, a quarter as much after each clean push, full until it has pushed once), and sends
    # the copies while it sends any parity (transport/sending.py's ProtectionGauge), so a clean link
    # pays for protection on its first two pushes only; what then looks lost is hedged.
    protection_adapts: bool = True
    # Extra TCP connections (Lane calls, docs/protocol.md 4b) a site spreads each delta's manifest,
    # chunks and parities over, a critical chunk's copy and a parity group's members on different
    # ones: one lost segment then stalls one lane, not the whole delta, and on a lossy path each
    # connection has its own rate (0: the Session carries all; a sharded PS: no lanes). With lanes, a
    # protected chunk (critical, or in a parity group; with hedge_all, any chunk) the PS has not
    # acknowledged is sent again on another lane, up to 3 times, once it looks lost rather than
    # queued: passed on its own lane, or later than its bytes explain at the lanes' measured rate by
    # more than 2 round trips (0.2 s to hedge_s; hedge_s while no rate is measured; 0: never). The
    # defaults: 4 lanes, hedging every chunk, hedge_s 1 s (bench/loss_recovery.py, 1-10 % of chunks
    # lost, a derived deadline, 3 seeds: final loss within 0.1 % of waiting for every chunk and
    # 1.2-1.8x as fast to the target, 2.5x and 1.9x at 5 % and 10 % in a clean rerun of one seed;
    # the same recovery without lanes or hedges, 1.0-1.2x). On a clean link they cost connections,
    # not bytes: nothing looks lost, so nothing goes twice.
    lanes: int = 4
    hedge_s: float = 1.0
    hedge_all: bool = True
    # The downlink (ps/downlink.py, docs/protocol.md 6): the PS sends a round's update with the
    # critical chunks and the most energetic others, holding all but this share of its energy, before
    # the result; the rest follows the next RoundStart, and a site trains without it, patching each
    # chunk into its replica and into the parameters it trains as it lands (0: the whole update comes
    # before the result). Only under the "sync" schedule on an unsharded PS; after the warm-up.
    downlink_budget: float = 0.0

    def validate(self, prefix: str = "recovery") -> None:
        _check(0 < self.staleness_discount <= 1, f"{prefix}.staleness_discount", "must be in (0, 1]",
               self.staleness_discount)
        _check(self.reliable_rounds >= 0, f"{prefix}.reliable_rounds", "must be >= 0", self.reliable_rounds)
        _check(0 <= self.loss_budget < 1, f"{prefix}.loss_budget", "must be in [0, 1)", self.loss_budget)
        _check(0 <= self.extend_above < 1, f"{prefix}.extend_above", "must be in [0, 1)", self.extend_above)
        _check(self.probe_every >= 0, f"{prefix}.probe_every", "must be >= 0", self.probe_every)
        _check(0 <= self.parity_share <= 1, f"{prefix}.parity_share", "must be in [0, 1]", self.parity_share)
        _check(2 <= self.parity_group_size <= 64, f"{prefix}.parity_group_size",
               "must be 2 to 64 chunks (a parity per group)", self.parity_group_size)
        _check(0 <= self.lanes <= MAX_LANES, f"{prefix}.lanes", f"must be 0 to {MAX_LANES} connections", self.lanes)
        _check(math.isfinite(self.hedge_s) and self.hedge_s >= 0, f"{prefix}.hedge_s", "must be >= 0 seconds",
               self.hedge_s)
        _check(0 <= self.downlink_budget < 1, f"{prefix}.downlink_budget", "must be in [0, 1)", self.downlink_budget)

    @property
    def counts_partial(self) -> bool:
        """Do rounds count the chunks of a delta that are in without the rest (on an unsharded PS,
        after the warm-up)? partial_deltas, under a late_policy that has a substitute for the rest."""
        return self.partial_deltas and self.late_policy.allows_partial

    @property
    def hedges_every_chunk(self) -> bool:
        """May any chunk of a delta come again (itself and its hedges)? hedge_all, where a site
        hedges: over lanes, with a hedge time. Elsewhere a plain chunk comes once, and a second is
        refused."""
        return self.hedge_all and self.lanes > 0 and self.hedge_s > 0


@dataclass(frozen=True)
class CodecConfig(_Section):
    """How deltas (uplink) and updates (downlink) are encoded."""

    NAME = "codec"

    mode: str = "int8-huffman"        # "fp32" | "int8" | "int8-huffman"; below 8 bits (codec/formats.py):
                                      # "int4-huffman" | "ternary-huffman" | "sign" | "topk"
    quant_block: int = 4096           # elements per scale (and per top-k block)
    huffman_block: int = 2048         # symbols per independently decodable Huffman block
    huffman_tables: int = 2           # codes per chunk; each block picks one by its spread
    chunk_bytes: int = 1 << 20        # payload bytes per wire chunk (int8: elements)
    error_feedback: bool = True
    update_mode: str = ""             # the PS's update, if not as `mode` (any of its values; "": as `mode`)
    int4_clip: float = 0.0            # "int4-huffman": the top level at min(absmax, this x the block's mean |x|)
                                      # (a statistical scale; 0: absmax)
    ternary_threshold: float = 0.7    # "ternary-huffman": keep |x| over this x the block's mean |x| (higher:
                                      # fewer kept, fewer bits; 0.7 is ternary weight networks' choice)
    topk_density: float = 1 / 64      # "topk": the share of each block kept (its largest |values|) ...
    topk_value_bits: int = 2          # ... each sent in 1 bit (sign) or 2 (sign and one of two sizes)

    def validate(self, prefix: str = "codec") -> None:
        _check(self.mode in CODEC_MODES, f"{prefix}.mode", f"must be one of {CODEC_MODES}", self.mode)
        _check(1 <= self.quant_block <= self.chunk_bytes, f"{prefix}.quant_block",
               f"must be 1 to codec.chunk_bytes ({self.chunk_bytes}) elements: a chunk holds at least one block",
               self.quant_block)
        _check(2 <= self.huffman_block <= 5460 and self.huffman_block % 2 == 0,
               f"{prefix}.huffman_block", "must be even and in [2, 5460]", self.huffman_block)
        _check(1 <= self.huffman_tables <= 4, f"{prefix}.huffman_tables", "must be in [1, 4]", self.huffman_tables)
        _check(4096 <= self.chunk_bytes <= (1 << 20), f"{prefix}.chunk_bytes", "must be in [4096, 1048576]",
               self.chunk_bytes)
        _check(self.update_mode in ("", *CODEC_MODES), f"{prefix}.update_mode", f"must be '' or one of {CODEC_MODES}",
               self.update_mode)
        _check(self.int4_clip >= 0, f"{prefix}.int4_clip", "must be >= 0 (0: absmax)", self.int4_clip)
        _check(0 <= self.ternary_threshold <= 4, f"{prefix}.ternary_threshold", "must be in [0, 4]",
               self.ternary_threshold)
        _check(0 < self.topk_density <= 1, f"{prefix}.topk_density", "must be in (0, 1]", self.topk_density)
        _check(self.topk_value_bits in (1, 2), f"{prefix}.topk_value_bits", "must be 1 or 2", self.topk_value_bits)

    def delta_modes(self) -> tuple[str, ...]:
        """The encodings a site may send its deltas in (a setting of that site): those whose chunks
        fit the run's chunk plan, all of them on an fp32 plan (4 bytes an element), else all but fp32."""
        return CODEC_MODES if "fp32" in (self.mode, self.update_mode) else tuple(m for m in CODEC_MODES if m != "fp32")

    def for_site(self, mode: str = "") -> CodecConfig:
        """How a site encodes its deltas: in `mode` ("": the run's), on the run's chunk plan."""
        return dataclasses.replace(self, mode=mode or self.mode, update_mode=self.update_mode or self.mode)

    def for_update(self) -> CodecConfig:
        """This codec with the update's mode: how the PS encodes its update (the two modes swapped,
        so that its chunk plan stays the deltas')."""
        return dataclasses.replace(self, mode=self.update_mode or self.mode, update_mode=self.mode)

    def chunk_elements(self) -> int:
        """Elements per chunk (deltas and updates share the plan): whole quantization blocks, at
        most chunk_bytes of payload either way."""
        per_elem = 4 if "fp32" in (self.mode, self.update_mode) else 1
        n = self.chunk_bytes // per_elem
        return max(self.quant_block, n - n % self.quant_block)


@dataclass(frozen=True)
class RobustConfig(_Section):
    """What one site may do to the global model: bounds on its delta and its claims (wantrain.outer.screening).

    A site could be buggy or hostile; either way, one delta must not be able to destroy the run."""

    NAME = "robust"

    trust: Trust = Trust.UNTRUSTED   # UNTRUSTED: judge each round's deltas against each other (below);
                                     # TRUSTED: only the absolute bounds (max_delta_ratio, claims)
    norm_factor: float = 10.0        # two deltas disagree if one's L2 norm is over this x the other's (0: never) ...
    min_cosine: float = 0.02         # ... or the cosine of their angle is under this (-1: never: a delta that
                                     # shares under 2 % of its length with another's direction carries nothing
                                     # the other agrees with; honest ones measured 0.16-0.8); a delta that
                                     # disagrees with more than half of the other sites' is ...
    norm_action: NormAction = NormAction.REJECT  # ... "reject"ed, or (if it is only too large) "clip"ped to norm_factor x
                                     # the others' median norm
    clip_ratio: float = 2.0          # counted deltas' norms capped at this x their median (0: no cap) ...
    weight_ratio: float = 2.0        # ... and their weights (tokens) at this x their median (0: no cap)
    alert_after: int = 3             # rounds (of the site's last 2x this) out of line before an `alert` event
    max_delta_ratio: float = 10.0    # no delta may exceed this x the larger of the global parameters' norm and
                                     # steps x inner_lr x sqrt(parameters) (how far AdamW can move) (0: no bound)
    max_steps_per_s: float = 1000.0  # time-budgeted rounds: steps a site may claim per second of its budget
    aggregate: Aggregation = Aggregation.MEAN  # "mean" (weighted by tokens) or "trimmed_mean" (per coordinate, unweighted)
    trim_fraction: float = 0.2       # trimmed_mean: share of the deltas dropped at each end of every coordinate
    # Checked commits (wantrain/outer/checking.py): before a round commits, the PS evaluates its update on
    # held-out check batches; if that is worse than the current model by more than the tolerance,
    # each delta is tried alone and those that make the model worse are left out (kept in their
    # site's error feedback). "loss": every run; "auto": runs of fewer than three sites, where
    # deltas cannot be judged against each other; "off": never.
    check: CheckMode = CheckMode.AUTO
    check_batches: int = 2           # held-out batches per check, between the validation windows
    check_tolerance: float = 0.005   # relative rise of the check loss allowed without a check (the floor:
                                     # the run raises it to 2x the largest rise its honest rounds showed,
                                     # up to 5x this)
    check_every: int = 1             # check every K-th round (a large model on a small PS); the rounds
                                     # between are committed unchecked
    exclude_after: int = 6           # a site left out by the check in this many of its last 2x this rounds
                                     # is no longer counted until an operator clears it (0: never excluded)

    def validate(self, prefix: str = "robust") -> None:
        for name in ("norm_factor", "clip_ratio", "weight_ratio"):
            v = getattr(self, name)
            _check(math.isfinite(v) and (v == 0 or v >= 1), f"{prefix}.{name}", "must be 0 (off) or >= 1", v)
        _check(math.isfinite(self.max_delta_ratio) and self.max_delta_ratio >= 0, f"{prefix}.max_delta_ratio",
               "must be >= 0 (0: off)", self.max_delta_ratio)
        _check(-1 <= self.min_cosine < 1, f"{prefix}.min_cosine", "must be in [-1, 1)", self.min_cosine)
        _check(1 <= self.alert_after <= 10_000, f"{prefix}.alert_after", "must be in [1, 10000]", self.alert_after)
        _check(math.isfinite(self.max_steps_per_s) and self.max_steps_per_s > 0, f"{prefix}.max_steps_per_s",
               "must be a positive number", self.max_steps_per_s)
        _check(0 <= self.trim_fraction < 0.5, f"{prefix}.trim_fraction", "must be in [0, 0.5)", self.trim_fraction)
        _check(1 <= self.check_batches <= 64, f"{prefix}.check_batches", "must be in [1, 64]", self.check_batches)
        _check(math.isfinite(self.check_tolerance) and 0 <= self.check_tolerance <= 1, f"{prefix}.check_tolerance",
               "must be in [0, 1]", self.check_tolerance)
        _check(1 <= self.check_every <= 10_000, f"{prefix}.check_every", "must be in [1, 10000]", self.check_every)
        _check(0 <= self.exclude_after <= 10_000, f"{prefix}.exclude_after", "must be in [0, 10000] (0: never)",
               self.exclude_after)

    def checks(self, num_sites: int) -> bool:
        """Whether a run of `num_sites` sites checks its commits on held-out data."""
        return self.check.checks(num_sites)


