"""hivemind's side of bench/peers.py: DiLoCo over hivemind's decentralized averaging, a peer per site.

Runs under the peers' own venv (`make peers`, `.venv-peers`), each site in its own network namespace
behind the testbed's kernel-relay link (root), as torchft's do: hivemind's libp2p daemon (p2pd, in
its wheel) connects the sites to each other directly.

    ip netns exec NS python bench/peers_hivemind.py --config CFG.json --site NAME --index K \\
        --address SITE_IP --out DIR --sites N [--speed-factor F]

The first site starts the DHT and writes its address (`dht-peers.txt` in DIR); the others join
through it. Each round: wantrain's inner steps (InnerLoop, as every arm), then the pseudo-gradient
(the round's start minus its end) averaged by hivemind's DecentralizedAverager, in fp32, in a group
of every site (target and minimum group size: all of them, so every replica applies the same
average, as DiLoCo does), then DiLoCo's outer step on it: SGD with DiLoCo's learning rate and
momentum, Nesterov. What is hivemind's: the DHT, the matchmaking (`--matchmaking-s`: the least time a
group waits to form) and the all-reduce over libp2p. OpenDiLoCo ran DiLoCo on hivemind this way.

Like bench/peers_torchft.py, each site writes the global parameters after each round (`snap-R.pt`)
and its rounds (`events-SITE.jsonl`); bench/peers.py evaluates them.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import socket
import sys
import time
from pathlib import Path

from peer_site import SiteRecord


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--site", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--address", required=True, help="this site's address, where its peers reach it")
    p.add_argument("--out", required=True)
    p.add_argument("--sites", type=int, required=True)
    p.add_argument("--speed-factor", type=float, default=1.0)
    p.add_argument("--matchmaking-s", type=float, default=2.0)
    p.add_argument("--step-timeout-s", type=float, default=300.0)
    args = p.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)      # `kill -USR1` prints where a stuck site is

    import hivemind
    import torch

    from wantrain.config import RunConfig
    from wantrain.site.group import build_inner
    from wantrain.site.train import Segment

    cfg = RunConfig.from_json(Path(args.config).read_text())
    torch.set_num_threads(1)
    inner = build_inner(cfg, args.index, 0, torch.device("cpu"), args.site, args.speed_factor)
    params = [q for q in inner.model.parameters() if q.requires_grad]
    out = Path(args.out)
    record = SiteRecord(out, args.site)
    log = record.log

    with socket.socket() as probe:              # hivemind announces an explicit port, never 0
        probe.bind((args.address, 0))
        port = probe.getsockname()[1]
    listen = [f"/ip4/{args.address}/tcp/{port}"]
    peers_file = out / "dht-peers.txt"
    if args.index == 0:
        dht = hivemind.DHT(host_maddrs=listen, announce_maddrs=listen, start=True)
        tmp = out / ".dht-peers.txt"
        tmp.write_text("\n".join(str(a) for a in dht.get_visible_maddrs()))
        tmp.rename(peers_file)
    else:
        while not peers_file.exists():
            time.sleep(0.05)
        dht = hivemind.DHT(host_maddrs=listen, announce_maddrs=listen, start=True,
                           initial_peers=peers_file.read_text().split())
    averager = hivemind.DecentralizedAverager([torch.zeros_like(q) for q in params], dht, start=True,
                                              prefix="wantrain_diloco", target_group_size=args.sites,
                                              min_group_size=args.sites, min_matchmaking_time=args.matchmaking_s,
                                              request_timeout=0.75 * args.matchmaking_s)   # below it, as hivemind asks
    outer = torch.optim.SGD(params, lr=cfg.train.outer_lr, momentum=cfg.train.outer_momentum, nesterov=True)
    tokens_per_step = cfg.train.batch_size * cfg.model.block_size
    record.join_and_wait(args.sites)      # round 0 starts once every site is ready
    for r in range(cfg.train.rounds):
        log("round_start", round=r)
        start = [q.detach().clone() for q in params]
        seg = Segment(r, 0.0)
        inner.train(seg)
        own = [s - q.detach() for s, q in zip(start, params)]          # this site's pseudo-gradient
        with averager.get_tensors() as tensors:
            for t, g in zip(tensors, own):
                t.copy_(g)
        group = averager.step(timeout=args.step_timeout_s)
        committed = group is not None                # else no group formed: this site's own, alone
        with torch.no_grad(), averager.get_tensors() as tensors:
            for t, g, s, q in zip(tensors, own, start, params):
                q.copy_(s)                       # the outer step starts from the round's global model
                q.grad = t.clone() if committed else g
        outer.step()
        outer.zero_grad(set_to_none=True)
        log("site_round", round=r, steps=seg.steps, tokens=seg.steps * tokens_per_step, compute_s=seg.compute_s,
            committed=committed, participants=len(group) if group else 1, wire_bytes=0)
        if committed:
            record.save_committed(r, inner.model)
    log("leave")
    averager.shutdown()
    dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
