"""Flower's side of bench/peers.py: its server with FedAvgM, and a client that trains wantrain's inner loop.

Runs under the peers' own venv (`make peers`, `.venv-peers`): flwr pins `packaging < 26`, which the
project's venv does not allow, so Flower never shares a process with wantrain's PS or sites.

    python bench/peers_flower.py server --config CFG.json --port PORT --events EVENTS.jsonl
    python bench/peers_flower.py client --config CFG.json --site NAME --index K --server HOST:PORT [--speed-factor F]

What is the same as a wantrain run of CFG: the model and its seed, each site's data shard and batches,
the speed of each site's machine (the scenario's speed factor), the inner AdamW steps and their
learning-rate schedule (wantrain.site.train.InnerLoop, whose optimizer state a client keeps from round
to round as a wantrain site does), the validation batches and how the loss is computed
(wantrain.ps.model.GlobalModel). What is Flower's: the transport (its gRPC stream,
the parameters sent whole as fp32 arrays each way), the rounds (a round waits for every client), and
the outer step, FedAvgM: momentum v = m v + g, then w -= lr v with the server learning rate and
momentum set to DiLoCo's outer lr and momentum; DiLoCo's outer step is Nesterov (w -= lr (g + m v)).

The server writes the events bench/peers.py reads with wantrain's own readers
(wantrain.telemetry.compare.time_to_target): `round_start` once every client of a round has been
asked, `site_round` per client result, `round_end` with the validation loss after each
aggregation. Bytes are not counted here: bench/peers.py reads them off the links.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _config(path: str):
    from wantrain.config import RunConfig

    return RunConfig.from_json(Path(path).read_text())


def serve(args) -> int:
    import flwr
    from flwr.common import ndarrays_to_parameters
    from flwr.server.strategy import FedAvgM

    from wantrain.data import load_run_data
    from wantrain.ps.model import GlobalModel

    cfg = _config(args.config)
    tok, corpus = load_run_data(cfg.data)
    model = GlobalModel(cfg, tok.vocab_size, corpus.val)
    names = list(model.views)
    out = open(args.events, "a", buffering=1)

    def log(kind: str, **fields) -> None:
        out.write(json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n")

    def evaluate(server_round: int, arrays, _config) -> tuple[float, dict]:
        for name, a in zip(names, arrays):
            model.views[name][...] = a.reshape(model.views[name].shape)
        loss = model.evaluate()
        if server_round > 0:            # 0: the initial model, before any client was asked
            log("round_end", round=server_round - 1, val_loss=loss, sites=sorted(asked), wire_bytes=0)
        return loss, {}

    asked: set[str] = set()

    class Logged(FedAvgM):
        def configure_fit(self, server_round, parameters, client_manager):
            chosen = super().configure_fit(server_round, parameters, client_manager)   # waits for the clients
            log("round_start", round=server_round - 1)
            return chosen

        def aggregate_fit(self, server_round, results, failures):
            asked.clear()
            for _, res in results:
                m = res.metrics
                asked.add(str(m["site"]))
                log("site_round", round=server_round - 1, site=m["site"], steps=int(m["steps"]),
                    tokens=int(m["tokens"]), compute_s=float(m["compute_s"]), wire_bytes=0)
            for f in failures:
                log("client_failure", round=server_round - 1, error=repr(f)[:300])
            return super().aggregate_fit(server_round, results, failures)

    n = cfg.num_sites
    strategy = Logged(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n, min_evaluate_clients=0,
                      min_available_clients=n, evaluate_fn=evaluate,
                      on_fit_config_fn=lambda r: {"round": r - 1},
                      initial_parameters=ndarrays_to_parameters([model.views[k].copy() for k in names]),
                      server_learning_rate=cfg.train.outer_lr, server_momentum=cfg.train.outer_momentum,
                      accept_failures=False)
    flwr.server.start_server(server_address=f"127.0.0.1:{args.port}",
                             config=flwr.server.ServerConfig(num_rounds=cfg.train.rounds), strategy=strategy)
    log("run_end")
    return 0


def client(args) -> int:
    import flwr
    import torch

    from wantrain.models.params import flat_copy, load_flat
    from wantrain.site.group import build_inner
    from wantrain.site.train import Segment

    cfg = _config(args.config)
    torch.set_num_threads(1)
    inner = build_inner(cfg, args.index, 0, torch.device("cpu"), args.site, args.speed_factor)
    names = list(flat_copy(inner.model))
    tokens_per_step = cfg.train.batch_size * cfg.model.block_size

    class Site(flwr.client.NumPyClient):
        def get_parameters(self, config):
            return list(flat_copy(inner.model).values())

        def fit(self, parameters, config):
            load_flat(inner.model, dict(zip(names, parameters)))
            seg = Segment(int(config["round"]), 0.0)
            inner.train(seg)
            end = flat_copy(inner.model)
            tokens = seg.steps * tokens_per_step
            return [end[k] for k in names], tokens, {"site": args.site, "steps": seg.steps, "tokens": tokens,
                                                     "compute_s": seg.compute_s}

    flwr.client.start_client(server_address=args.server, client=Site().to_client(), insecure=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--config", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--events", required=True)
    c = sub.add_parser("client")
    c.add_argument("--config", required=True)
    c.add_argument("--site", required=True)
    c.add_argument("--index", type=int, required=True)
    c.add_argument("--server", required=True)
    c.add_argument("--speed-factor", type=float, default=1.0,
                   help="the scenario's: pad each inner step to act like a machine this many times slower")
    args = p.parse_args(argv)
    return serve(args) if args.role == "server" else client(args)


if __name__ == "__main__":
    sys.exit(main())
