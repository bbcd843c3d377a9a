"""What the commit check (robust.check, wantrain/outer/checking.py) costs the PS, per model size, as a
share of a round.

For each preset, a PS's global model (ps/model.py) commits a round of two sites' deltas (random,
at an honest delta's scale, int8-Huffman as they arrive) twice in one process: unchecked (one
aggregate, encode and apply) and checked as a two-site run does by default (the update without
each delta and with both, each evaluated on the check batches; the state saved and restored in
between). The round it is a share of: the run's inner steps at one site on this machine (two
steps timed, times train.inner_steps) plus the unchecked commit and its validation pass. Also
each part alone: one forward pass over the check batches, one apply, a save and a restore of the
PS's state, and the memory the saved state takes (parameters, outer momentum and the update's
error feedback, as float32).

    python bench/check_cost.py [--presets tiny,gpt2] [--large]

`--large` adds llama3-1b (minutes, and about 20 GB of memory: the model, its saved copy, the
outer momentum and the residual). Where the PS cannot afford a check every round,
robust.check_every K checks one round in K (the cost divides by K; the rounds between commit
unchecked, and a bad delta in them is only seen by the next check's own deltas).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_to


def timed(fn, repeat: int = 1) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(preset: str) -> dict:
    import torch

    from wantrain.outer.aggregate import Contribution
    from wantrain.outer.checking import Checkable, CommitCheck
    from wantrain.codec import Codec, EncodeStats, encode_arrays
    from wantrain.config import RunConfig
    from wantrain.data import load_run_data
    from wantrain.ps.model import GlobalModel
    from wantrain.site.group import build_inner
    from wantrain.site.train import Segment

    cfg = RunConfig().replace(num_sites=2, **{"model.preset": preset})
    tok, corpus = load_run_data(cfg.data)
    model = GlobalModel(cfg, tok.vocab_size, corpus.val)
    n = model.num_params
    print(f"{preset}: {n / 1e6:.1f} M parameters; encoding two deltas", flush=True)
    rng = np.random.default_rng(0)
    scale = cfg.train.inner_lr * 3           # about what a round of AdamW steps moves an element by
    parts = {}
    for site in ("a", "b"):
        delta = {k: (rng.standard_normal(v) * scale).astype(np.float32) for k, v in model.shapes.items()}
        chunks, _ = encode_arrays(delta, Codec(cfg.codec), None, EncodeStats())
        parts[site] = Contribution(Codec.extract_many([e for _, e in chunks]), 1000.0)
        del delta, chunks

    def apply(kept: frozenset[str]):
        return model.apply(0, {k: parts[k] for k in kept})

    apply(frozenset("ab"))                  # one round in: the outer momentum and residual exist
    base = model.state_dict()
    saved_bytes = sum(v.nbytes for group in base.values() for v in group.values())
    forward_s = timed(model.check_loss, 3)
    val_s = timed(model.evaluate)
    save_s = timed(model.state_dict)
    load_s = timed(lambda: model.load_state_dict(base))

    def unchecked() -> None:
        model.load_state_dict(base)
        t0 = time.perf_counter()
        apply(frozenset("ab"))
        model.evaluate()
        times["unchecked"].append(time.perf_counter() - t0)

    def checked() -> None:
        model.load_state_dict(base)
        check = CommitCheck(cfg.robust, cfg.num_sites)
        check.base = base_loss              # as in a run: the current model's, taken at the last commit
        t0 = time.perf_counter()
        check.run(1, parts, Checkable(apply, model.check_loss, model.state_dict, model.load_state_dict))
        model.evaluate()
        times["checked"].append(time.perf_counter() - t0)

    base_loss = model.check_loss()
    times: dict[str, list[float]] = {"unchecked": [], "checked": []}
    for _ in range(3 if n < 5e8 else 1):
        unchecked()
        checked()
    apply_s = max(0.0, timed(lambda: (model.load_state_dict(base), apply(frozenset("ab"))), 3) - load_s)
    unchecked_s, checked_s = statistics.median(times["unchecked"]), statistics.median(times["checked"])
    print(f"{preset}: timing two inner steps at a site", flush=True)
    torch.set_num_threads(torch.get_num_threads())
    site_cfg = cfg.replace(**{"train.inner_steps": 2})
    inner = build_inner(site_cfg, 0, 0, torch.device("cpu"), "a")
    inner.train(Segment(0, 0.0))                # warm up
    step_s = timed(lambda: inner.train(Segment(1, 0.0))) / 2
    round_s = step_s * cfg.train.inner_steps + unchecked_s
    extra_s = checked_s - unchecked_s
    return {"preset": preset, "params": n, "check_batches": cfg.robust.check_batches,
            "batch": [cfg.train.batch_size, cfg.model.block_size], "forward_s": forward_s, "val_s": val_s,
            "apply_s": apply_s, "save_s": save_s, "load_s": load_s, "saved_gb": saved_bytes / 1e9,
            "unchecked_commit_s": unchecked_s, "checked_commit_s": checked_s, "check_extra_s": extra_s,
            "site_step_s": step_s, "inner_steps": cfg.train.inner_steps, "round_s": round_s,
            "share_of_round": extra_s / round_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="tiny,gpt2")
    p.add_argument("--large", action="store_true", help="also llama3-1b (minutes, ~20 GB)")
    p.add_argument("--out", default="check_cost", help="result name under bench/results, or a path ending in .json")
    args = p.parse_args()
    presets = args.presets.split(",") + (["llama3-1b"] if args.large else [])
    rows = [measure(x) for x in presets]
    print(f"{'preset':<10} {'params':>8} {'forward':>8} {'apply':>8} {'save+load':>9} {'saved':>7} "
          f"{'commit':>8} {'checked':>8} {'round':>9} {'share':>7}")
    for r in rows:
        print(f"{r['preset']:<10} {r['params'] / 1e6:>7.1f}M {r['forward_s']:>7.2f}s {r['apply_s']:>7.2f}s "
              f"{r['save_s'] + r['load_s']:>8.2f}s {r['saved_gb']:>6.2f}G {r['unchecked_commit_s']:>7.2f}s "
              f"{r['checked_commit_s']:>7.2f}s {r['round_s']:>8.1f}s {r['share_of_round']:>6.1%}")
    save_to(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
