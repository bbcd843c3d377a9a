"""Loss recovery on real processes: what each way of handling late chunks costs in time and in loss.

Each run is a real PS and the scenario's site processes, their links emulated by the embedded
testbed, every site losing a share of what it sends on purpose (the scenario's `chunk_loss`:
recovery.ChunkLoss in the site's uplink, per transmission and weighed by its size, i.i.d. or in
bursts; a lost chunk the PS cannot rebuild comes `--late-s` after the others, as a retransmission
would; a lost critical copy or parity is simply lost). The draws are per transmission slot, so arms
that send copies and parity meet the same link with more in flight; the rate is that of a
transmission of the mean size, so a norm gain of a few hundred bytes is almost never lost, one of
100 KB at about the rate.
Arms (issue 28's names in brackets):

    reliable       [B0] every chunk waited for: the deadline is far off
    reliable-lanes [B0'] reliable, each delta spread over 4 lanes (extra TCP connections, recovery.lanes)
    drop           [B6] the old default: a deadline; a late delta is the others' mean, and its
                   site sends it again inside its next delta
    zero           [B1] a deadline; a late delta counts as zeros and is applied when it
                   comes, outside the outer momentum (late_policy zero-outside, the default)
    carry          [B4] a deadline; a late delta counts as zeros and its site carries it into
                   its next delta, through the outer momentum (late_policy zero-carry)
    stale          [B2] a deadline; a late delta counts in a later round, its weight discounted
    rescale        [B3] a deadline; the others' mean stands in for a late delta, never sent again
    quorum         [B7] a minimum quorum (Decoupled DiLoCo's): once 60 % of the sites have
                   delivered, the deadline comes forward to twice the usual spread after; a late
                   delta counts, token-weighted and discounted, in the next round (late_policy stale)
    salr           zero, counting the chunks in at the deadline (recovery.partial_deltas), closing
                   early once what is missing is within 5 % of the round's importance; the rest of
                   a delta (its tail) flows while its site trains the next round; critical chunks
                   sent twice, XOR parity over the chunks holding half the importance, groups of 8;
                   each delta over 4 lanes, every chunk not acknowledged within 1 s sent again on
                   another lane (recovery.hedge_s, recovery.hedge_all): a lost chunk comes again at once,
                   not a retransmission late
    salr-probe     salr with role weights from a sensitivity probe every 2 rounds (recovery.probe_every:
                   importance = role weight x energy; salr's is energy alone)
    salr-no-parity salr with critical copies, without parity (an ablation)
    salr-no-early  salr without the early close (an ablation)
    salr-no-hedge  salr over 4 lanes, without hedging (an ablation)
    salr-hedge-protected  salr hedging only the protected chunks (critical, in a parity group)
    salr-no-importance  salr with each chunk's importance its share of the elements, blind to its
                   energy and role (recovery.importance "size"): the order, the parity and the loss
                   budget by size alone (an ablation)
    salr-one-lane  salr on the Session alone: no lanes, no hedging (an ablation)
    salr-carry     salr with the rest of a delta carried into the site's next delta (zero-carry),
                   not sent late and applied outside the momentum
    salr-peer      salr with the others' mean standing in for a missing chunk (late_policy rescale:
                   the rest of the delta is then never applied, nor carried)
    salr-extend    salr with the bounded extension (recovery.extend_above 0.1): a round still missing more
                   than a tenth of its importance at its deadline waits up to one deadline more
                   (where it can pay: lost chunks coming back sooner, --late-s 2)
    reliable-tail, salr-tail
                   reliable and salr with the update's tail (recovery.downlink_budget 0.2): the low-energy
                   fifth of each update's energy, ~36 % of its bytes on tiny, comes after the next
                   RoundStart and is patched in while the sites train (where it can pay: --bandwidth)

Figures per arm and condition: final validation loss, time to a target loss (and the whole curve,
seconds against validation loss, in the results), p50 and p99 round time (over every round, and
past the warm-up rounds, which every arm spends waiting for every chunk alike), megabytes both ways (the
deltas' and updates' as the PS counted them; `link_up_mb` and `link_down_mb`: everything each link
carried, as the testbed counted it), and what the PS substituted and reconciled (round_end's
recovery fields). The rows go to bench/results/NAME.json (`--out`); beside it, the run folder NAME/
holds table.md (each arm against B0 of the same condition and seed, at its best outer learning
rate: bench/lr_report.py) and curves.html (validation loss against time).

    python bench/loss_recovery.py [--quick] [--loss 0.01,0.05] [--burst 1] [--seeds 1] [--arms salr,reliable]

The deadline arms' deadline is by default (and with `--deadline 0`) derived by the PS from the
arrivals it timed, 1.5 x the typical one; `--deadline S` fixes it S seconds after a round's start
(it must then sit above a round's compute on the machine at hand). `--blackouts 40:2` takes every
link down 2 s in every 40; `--spikes 2:300` adds two delay spikes a minute of at least 300 ms
(testbed/trace.py); `--link-loss 0.01 --region "West Europe"` gives every link 1 % packet loss and
that region's RTT to the PS (85 ms), bandwidth unlimited, which caps
each TCP connection at its Mathis rate (testbed/proxy.py): where lanes (several connections) carry
a delta faster. Not here: downlink loss, B5 (the in-process
study, bench/late_policy.py, measures the loss side of the chunk-level arms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to
import lr_report

from wantrain.config import RunConfig
from wantrain.launch.plan import Outage
from wantrain.launch.run import Run, describe_scenario
from wantrain.telemetry.compare import time_to_target
from wantrain.telemetry import rows

SALR = {"recovery.late_policy": "zero-outside", "recovery.partial_deltas": True, "recovery.critical_copies": True,
        "recovery.parity_share": 0.5, "recovery.parity_group_size": 8, "recovery.lanes": 4, "recovery.hedge_s": 1.0,
        "recovery.hedge_all": True}
LANES = 4
TAIL = 0.2                       # the tail arms' recovery.downlink_budget: on tiny, ~36 % of an update's bytes
RELIABLE_DEADLINE_S = 120.0      # the reliable arm's: far off, every chunk is waited for
# A delta counts whole or not at all, on the Session alone, unprotected: the whole-site behaviour the
# baselines stand for (the product's defaults are SALR's: recovery.lanes, parity and critical copies on)
WHOLE = {"recovery.partial_deltas": False, "recovery.loss_budget": 0.0, "recovery.lanes": 0, "recovery.critical_copies": False,
         "recovery.parity_share": 0.0}
ARMS: dict[str, dict] = {         # each arm but "reliable" closes a round at the size's deadline
    "reliable": {**WHOLE, "recovery.late_policy": "zero-outside"},
    "reliable-lanes": {**WHOLE, "recovery.late_policy": "zero-outside", "recovery.lanes": LANES},
    "drop": {**WHOLE, "recovery.late_policy": "drop"},
    "zero": {**WHOLE, "recovery.late_policy": "zero-outside"},
    "carry": {**WHOLE, "recovery.late_policy": "zero-carry"},
    "stale": {**WHOLE, "recovery.late_policy": "stale"},
    "rescale": {**WHOLE, "recovery.late_policy": "rescale"},
    "quorum": {**WHOLE, "recovery.late_policy": "stale", "schedule.quorum_share": 0.6, "schedule.grace_factor": 2.0},
    "salr": {**SALR, "recovery.loss_budget": 0.05},
    "salr-probe": {**SALR, "recovery.loss_budget": 0.05, "recovery.probe_every": 2},
    "salr-no-parity": {**SALR, "recovery.loss_budget": 0.05, "recovery.parity_share": 0.0},
    "salr-no-hedge": {**SALR, "recovery.loss_budget": 0.05, "recovery.hedge_s": 0.0},
    "salr-no-importance": {**SALR, "recovery.loss_budget": 0.05, "recovery.importance": "size"},
    "salr-one-lane": {**SALR, "recovery.loss_budget": 0.05, "recovery.lanes": 0, "recovery.hedge_s": 0.0},
    "salr-no-early": {**SALR, "recovery.loss_budget": 0.0},
    "salr-carry": {**SALR, "recovery.late_policy": "zero-carry", "recovery.loss_budget": 0.05},
    "salr-peer": {**SALR, "recovery.late_policy": "rescale", "recovery.loss_budget": 0.05},
    "salr-hedge-protected": {**SALR, "recovery.loss_budget": 0.05, "recovery.hedge_all": False},
    "salr-extend": {**SALR, "recovery.loss_budget": 0.05, "recovery.extend_above": 0.1},
    "reliable-tail": {**WHOLE, "recovery.late_policy": "zero-outside", "recovery.downlink_budget": TAIL},
    "salr-tail": {**SALR, "recovery.loss_budget": 0.05, "recovery.downlink_budget": TAIL},
}
SIZES = {
    # quick's second arm: SALR without hedging, whose rounds close without the rest whatever the
    # timing (with hedges, the few chunks lost at 5 % over 4 rounds are all sent again in time)
    "quick": dict(rounds=5, inner_steps=4, reliable_rounds=1, losses=(0.05,), seeds=1, target=3.6, deadline_s=3.0,
                  late_s=4.5, arms=("reliable", "salr-no-hedge")),
    # full's target: 2.5, reached mid-run (round 6-10); 2.6 is reached in the three reliable warm-up
    # rounds or just after, where every arm waits alike (each row keeps its curve: any target can be read)
    # full's deadline: derived (1.5 x the typical arrival). A fixed one must sit above a round's compute
    # on the machine at hand: 4 s did on one, and on a slower one it cut every round short for
    # compute alone (salr +5 % against B0 at 1 %, where the derived one gave +0.04 %).
    "full": dict(rounds=16, inner_steps=20, reliable_rounds=3, losses=(0.01, 0.05, 0.1), seeds=1, target=2.5,
                 deadline_s=0.0, late_s=6.0, arms=tuple(ARMS)),
}


@dataclass(frozen=True)
class Link:
    """What every site's link does: chunk loss per transmission (`burst`: mean run of losses), a
    lost chunk `late_s` late; blackouts (the link carries nothing for `blackout_s`, every
    `blackout_every_s`, at a phase of its own per site); delay spikes (Poisson, `spikes_per_min`,
    each at least `spike_ms` more one-way delay, Pareto-tailed, 2 s long: testbed/trace.py)."""

    loss: float
    burst: float = 1.0
    late_s: float = 6.0
    blackout_every_s: float = 0.0
    blackout_s: float = 0.0
    spikes_per_min: float = 0.0
    spike_ms: float = 50.0
    packet_loss: float = 0.0        # the link's own loss: each TCP flow's rate capped by it (testbed/proxy.py)
    region: str = ""                # every site's region (its RTT to the PS's, testbed/regions), unlimited
                                    # bandwidth; "": the scenario's
    bandwidth_mbps: float = 0.0     # every link's bandwidth each way, its connections' in all (0: the scenario's)

    def apply(self, plan, seed: int):
        for k, name in enumerate(plan.names):
            outages = ()
            if self.blackout_every_s > 0:
                phase = np.random.default_rng([seed, k]).uniform(0, self.blackout_every_s)
                outages = tuple(Outage(round(float(t), 2), self.blackout_s)      # for the first 10 minutes:
                                for t in np.arange(phase, 600, self.blackout_every_s))   # the plan is an event
            plan = plan.with_site(name, speed_factor=2.0, chunk_loss=self.loss, chunk_burst=self.burst,
                                  chunk_late_s=self.late_s, outages=outages, spikes_per_min=self.spikes_per_min,
                                  spike_min_ms=self.spike_ms, loss=self.packet_loss,
                                  **({"region": self.region, "bandwidth_mbps": None} if self.region else {}),
                                  **({"bandwidth_mbps": self.bandwidth_mbps} if self.bandwidth_mbps else {}))
        return plan

    def disturbances(self) -> str:
        out = []
        if self.blackout_every_s:
            out.append(f"blackouts of {self.blackout_s:g} s every {self.blackout_every_s:g} s")
        if self.spikes_per_min:
            out.append(f"{self.spikes_per_min:g} delay spikes a minute (>= {self.spike_ms:g} ms)")
        if self.packet_loss or self.region:
            out.append(f"packet loss {self.packet_loss:.1%} on the link{' from ' + self.region if self.region else ''} "
                       f"(each TCP flow at most its Mathis rate)")
        if self.bandwidth_mbps:
            out.append(f"{self.bandwidth_mbps:g} Mbit/s each way a link")
        return ", ".join(out) or "no blackouts or delay spikes"


DERIVED = {"schedule.deadline_s": 0.0, "schedule.deadline_factor": 1.5, "schedule.deadline_min_s": 0.5}


def deadline(arm: str, seconds: float) -> dict:
    """An arm's deadline: the reliable arms' far off; the others' `seconds` after a round's start, or
    (0) derived by the PS from the arrivals it timed, 1.5 x the typical one (ps/rounds.py)."""
    if arm.startswith("reliable"):
        return {"schedule.deadline_s": RELIABLE_DEADLINE_S}
    return {"schedule.deadline_s": seconds} if seconds else DERIVED


def run_arm(arm: str, size: dict, link: Link, seed: int, scenario: str, folder: Path, outer_lr: float = 0.0
            ) -> dict:
    """One arm's run under one condition (at `outer_lr`; 0: the default); its figures."""
    plan = link.apply(describe_scenario(scenario).replace(time_scale=1.0), seed)
    lr = {"train.outer_lr": outer_lr} if outer_lr else {}
    cfg = RunConfig().replace(num_sites=len(plan.names), sites=plan.names, **{
        "model.preset": "tiny", "model.block_size": 64, "train.rounds": size["rounds"],
        "train.inner_steps": size["inner_steps"], "train.warmup_steps": size["inner_steps"], "train.seed": seed,
        "model.seed": seed,
        "recovery.reliable_rounds": size["reliable_rounds"], "schedule.quorum_wait_s": 60.0,
        **deadline(arm, size["deadline_s"]), **ARMS[arm],
        **lr})
    t0 = time.time()
    loss = link.loss
    with Run(cfg, run_dir=folder / f"{arm}-{loss}-{seed}-{cfg.train.outer_lr}", site_threads=1, plan=plan) as run:
        for _ in run.follow(timeout_s=900):
            pass
        events = list(run.events)
    ends = rows(events, "round_end")
    if not ends:
        raise SystemExit(f"{arm}, chunk loss {loss}, seed {seed}: no round committed")
    outcome = time_to_target(events, size["target"])
    assert outcome is not None
    round_s = [e["round_s"] for e in ends]
    # past the warm-up (recovery.reliable_rounds), where every arm waits for every chunk alike
    after = [e["round_s"] for e in ends if e["round"] >= size["reliable_rounds"]] or round_s
    return {"arm": arm, "chunk_loss": loss, "burst": link.burst, "blackout_every_s": link.blackout_every_s,
            "blackout_s": link.blackout_s, "spikes_per_min": link.spikes_per_min, "packet_loss": link.packet_loss,
            "region": link.region, "bandwidth_mbps": link.bandwidth_mbps, "seed": seed, "outer_lr": cfg.train.outer_lr,
            "rounds": len(ends),
            "final_val_loss": float(np.mean([e["val_loss"] for e in ends[-3:]])),
            "reached": outcome.reached, "time_to_target_s": outcome.time_s if outcome.reached else None,
            "wall_s": round(time.time() - t0, 1), "p50_round_s": float(np.percentile(round_s, 50)),
            "p99_round_s": float(np.percentile(round_s, 99)),
            "p50_after_warmup_s": float(np.percentile(after, 50)), "p99_after_warmup_s": float(np.percentile(after, 99)),
            "uplink_mb": sum(e["wire_bytes"] + e["protection_bytes"] for e in rows(events, "site_round")) / 1e6,
            "protection_mb": sum(e["protection_bytes"] for e in rows(events, "site_round")) / 1e6,
            "rebuilt": sum(e["rebuilt"] for e in rows(events, "site_round")),
            "hedged": sum(e["hedged"] for e in rows(events, "site_round")),
            "downlink_mb": len(plan.names) * sum(e["wire_bytes"] for e in ends) / 1e6,
            **link_mb(events),
            "tail_mb": len(plan.names) * sum(e["tail_mb"] for e in rows(events, "update_split")),
            "closes": {c: sum(e["close"] == c for e in ends) for c in ("complete", "early", "deadline", "extended")},
            "substituted": sum(sum(e["substituted"].values()) for e in ends),
            "partial": sum(sum(e["partial"].values()) for e in ends),
            "reconciled": sum(sum(e["reconciled"].values()) for e in ends),
            "late_deltas": {a: sum(e["action"] == a for e in rows(events, "late_delta"))
                            for a in ("deferred", "dropped", "kept")},
            "curve": outcome.curve}


def link_mb(events: list[dict]) -> dict:
    """The bytes every site's link carried each way, as its testbed proxy counted them (everything on
    the wire: the model's download, deltas, copies, parity, hedges, tails, updates, probes, gRPC's
    framing; not what the chunk-loss injector dropped, which never left the site)."""
    up: dict[str, int] = {}
    down: dict[str, int] = {}
    for e in rows(events, "link"):
        up[e["site"]] = max(up.get(e["site"], 0), e["bytes_up"])
        down[e["site"]] = max(down.get(e["site"], 0), e["bytes_down"])
    return {"link_up_mb": sum(up.values()) / 1e6, "link_down_mb": sum(down.values()) / 1e6}


def table(results: list[dict], target: float) -> str:
    """One line per run ('p99 w': the p99 round time past the warm-up)."""
    lines = [f"{'loss':>5} {'arm':<15} {'final':>7} {'to ' + str(target):>8} {'p50 s':>6} {'p99 s':>6} {'p99 w':>6} {'up MB':>6} "
             f"{'dn MB':>6} {'closes c/e/d/x':>14} {'subst':>6} {'partial':>7} {'recon':>6} {'rebuilt':>7}"]
    for r in results:
        t = f"{r['time_to_target_s']:.1f}" if r["time_to_target_s"] is not None else "-"
        c = r["closes"]
        lines.append(f"{r['chunk_loss']:>5.0%} {r['arm']:<15} {r['final_val_loss']:>7.4f} {t:>8} "
                     f"{r['p50_round_s']:>6.2f} {r['p99_round_s']:>6.2f} {r['p99_after_warmup_s']:>6.2f} "
                     f"{r['link_up_mb']:>6.2f} {r['link_down_mb']:>6.2f} "
                     f"{c['complete']:>4}/{c['early']}/{c['deadline']}/{c.get('extended', 0):<4} {r['substituted']:>6} "
                     f"{r['partial']:>7} "
                     f"{r['reconciled']:>6} {r['rebuilt']:>7}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one condition, short runs")
    p.add_argument("--loss", help="comma-separated chunk loss rates (full: 0.01,0.05,0.1)")
    p.add_argument("--burst", type=float, default=1.0, help="mean run of lost chunks (1: i.i.d.)")
    p.add_argument("--late-s", type=float, help="seconds a lost chunk comes after the others (full: 6, quick: 4.5)")
    p.add_argument("--seeds", type=int, help="seeds per arm")
    p.add_argument("--first-seed", type=int, default=0, help="the seeds are this one and the next (to add seeds)")
    p.add_argument("--target", type=float, help="target validation loss (full: 2.5)")
    p.add_argument("--arms", help=f"comma-separated, of {', '.join(ARMS)} (full: all, quick: reliable,salr-no-hedge)")
    p.add_argument("--blackouts", metavar="EVERY:SECONDS", help="each link carries nothing for SECONDS every EVERY s")
    p.add_argument("--spikes", metavar="PER_MIN:MS", help="delay spikes a minute, each at least MS ms one way")
    p.add_argument("--link-loss", type=float, default=0.0, metavar="P", help="the links' packet loss: each TCP "
                   "connection's rate at most its Mathis bound (where lanes help; give the RTT with --region)")
    p.add_argument("--region", default="", help="every site's region (its RTT to the PS's), bandwidth unlimited")
    p.add_argument("--bandwidth", type=float, default=0.0, metavar="MBPS",
                   help="every link's bandwidth each way, shared by its TCP connections (0: the scenario's)")
    p.add_argument("--deadline", type=float, help="seconds after a round's start the deadline arms close it "
                   "(quick: 3; 0, full's: derived from the arrivals, 1.5 x the typical one)")
    p.add_argument("--outer-lr", help="comma-separated outer learning rates, every arm at each (a sweep; "
                   "default: the config's, 0.7)")
    p.add_argument("--scenario", default="loopback")
    p.add_argument("--keep-runs", help="keep each run's folder under this one (default: a temporary folder)")
    p.add_argument("--out", default="loss_recovery", help="result name under bench/results, or a path ending in .json")
    args = p.parse_args()
    size = dict(SIZES["quick" if args.quick else "full"])
    if args.target is not None:
        size["target"] = args.target
    if args.deadline is not None:
        size["deadline_s"] = args.deadline
    arms = args.arms.split(",") if args.arms else list(size["arms"])
    late_s = args.late_s if args.late_s is not None else size["late_s"]
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    losses = [float(x) for x in args.loss.split(",")] if args.loss else list(size["losses"])
    blackouts = tuple(float(x) for x in args.blackouts.split(":")) if args.blackouts else (0.0, 0.0)
    spikes = tuple(float(x) for x in args.spikes.split(":")) if args.spikes else (0.0, 50.0)
    link_loss = (args.link_loss, args.region, args.bandwidth)
    if len(blackouts) != 2 or len(spikes) != 2:
        p.error("--blackouts and --spikes take two numbers, as EVERY:SECONDS and PER_MIN:MS")
    outer_lrs = [float(x) for x in args.outer_lr.split(",")] if args.outer_lr else [0.0]
    results = []
    with tempfile.TemporaryDirectory(prefix="wantrain-lr-") as tmp:
        if args.keep_runs:
            tmp = args.keep_runs
        for loss in losses:
            for seed in range(args.first_seed, args.first_seed + (args.seeds or size["seeds"])):
                for arm in arms:
                    for lr in outer_lrs:
                        link = Link(loss, args.burst, late_s, *blackouts, *spikes, *link_loss)
                        r = run_arm(arm, size, link, seed, args.scenario, Path(tmp), lr)
                        results.append(r)
                        print(f"chunk loss {loss:.0%}, {arm}, outer lr {r['outer_lr']:g}, seed {seed}: final "
                              f"{r['final_val_loss']:.4f}, p50/p99 round {r['p50_round_s']:.2f}/{r['p99_round_s']:.2f} "
                              f"s, wall {r['wall_s']} s, closes {r['closes']}", flush=True)
    print()
    closes = f"{size['deadline_s']} s" if size["deadline_s"] else "derived"
    header = (f"{args.scenario}, {size['rounds']} rounds of {size['inner_steps']} inner steps, deadline {closes} "
              f"(reliable: none), lost chunks {late_s} s late, in bursts of {args.burst:g}; "
              f"{Link(0.0, args.burst, late_s, *blackouts, *spikes, *link_loss).disturbances()}")
    print(header)
    print(table(results, size["target"]))
    seeds = {(r["arm"], r["chunk_loss"], r["outer_lr"]) for r in results}
    if len(seeds) < len(results) or len(outer_lrs) > 1:
        for arm in arms:
            for loss in losses:
                mean = {}
                for lr in {r["outer_lr"] for r in results}:
                    finals = [r["final_val_loss"] for r in results if (r["arm"], r["chunk_loss"], r["outer_lr"]) ==
                              (arm, loss, lr)]
                    mean[lr] = statistics.mean(finals)
                    print(f"{arm} at {loss:.0%}, outer lr {lr:g}: final {mean[lr]:.4f} over {len(finals)} seeds")
                if len(mean) > 1:
                    print(f"  {arm} at {loss:.0%}: best outer lr {min(mean, key=mean.get):g}")
    path = save_to(args.out, {"size": "quick" if args.quick else "full", "scenario": args.scenario, "losses": losses,
                       "burst": args.burst, "late_s": late_s, "blackouts": blackouts, "spikes": spikes,
                       "link_loss": link_loss[:2], "bandwidth_mbps": args.bandwidth,
                       "deadline_s": size["deadline_s"], "arms": arms, "outer_lrs": outer_lrs, "target": size["target"],
                       "rows": results})
    folder = path.with_suffix("")
    lr_report.write(folder, results, size["target"], header)
    print(f"\n{lr_report.markdown(results, size['target'])}\n\nresults: {path}; table and curves: {folder}/")


if __name__ == "__main__":
    main()
