"""What to do with a delta, or chunks of it, that miss their round: the policies measured on the
transformer, in this process.

A run's rounds (inprocess.InProcessRun: the sites' inner loops, their codecs with error feedback,
the PS's global model and outer Nesterov step) with a seeded schedule of what is late. Either whole
sites (`late_schedule`: in each round after the first, each site is late with probability `late`,
at least one on time) or chunks (`chunk_schedule`: each site's link loses chunks at a rate, i.i.d.
or in bursts, recovery.ChunkLoss). A late site trained its whole round; its late chunks reach the
PS after the round committed. Every arm sees the same schedule, data and initial weights for a
seed, so arms differ by policy alone:

    on-time           nothing is late (the reference)
    drop              today's late_policy "drop": a site with any chunk late is late as a whole; the
                      round's mean is over the deltas that came (a peer-average substitute for the
                      late one), and the late site adds its delta to its error feedback, so it goes
                      out again inside its next delta, through the outer momentum: its mass counts
                      twice, once as the others' mean, once itself
    stale             today's late_policy "stale": late as a whole, the mean over the deltas that
                      came, and the late delta counts in the next round's mean, its weight x
                      staleness_discount
    rescale           per chunk, the mean over the deltas that hold it; a late chunk is never applied
    hadamard          B5: each tensor's delta goes as chunks of its randomized Hadamard transform
                      (studies/spread.py), so a late chunk's loss is spread over its tensor as noise;
                      the PS inverts what came and divides by the share that came; never applied
    zero              per chunk, a late one counts as zeros (its weight stays in the denominator);
                      it is never applied
    zero-ef           zero, and the site carries its late chunks into its next delta, as "drop" does
    zero-ef-outside   zero, and late chunks are applied when they arrive, in the next round, outside
                      the outer momentum: -outer_lr x their delta's share of its round (aggregate.py's
                      `side`)
    salr              zero-ef-outside, sending with protection (transport/sending.py): critical chunks
                      twice, the chunks holding half the delta's importance in parity groups of 8, the
                      rest by importance; the schedule's losses hit transmissions in that order, and
                      only what protection cannot rebuild is late (a site late as a whole still is)

Chunk losses are drawn per transmission slot (`chunk_schedule`: twice the chunks a delta has, in
sending order), so every arm meets the same link: the arms without protection send their chunks in
plan order on the first slots.

`run_arm` runs one arm for one seed; bench/late_policy.py runs the arms in parallel and writes
the table.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..outer.aggregate import Contribution
from ..config import LatePolicy, RunConfig
from .inprocess import InProcessRun, Sent
from ..codec import Codec
from ..runtime.chunk_loss import ChunkLoss
from ..transport.manifest import build_manifest, protect
from ..transport.sending import overhead_bytes, still_missing, transmissions
from ..transport.roles import roles_of
from .spread import spread_loss
from ..outer.screening import late_key

__all__ = ["ARMS", "late_schedule", "chunk_schedule", "run_arm"]

# Three arms are today's late policies, named as the config names them; the rest are the study's own.
DROP, STALE, RESCALE = str(LatePolicy.DROP), str(LatePolicy.STALE), str(LatePolicy.RESCALE)
ARMS = ("on-time", DROP, STALE, RESCALE, "hadamard", "zero", "zero-ef", "zero-ef-outside", "salr")
WHOLE = frozenset({-1})          # in a schedule: every chunk of the site's delta is late

def late_schedule(names: list[str], rounds: int, late: float, seed: int) -> list[dict[str, frozenset[int]]]:
    """Who is late in each round (site -> WHOLE): none in round 0 (warm-up), then each site with
    probability `late`, never all of them (one drawn at random stays on time)."""
    rng = np.random.default_rng([seed, 28])
    out: list[dict[str, frozenset[int]]] = [{}]
    for _ in range(1, rounds):
        is_late = rng.random(len(names)) < late
        if is_late.all():
            is_late[rng.integers(len(names))] = False
        out.append({n: WHOLE for n, x in zip(names, is_late) if x})
    return out


def chunk_schedule(names: list[str], rounds: int, chunks: int, rate: float, burst: float, seed: int
                   ) -> list[dict[str, frozenset[int]]]:
    """Which transmission slots of each site's round are lost: none in round 0 (warm-up), then what
    each site's link loses of `chunks` slots a round, in sending order (recovery.ChunkLoss)."""
    links = {n: ChunkLoss(rate, burst, seed, link=n) for n in names}
    out: list[dict[str, frozenset[int]]] = [{}]
    for _ in range(1, rounds):
        round_ = {n: frozenset(np.flatnonzero(link.mask(chunks)).tolist()) for n, link in links.items()}
        out.append({n: lost for n, lost in round_.items() if lost})
    return out


def run_arm(cfg: RunConfig, arm: str, seed: int, late: float = 0.0, chunk_loss: float = 0.0, burst: float = 1.0,
            threads: int = 1, progress=None) -> dict:
    """One arm for one seed (the model's weights, its data order and what is late): whole sites late
    with probability `late`, or (`chunk_loss` > 0) chunks lost by each site's link at that rate, in
    bursts of mean length `burst`. Returns the validation loss before training and after each of
    `cfg.train.rounds` rounds, and per round the late chunks of each site ("all": the whole delta).
    `progress(round)` is called after every round."""
    import torch

    from ..data import load_run_data

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: the arms are {', '.join(ARMS)}")
    torch.set_num_threads(threads)
    run = cfg.replace(**{"model.seed": seed, "train.seed": seed})
    tok, corpus = load_run_data(run.data)
    ps = InProcessRun(run, tok, corpus)
    rounds = run.train.rounds
    if arm == "on-time":
        schedule: list[dict[str, frozenset[int]]] = [{}] * rounds
    elif chunk_loss > 0:
        schedule = chunk_schedule(ps.names, rounds, 2 * len(ps.model.plan), chunk_loss, burst, seed)
    else:
        schedule = late_schedule(ps.names, rounds, late, seed)
    val, late_chunks, overhead = _train(ps, arm, schedule, progress)
    return {"arm": arm, "seed": seed, "late": late, "chunk_loss": chunk_loss, "burst": burst,
            "chunks": len(ps.model.plan), "val": val, "late_chunks": late_chunks, "overhead": overhead}


def _train(ps: InProcessRun, arm: str, schedule: list[dict[str, frozenset[int]]], progress
           ) -> tuple[list[float], list[dict], float]:
    """One arm's run: the validation loss before training and after each round, the late chunks of
    each site in each round ("all": the whole delta), and the bytes protection added (a fraction of
    the deltas' wire bytes)."""
    val, late_chunks = [ps.evaluate()], []
    n = len(ps.model.plan)
    every = frozenset(range(n))
    roles = roles_of({k: tuple(p.shape) for k, p in ps.model.model.named_parameters()})
    extra = wire = 0
    whole_site = arm in (DROP, STALE)        # today: a site with any chunk late is late as a whole
    outside: dict[str, Contribution] = {}       # zero-ef-outside: late chunks, for outside the momentum
    stale: dict[str, Sent] = {}                  # stale: late deltas, for the next round's mean
    discount = ps.cfg.recovery.staleness_discount
    for r, lost in enumerate(schedule):
        start = ps.start()
        sent = {name: ps.train(name, r, start)[1] for name in ps.names}
        wire += sum(s.wire_bytes for s in sent.values())
        if arm == "salr":
            late = {}
            for name, s in sent.items():
                assert s.encoded is not None and s.values is not None
                manifest = protect(build_manifest(r, s.encoded, s.values, roles))
                extra += overhead_bytes(manifest)
                slots = lost.get(name, frozenset())
                late[name] = every if slots == WHOLE else still_missing(manifest, transmissions(manifest), slots)
        else:                                    # plan order on the first slots
            late = {k: every if slots == WHOLE or whole_site else frozenset(j for j in slots if j < n)
                    for k, slots in lost.items()}
        if arm == "hadamard":                    # what came of a transformed delta, nothing late but whole sites
            for k, chunks in late.items():
                if chunks and chunks != every:
                    sent[k] = _spread(ps, sent[k], chunks, [r, ps.names.index(k)])
            late = {k: chunks for k, chunks in late.items() if chunks == every}
        late = {k: chunks for k, chunks in late.items() if chunks}
        late_chunks.append({k: "all" if c == every else len(c) for k, c in sorted(late.items())})
        total = sum(s.tokens for s in sent.values())
        ps.commit(r, {**sent, **stale}, lost=late, side=outside or None,
                  substitute="zero" if arm.startswith("zero") or arm == "salr" else "peer")
        outside, stale = {}, {}
        for name, chunks in late.items():
            s = sent[name]
            if arm in (DROP, "zero-ef"):           # the site sends them again, inside its next delta
                feedback = ps.feedback[name]
                assert feedback is not None and s.values is not None
                feedback.carry(_only(s.values, ps.model.plan, chunks))
            elif arm == STALE:
                stale[late_key(name, r)] = replace(s, tokens=s.tokens * discount)
            elif arm in ("zero-ef-outside", "salr"):  # the PS applies them next round, outside momentum
                outside[name] = Contribution([p if i in chunks else None for i, p in enumerate(s.parts)],
                                             s.tokens / total)
        val.append(ps.evaluate())
        if progress is not None:
            progress(r)
    return val, late_chunks, extra / wire if wire else 0.0


def _spread(ps: InProcessRun, s: Sent, chunks: frozenset[int], seed: list[int]) -> Sent:
    """Delta `s` as the PS reconstructs it when the chunks `chunks` of its Hadamard transform were
    lost (recovery.spread_loss), encoded again as the run's codec does (no error feedback)."""
    assert s.values is not None
    ranges: dict[str, list[tuple[int, int]]] = {}
    for i in chunks:
        spec = ps.model.plan[i]
        ranges.setdefault(spec.tensor, []).append((spec.offset, spec.offset + spec.length))
    again = InProcessRun.encode(spread_loss(s.values, ranges, seed), s.tokens, Codec(ps.cfg.codec), None)
    return replace(again, wire_bytes=s.wire_bytes)


def _only(values: dict[str, np.ndarray], plan, chunks: frozenset[int]) -> dict[str, np.ndarray]:
    """`values` with every element outside `chunks` (indices into `plan`) zeroed."""
    out = {k: np.zeros_like(v) for k, v in values.items()}
    for i in chunks:
        spec = plan[i]
        part = slice(spec.offset, spec.offset + spec.length)
        out[spec.tensor][part] = values[spec.tensor][part]
    return out
