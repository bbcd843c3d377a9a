"""torchft's side of bench/peers.py: its lighthouse, and a replica group per site running its DiLoCo.

Runs under the peers' own venv (`make peers`, `.venv-peers`), each site in its own network namespace
(the testbed's kernel-relay backend, as root): torchft's manager, its gloo process group and its
checkpoint server reach the other sites directly, at each site's address on its veth, and every
packet a site sends takes its link's delay, rate, loss and outages.

    python bench/peers_torchft.py lighthouse --min-replicas N --port-file F
    ip netns exec NS python bench/peers_torchft.py site --config CFG.json --site NAME --index K \\
        --lighthouse http://HOST:PORT --address SITE_IP --out DIR --sites N [--speed-factor F]

What is torchft's: the quorum (its lighthouse; a replica that stops heartbeating leaves it, one that
comes back joins and heals from a peer's checkpoint over HTTP), and the outer step
(`torchft.local_sgd.DiLoCo`): the pseudo-gradient allreduced in fp32 over gloo and averaged over
the quorum, then the outer optimizer, SGD with DiLoCo's learning rate and momentum, Nesterov, as
wantrain's. What is wantrain's, as in every arm: the model and its seed, each site's data shard and
batches, the inner AdamW steps and their schedule (wantrain.site.train.InnerLoop) and the speed of
each site's machine.

torchft's DiLoCo counts the steps of a torch optimizer (it hooks its step); wantrain's inner loop
steps its own AdamW, so a site takes a round's inner steps, then steps a stand-in optimizer once:
with sync_every=1, that step is the round's outer sync.

Each site writes, after each sync it committed, the global parameters and the time (`snap-R.pt`)
and its own rounds (`events-SITE.jsonl`): bench/peers.py evaluates the parameters with wantrain's
evaluator, off the sites' critical path, as a wantrain PS evaluates beside its rounds.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

from peer_site import SiteRecord


def _config(path: str):
    from wantrain.config import RunConfig

    return RunConfig.from_json(Path(path).read_text())


def lighthouse(args) -> int:
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=args.min_replicas, join_timeout_ms=args.join_timeout_ms)
    port = int(server.address().rsplit(":", 1)[1])
    Path(args.port_file).write_text(str(port))
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()


def site(args) -> int:
    # What torchft tells its peers to dial (its checkpoint server asks the host name): this
    # namespace's address, not the machine's name, which another namespace cannot reach.
    socket.gethostname = lambda: args.address
    faulthandler.register(signal.SIGUSR1)      # `kill -USR1` prints where a stuck site is

    import torch
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    from wantrain.site.group import build_inner
    from wantrain.site.train import Segment

    cfg = _config(args.config)
    torch.set_num_threads(1)
    inner = build_inner(cfg, args.index, 0, torch.device("cpu"), args.site, args.speed_factor)
    model = inner.model
    out = Path(args.out)
    record = SiteRecord(out, args.site)
    log = record.log

    class RoundMarker(torch.optim.Optimizer):
        """A step that changes nothing: DiLoCo's hooks on it run the round's outer sync."""

        def __init__(self, params) -> None:
            super().__init__(params, {})

        def step(self, closure=None):
            return None

    def state_dict() -> dict:
        return {"model": model.state_dict(), "inner_steps": inner.steps}

    def load_state_dict(state: dict) -> None:           # healing: a peer's state
        model.load_state_dict(state["model"])
        inner.steps = int(state["inner_steps"])

    store = TCPStore(args.address, 0, is_master=True, wait_for_workers=False)   # this replica group's
    timeout = timedelta(seconds=args.timeout_s)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, use_async_quorum=False,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=args.site,
                      store_addr=args.address, store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=args.lighthouse, hostname=args.address, port=0, timeout=timeout,
                      quorum_timeout=timedelta(seconds=args.quorum_timeout_s), connect_timeout=timeout,
                      init_sync=False)    # every site builds the same seeded model, as wantrain's sites download it
    outer = torch.optim.SGD(model.parameters(), lr=cfg.train.outer_lr, momentum=cfg.train.outer_momentum,
                            nesterov=True)
    marker = RoundMarker(model.parameters())
    tokens_per_step = cfg.train.batch_size * cfg.model.block_size
    record.join_and_wait(args.sites)      # round 0 starts once every site is ready
    # Bucketized: one allreduce for the whole pseudo-gradient. Unbucketized, each tensor is an allreduce
    # of its own, a few round trips each: 45 s rounds on three-sites, for 2-3 s of compute.
    with DiLoCo(manager, [model], marker, outer, sync_every=1, backup_device=torch.device("cpu"),
                use_bucketization=True):
        while (r := manager.current_step()) < cfg.train.rounds:
            log("round_start", round=r)
            seg = Segment(r, 0.0)
            inner.train(seg)
            marker.step()                                  # the outer sync: quorum, allreduce, commit
            committed = manager.current_step() > r
            log("site_round", round=r, steps=seg.steps, tokens=seg.steps * tokens_per_step,
                compute_s=seg.compute_s, committed=committed, participants=manager.num_participants(),
                wire_bytes=0)                              # bench/peers.py reads bytes off the links
            if committed:
                record.save_committed(r, model)
    log("leave")
    manager.shutdown(wait=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    lh = sub.add_parser("lighthouse")
    lh.add_argument("--min-replicas", type=int, required=True)
    lh.add_argument("--join-timeout-ms", type=int, default=60_000,
                    help="how long a quorum waits for a replica that has not joined (the first: for all)")
    lh.add_argument("--port-file", required=True)
    s = sub.add_parser("site")
    s.add_argument("--config", required=True)
    s.add_argument("--site", required=True)
    s.add_argument("--index", type=int, required=True)
    s.add_argument("--lighthouse", required=True, help="http://HOST:PORT, as the site's namespace reaches it")
    s.add_argument("--address", required=True, help="this site's address, where its peers reach it")
    s.add_argument("--out", required=True)
    s.add_argument("--sites", type=int, required=True, help="how many sites round 0 waits for")
    s.add_argument("--speed-factor", type=float, default=1.0)
    s.add_argument("--timeout-s", type=float, default=120.0)
    s.add_argument("--quorum-timeout-s", type=float, default=600.0)
    args = p.parse_args(argv)
    return lighthouse(args) if args.role == "lighthouse" else site(args)


if __name__ == "__main__":
    sys.exit(main())
