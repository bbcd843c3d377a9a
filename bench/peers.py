"""wantrain against what its users would pick instead, on the same emulated WAN (issue 57: Flower, torchft).

Every arm trains the same GPT (`tiny`, its seed), on the same data shards and batches, with the same
inner AdamW steps, to the same target validation loss evaluated the same way (the PS's validation
batches), read on the same wall-clock grid (bench/time_to_target.py's sizes and reader), and every
site reaches its server through the same testbed link (`python -m testbed links`: the scenario's
delay, bandwidth, loss and outages, one proxy per site). Bytes each way are read off those links for
every arm alike (what crossed the emulated WAN, framing and control included).

Arms:
    wantrain-paper     wantrain as the DiLoCo paper ran it: fixed inner steps, fp32 deltas and updates,
                       Nesterov outer step (time_to_target's diloco-fp32)
    wantrain-default   wantrain's defaults: INT8 + Huffman both ways (time_to_target's diloco-int8-huffman)
    wantrain-best      the fastest of time_to_target's arms on this scenario in its stored figures
                       (bench/published/time_to_target.json: the adaptive controller on three-sites), chosen
                       from those figures, not tuned to this run
    flower-fedavgm     Flower (flwr, pinned in the peers' venv), its legacy server and clients over its gRPC
                       stream: FedAvgM with DiLoCo's outer lr and momentum as server lr and momentum
                       (heavy-ball, where DiLoCo's is Nesterov), each client running wantrain's inner loop
                       for the same steps (bench/peers_flower.py); fp32 parameters whole each way
    torchft-diloco     torchft (pinned in the peers' venv): its lighthouse and one replica group per site,
                       its DiLoCo (fp32 pseudo-gradient bucketized into one gloo allreduce, Nesterov outer
                       step with DiLoCo's lr and momentum) around wantrain's inner loop (bench/peers_torchft.py).
                       Its sites connect to each other, which no proxy can sit between: each site runs in its
                       own network namespace behind the testbed's kernel-relay link (root): htb, nftables and
                       the delay relay shape every packet; bytes are the kernel's counts (IP packets, headers
                       included: about 4 % more than a proxy's payload counts for the same traffic)

    hivemind-diloco    hivemind (pinned in the peers' venv; its wheel carries its p2pd daemon): DiLoCo over its
                       DHT and DecentralizedAverager, every site in the group (bench/peers_hivemind.py), fp32,
                       Nesterov outer step; sites in namespaces as torchft's

A scenario's outages (comm-bound's: its slowest link dark for 200 s of trace time, twice) are read
off the links' rows for every arm alike (`outage_outcomes`): the rounds committed while the site was
dark, and how long after its link came back a round counted it again.

Not built yet (issue 57): a site killed and restarted; `small`; a quick form in `make test`.

    make peers                                         # the peers' venv (.venv-peers), once
    python bench/peers.py [--quick] [--seeds 3] [--scenario three-sites|bench/scenarios/comm-bound.toml] [--arms ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to
from time_to_target import SIZES, arm_config, run_events, set_budget, summary

from wantrain.launch.plan import RunPlan
from wantrain.launch.run import describe_scenario
from wantrain.telemetry import rows
from wantrain.telemetry.compare import Outcome, time_to_target

ROOT = Path(__file__).resolve().parents[1]
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
ARMS = {"wantrain-paper": "diloco-fp32", "wantrain-default": "diloco-int8-huffman", "wantrain-best": "",
        "flower-fedavgm": "diloco-fp32", "torchft-diloco": "diloco-fp32", "hivemind-diloco": "diloco-fp32"}
PUBLISHED = ROOT / "bench" / "published" / "time_to_target.json"


def best_arm(scenario: str) -> str:
    """time_to_target's arm with the lowest stored median time to the target on `scenario`."""
    from wantrain.telemetry.compare import Spread, read_published

    from testbed.scenario import load_scenario

    scenario = load_scenario(scenario).name          # a file's scenario: by the name it gives itself
    table = read_published(str(PUBLISHED))["scenarios"].get(scenario)
    if not table:
        raise SystemExit(f"{PUBLISHED} has no figures for {scenario!r}: wantrain-best cannot be chosen; "
                         f"run bench/time_to_target.py --scenario {scenario} first")
    return min(table, key=lambda arm: Spread.of(table[arm]).centre)
STARTUP_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def link_bytes(events: list[dict], until: float) -> tuple[int, int]:
    """Bytes up and down over every site's link by time `until` (the links' last row before it)."""
    last: dict[str, dict] = {}
    for e in rows(events, "link"):
        if e["t"] <= until:
            last[e["site"]] = e
    return sum(e["bytes_up"] for e in last.values()), sum(e["bytes_down"] for e in last.values())


def _jsonl(path: Path) -> list[dict]:
    """The lines of a JSON-lines file written by another process as it goes (a last, half-written line
    is left for the next read)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def _wait_file(path: Path, procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while not path.exists() or not path.stat().st_size:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].args[:4]} exited with {dead[0].returncode} before {path.name} appeared")
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.1)


def run_flower(size: dict, seed: int, scenario: str, folder: Path) -> list[dict]:
    """Flower's run through the scenario's links, stopped at the target or cap_s after round 0 started;
    its events (the server's and the links')."""
    if not PEERS_PYTHON.exists():
        raise SystemExit(f"{PEERS_PYTHON} is missing: `make peers` builds the peers' venv (flwr pinned there)")
    plan = describe_scenario(scenario)
    cfg = arm_config(ARMS["flower-fedavgm"], size, seed, list(plan.names))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(cfg.to_json())
    (folder / "plan.json").write_text(plan.to_json())
    events_file, links_log, listening = folder / "events.jsonl", folder / "links.jsonl", folder / "listening.json"
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    script = str(ROOT / "bench" / "peers_flower.py")
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], name: str) -> subprocess.Popen:
        return _start(procs, folder, argv, name, env)

    try:
        start([str(PEERS_PYTHON), script, "server", "--config", str(folder / "config.json"), "--port", str(port),
               "--events", str(events_file)], "server")
        start([sys.executable, "-m", "testbed", "links", "--plan", str(folder / "plan.json"),
               "--target", f"127.0.0.1:{port}", "--listening", str(listening), "--log", str(links_log)], "links")
        _wait_file(listening, procs, 60)
        dials = {s.name: s.dial for s in RunPlan.read(listening).sites}
        for k, site in enumerate(plan.sites):     # each on its machine's speed, as a wantrain site is
            start([str(PEERS_PYTHON), script, "client", "--config", str(folder / "config.json"), "--site", site.name,
                   "--index", str(k), "--server", str(dials[site.name]), "--speed-factor", str(site.speed_factor)],
                  f"client-{site.name}")
        t0, started = time.time(), None
        while True:
            events = _jsonl(events_file)
            if started is None and (s := rows(events, "round_start")):
                started = s[0]["t"]
            ends = rows(events, "round_end")
            if ends and ends[-1]["val_loss"] <= size["target"]:
                break
            if started is not None and time.time() - started > size["cap_s"]:
                break
            if started is None and time.time() - t0 > STARTUP_S:
                raise TimeoutError(f"Flower's round 0 did not start within {STARTUP_S:.0f} s: see {folder}")
            if procs[0].poll() is not None:      # the server ended: every round done (or it failed)
                if procs[0].returncode != 0:
                    raise RuntimeError(f"Flower's server exited with {procs[0].returncode}: "
                                       f"{(folder / 'server.log').read_text()[-2000:]}")
                break
            time.sleep(0.25)
        time.sleep(2.5)         # the links' next row: bytes up to the last round's end
    finally:
        _stop(procs)
    return _jsonl(events_file) + _jsonl(links_log)


def _stop(procs: list[subprocess.Popen]) -> None:
    """End each process and everything it started: each runs in its own session, and a peer's site
    leaves children behind when only it is stopped (hivemind's DHT and averager processes, its p2pd:
    seen spinning at 20 % of a core each after their site was gone, slowing the next arm's runs)."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    time.sleep(1.0)                 # the children's own shutdown, then whatever is left goes
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def _start(procs: list[subprocess.Popen], folder: Path, argv: list[str], name: str, env: dict) -> subprocess.Popen:
    log = open(folder / f"{name}.log", "wb")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                         start_new_session=True)
    procs.append(p)
    return p


def run_in_namespaces(arm: str, size: dict, seed: int, scenario: str, folder: Path) -> list[dict]:
    """A peer whose sites connect to each other (torchft, hivemind): each site in its own network
    namespace behind its scenario link (the testbed's kernel-relay backend: root), stopped at the
    target or cap_s after round 0 started. Its events: each site's, the evaluated global models'
    `round_end`, the links'."""
    from testbed.kernel import site_end

    from wantrain.data import load_run_data
    from wantrain.ps.model import GlobalModel

    if not PEERS_PYTHON.exists():
        raise SystemExit(f"{PEERS_PYTHON} is missing: `make peers` builds the peers' venv ({arm}'s pins are there)")
    if os.geteuid() != 0:
        raise SystemExit(f"{arm}'s sites connect to each other: each runs in its own network namespace, "
                         "which needs root (the testbed's kernel-relay backend)")
    import torch

    plan = describe_scenario(scenario)
    cfg = arm_config(ARMS[arm], size, seed, list(plan.names))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(cfg.to_json())
    (folder / "plan.json").write_text(plan.to_json())
    links_log, listening, port_file = folder / "links.jsonl", folder / "listening.json", folder / "lighthouse.port"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []
    tok, corpus = load_run_data(cfg.data)
    model = GlobalModel(cfg, tok.vocab_size, corpus.val)
    evaluated: list[dict] = []
    try:
        target_port = 9                     # nothing listens: hivemind's sites dial only each other
        if arm == "torchft-diloco":         # its lighthouse, on the host: every site dials it
            _start(procs, folder, [str(PEERS_PYTHON), str(ROOT / "bench" / "peers_torchft.py"), "lighthouse",
                                   "--min-replicas", str(len(plan.sites)), "--port-file", str(port_file)],
                   "lighthouse", env)
            _wait_file(port_file, procs, 60)
            target_port = int(port_file.read_text())
        _start(procs, folder, [sys.executable, "-m", "testbed", "links", "--plan", str(folder / "plan.json"),
                               "--backend", "kernel-relay", "--target", f"127.0.0.1:{target_port}",
                               "--listening", str(listening), "--log", str(links_log)], "links", env)
        _wait_file(listening, procs, 60)
        services = len(procs)
        for k, s in enumerate(RunPlan.read(listening).sites):
            assert s.host is not None, f"the links wrote no address for {s.name}"
            address, interface = site_end(s.host)
            common = ["--config", str(folder / "config.json"), "--site", s.name, "--index", str(k), "--address",
                      address, "--out", str(folder), "--sites", str(len(plan.sites)), "--speed-factor",
                      str(s.speed_factor)]
            argv = ([str(ROOT / "bench" / "peers_torchft.py"), "site", *common, "--lighthouse",
                     f"http://{s.host}:{s.port}"] if arm == "torchft-diloco"
                    else [str(ROOT / "bench" / "peers_hivemind.py"), *common])
            _start(procs, folder, [*s.exec_prefix, str(PEERS_PYTHON), *argv], f"site-{s.name}",
                   {**env, "GLOO_SOCKET_IFNAME": interface})
        t0, started = time.time(), None
        while True:
            events = [e for f in folder.glob("events-*.jsonl") for e in _jsonl(f)]
            if started is None and (s0 := rows(events, "round_start")):
                started = min(e["t"] for e in s0)
            for snap in sorted(folder.glob("snap-*.pt"), key=lambda f: int(f.stem.split("-")[1])):
                r = int(snap.stem.split("-")[1])
                if any(e["round"] == r for e in evaluated):
                    continue
                state = torch.load(snap)
                for name, t in state["model"].items():
                    if name in model.views:
                        model.views[name][...] = t.numpy().reshape(model.views[name].shape)
                evaluated.append({"kind": "round_end", "t": state["t"], "round": r, "val_loss": model.evaluate(),
                                  "wire_bytes": 0})
            if evaluated and min(e["val_loss"] for e in evaluated) <= size["target"]:
                break
            if started is not None and time.time() - started > size["cap_s"]:
                break
            if started is None and time.time() - t0 > STARTUP_S:
                raise TimeoutError(f"{arm}'s round 0 did not start within {STARTUP_S:.0f} s: see {folder}")
            if all(p.poll() is not None for p in procs[services:]):
                break               # every site ended: its rounds done (or failed: see the logs)
            time.sleep(0.25)
        time.sleep(2.5)             # the links' next row: bytes up to the last round's end
    finally:
        _stop(procs)
    events = [e for f in folder.glob("events-*.jsonl") for e in _jsonl(f)]
    for e in evaluated:                          # every site that committed the round, now all have said
        e["sites"] = sorted({s["site"] for s in rows(events, "site_round") if s["round"] == e["round"] and s["committed"]})
    starts: dict[int, float] = {}
    for e in rows(events, "round_start"):        # a round starts when its first site starts it
        starts[e["round"]] = min(starts.get(e["round"], e["t"]), e["t"])
    return ([{"kind": "round_start", "t": t, "round": r} for r, t in sorted(starts.items())] + rows(events, "site_round")
            + sorted(evaluated, key=lambda e: e["round"]) + _jsonl(links_log))


def outage_outcomes(events: list[dict]) -> list[dict]:
    """For each outage of a site's link (the links' `outage_start` / `outage_end`): how long it was
    dark, how many rounds committed meanwhile (0: the run waited for it), and how long after its link
    came back a committed round counted it again (None: none did before the run stopped; `ended`
    says whether any round committed after the outage at all)."""
    ends, starts = rows(events, "round_end"), rows(events, "round_start")
    out = []
    for start in rows(events, "outage_start"):
        site = start["site"]
        if not ends or start["t"] > ends[-1]["t"]:
            continue                    # it began after the run's last round: the run had stopped
        stop = next((e["t"] for e in rows(events, "outage_end") if e["site"] == site and e["t"] >= start["t"]),
                    ends[-1]["t"])      # (no end: the links stopped while it was dark)
        if stop <= starts[0]["t"]:
            continue                    # over before round 0 started: start-up, outside the timed window
        back = next((e for e in ends if e["t"] > stop and site in e.get("sites", ())), None)
        out.append({"site": site, "dark_s": round(stop - start["t"], 1),
                    "rounds_during": sum(1 for e in ends if start["t"] < e["t"] <= stop),
                    "back_s": None if back is None else round(back["t"] - stop, 1),
                    "ended": any(e["t"] > stop for e in ends)})
    return out


def outcome_row(events: list[dict], size: dict) -> dict:
    """The run against the target; a run that committed no round (hivemind's first group that never
    formed) is a run that did not reach it, at the cap, its loss unknown (NaN), its bytes counted."""
    o = time_to_target(events, size["target"], size["cadence_s"])
    if o is None:
        o = Outcome(size["target"], False, -1, size["cap_s"], math.nan, 0.0, 0.0)
    t_end = next((e["t"] for e in rows(events, "round_end") if e["round"] == o.round), events[-1]["t"])
    up, down = link_bytes(events, t_end + 5.0)
    return {"outcome": o, "link_up_mb": up / 1e6, "link_down_mb": down / 1e6, "outages": outage_outcomes(events)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed of short runs")
    p.add_argument("--seeds", type=int, help="seeds per arm (quick: 1, full: 3)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--scenario", default="three-sites")
    p.add_argument("--out", default="peers", help="result name under bench/results, or a path ending in .json")
    args = p.parse_args()
    size = dict(SIZES["quick" if args.quick else "full"])
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    seeds = range(args.seeds or size["seeds"])
    set_budget(size, describe_scenario(args.scenario))      # for a time-budgeted best arm
    chosen = {**ARMS, "wantrain-best": best_arm(args.scenario) if "wantrain-best" in arms else ""}
    print(f"{args.scenario}: wantrain-best is time_to_target's {chosen['wantrain-best'] or '-'}; "
          f"time budget {size['budget_s']:.2f} s where an arm has one", flush=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="wantrain-peers-") as tmp:
        for arm in arms:
            measured = []
            for seed in seeds:
                folder = Path(tmp) / f"{arm}-{seed}"
                if arm == "flower-fedavgm":
                    events = run_flower(size, seed, args.scenario, folder)
                elif arm in ("torchft-diloco", "hivemind-diloco"):
                    events = run_in_namespaces(arm, size, seed, args.scenario, folder)
                else:
                    events = run_events(chosen[arm], size, seed, args.scenario, Path(tmp), name=f"{arm}-{seed}")
                m = outcome_row(events, size)
                o = m["outcome"]
                measured.append(m)
                print(f"{arm} seed {seed}: {'reached' if o.reached else 'did not reach'} {size['target']} at round "
                      f"{o.round} after {o.time_s:.1f} s (val loss {o.val_loss:.4f}); over the links "
                      f"{m['link_up_mb']:.2f} MB up, {m['link_down_mb']:.2f} MB down", flush=True)
                for d in m["outages"]:
                    back = (f"counted again {d['back_s']:.1f} s after its link came back" if d["back_s"] is not None
                            else "not counted again before the run stopped")
                    print(f"    {d['site']} dark {d['dark_s']:.0f} s: {d['rounds_during']} rounds committed meanwhile; "
                          f"{back}", flush=True)
            results[arm] = {**summary([m["outcome"] for m in measured]),
                            "link_up_mb": [round(m["link_up_mb"], 3) for m in measured],
                            "link_down_mb": [round(m["link_down_mb"], 3) for m in measured],
                            "outages": [m["outages"] for m in measured]}
    print(f"\n{args.scenario}: time to validation loss <= {size['target']} (median over the seeds that reached it)")
    print(f"{'arm':<16} {'reached':>7} {'time s':>8} {'range s':>11} {'rounds':>8} {'MB up':>8} {'MB down':>8}")
    for arm, r in results.items():
        t = f"{r['time_s']:.1f}" if r["time_s"] is not None else "-"
        spread = "{:.1f}-{:.1f}".format(*r["time_s_range"]) if r.get("time_s_range") else "-"
        print(f"{arm:<16} {r['reached']:>7} {t:>8} {spread:>11} {','.join(map(str, r['rounds'])):>8} "
              f"{sorted(r['link_up_mb'])[len(r['link_up_mb']) // 2]:>8.2f} "
              f"{sorted(r['link_down_mb'])[len(r['link_down_mb']) // 2]:>8.2f}")
    print("\nOutages of the scenario's links (every seed): the run went on while it was dark / the site counted again after")
    for arm, r in results.items():
        seen = [d for run in r["outages"] for d in run]
        if seen:
            back = sorted(d["back_s"] for d in seen if d["back_s"] is not None)
            print(f"{arm:<16} {len(seen)} outages: went on through {sum(d['rounds_during'] > 0 for d in seen)}; "
                  f"site back in {len(back)}" + (f", {back[len(back) // 2]:.1f} s after (median)" if back else "")
                  + f"; the run stopped before it was back in {sum(not d['ended'] for d in seen)}")
    save_to(args.out, {"size": "quick" if args.quick else "full", "scenario": args.scenario, "target": size["target"],
                       "seeds": len(seeds), "cadence_s": size["cadence_s"], "budget_s": size["budget_s"],
                       "wantrain_best": chosen["wantrain-best"], "flower": "flwr 1.42.0", "arms": results})


if __name__ == "__main__":
    main()
