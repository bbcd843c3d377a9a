"""What to do with a delta that misses its round: the policies measured on the transformer, in this process.

A run's rounds (inprocess.InProcessRun: the sites' inner loops, their codecs with error feedback,
the PS's global model and outer Nesterov step) with a seeded schedule of late sites: in each round
after the first, each site is late with probability `late`, independently (at least one is on time).
A late site trained its whole round; its delta reaches the PS after the round committed. Every arm
sees the same schedule, data and initial weights for a seed, so arms differ by policy alone:

    on-time           nobody is late (the reference)
    drop              today's late_policy "drop": the round's mean is over the deltas that came (a
                      peer-average substitute for the late one), and the late site adds its delta to
                      its error feedback, so it goes out again inside its next delta, through the
                      outer momentum: its mass counts twice, once as the others' mean, once itself
    stale             today's late_policy "stale": the mean over the deltas that came, and the late
                      delta counts in the next round's mean, its weight x staleness_discount
    rescale           the mean over the deltas that came; the late delta is never applied
    zero              the late site counts as zeros in the mean (its weight stays in the
                      denominator); the late delta is never applied
    zero-ef           zero, and the late site carries its delta into its next one, as "drop" does
    zero-ef-outside   zero, and the late delta is applied when it arrives, in the next round, outside
                      the outer momentum: -outer_lr x its share of its round (aggregate.py's `side`)

`run_arm` runs one arm for one seed; `late_policies` every arm and seed, one after another;
`summary` their mean final losses and gaps to "on-time". bench/late_policy.py runs the arms in
parallel and writes the table.
"""

from __future__ import annotations

import numpy as np

from dataclasses import replace

from .aggregate import Contribution
from .config import RunConfig
from .inprocess import InProcessRun, Sent
from .screening import late_key

__all__ = ["ARMS", "late_schedule", "run_arm", "late_policies", "summary"]

ARMS = ("on-time", "drop", "stale", "rescale", "zero", "zero-ef", "zero-ef-outside")


def late_schedule(names: list[str], rounds: int, late: float, seed: int) -> list[frozenset[str]]:
    """Who is late in each round: none in round 0 (warm-up), then each site with probability `late`,
    never all of them (one drawn at random stays on time)."""
    rng = np.random.default_rng([seed, 28])
    out: list[frozenset[str]] = [frozenset()]
    for _ in range(1, rounds):
        is_late = rng.random(len(names)) < late
        if is_late.all():
            is_late[rng.integers(len(names))] = False
        out.append(frozenset(n for n, x in zip(names, is_late) if x))
    return out


def run_arm(cfg: RunConfig, arm: str, late: float, seed: int, threads: int = 1, progress=None) -> dict:
    """One arm for one seed (the model's weights, its data order and the late schedule): the
    validation loss before training and after each of `cfg.train.rounds` rounds, and who was late.
    `progress(round)` is called after every round."""
    import torch

    from .data import load_run_data

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: the arms are {', '.join(ARMS)}")
    torch.set_num_threads(threads)
    run = cfg.replace(**{"model.seed": seed, "train.seed": seed})
    tok, corpus = load_run_data(run.data)
    ps = InProcessRun(run, tok, corpus)
    schedule = late_schedule(ps.names, run.train.rounds, 0.0 if arm == "on-time" else late, seed)
    return {"arm": arm, "late": late, "seed": seed, "val": _train(ps, arm, schedule, progress),
            "late_sites": [sorted(s) for s in schedule]}


def late_policies(cfg: RunConfig, arms: tuple[str, ...] = ARMS, late: float = 0.3, seeds: tuple[int, ...] = (0, 1, 2),
                  threads: int = 1) -> dict:
    """Every arm for every seed, one after another: {"val": {arm: [[losses] per seed]}, "late_sites": [per seed]}."""
    from .memory import trim_heap

    out: dict = {"late": late, "seeds": list(seeds), "val": {a: [] for a in arms}, "late_sites": []}
    for seed in seeds:
        for arm in arms:
            x = run_arm(cfg, arm, late, seed, threads)
            out["val"][arm].append(x["val"])
            trim_heap()
        out["late_sites"].append(x["late_sites"])
    return out


def _train(ps, arm: str, schedule: list[frozenset[str]], progress) -> list[float]:
    """One arm's run; the validation loss before training and after each round."""
    val = [ps.evaluate()]
    outside: dict[str, Contribution] = {}       # zero-ef-outside: late deltas, for outside the momentum
    stale: dict[str, Sent] = {}                  # stale: late deltas, for the next round's mean
    discount = ps.cfg.train.staleness_discount
    for r, late in enumerate(schedule):
        start = ps.start()
        sent = {name: ps.train(name, r, start)[1] for name in ps.names}
        came = {**{n: s for n, s in sent.items() if n not in late}, **stale}
        total = sum(s.tokens for s in sent.values())
        absent = sum(sent[n].tokens for n in late) if arm.startswith("zero") else 0.0
        ps.commit(r, came, absent_weight=absent, side=outside or None)
        outside, stale = {}, {}
        for name in late:
            if arm in ("drop", "zero-ef"):           # the site sends it again, inside its next delta
                feedback = ps.feedback[name]
                assert feedback is not None and sent[name].values is not None
                feedback.carry(sent[name].values)
            elif arm == "stale":
                stale[late_key(name, r)] = replace(sent[name], tokens=sent[name].tokens * discount)
            elif arm == "zero-ef-outside":            # the PS applies it next round, outside momentum
                outside[name] = Contribution(sent[name].parts, sent[name].tokens / total)
        val.append(ps.evaluate())
        if progress is not None:
            progress(r)
    return val


def summary(result: dict, last: int = 3) -> dict[str, dict]:
    """Per arm: the final validation loss (mean over the last `last` evaluations, then over seeds),
    its spread over seeds, and its gap to "on-time" in percent (where that arm ran), seed by seed."""
    base = result["val"].get("on-time")
    rows = {}
    for arm, runs in result["val"].items():
        finals = np.array([np.mean(v[-last:]) for v in runs])
        row = {"final": float(finals.mean()), "spread": float(finals.max() - finals.min())}
        if base is not None:
            ref = np.array([np.mean(v[-last:]) for v in base])
            row["gap_pct"] = float(100 * np.mean(finals / ref - 1))
        rows[arm] = row
    return rows
