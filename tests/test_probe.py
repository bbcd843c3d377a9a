"""The sensitivity probe (site/probe.py): how much each role's part of a real round's delta
matters on a held-out batch, the role weights it gives a manifest's importance, and where a site's
schedule runs it (while the model holds where the round ended, before any step ahead)."""

import asyncio

import numpy as np
import pytest
import torch

from wantrain.codec import EncodeStats
from wantrain.data import BatchSampler, eval_batches, load_run_data
from wantrain.models import build_model
from wantrain.transport.manifest import DEFAULT_ROLE_WEIGHTS
from wantrain.transport.roles import roles_of
from wantrain.site.probe import role_energy, role_sensitivity, role_weights
from wantrain.models.params import flat_copy, named_params
from wantrain.site.replica import Replica
from wantrain.site.schedule import Schedule
from wantrain.site.train import InnerLoop
from wantrain.site.uplink import Uplink

from .helpers import small_config

pytestmark = pytest.mark.timeout(120)


def _setup(overlap=False):
    cfg = small_config(**{"train.inner_steps": 12})
    torch.manual_seed(0)
    tok, corpus = load_run_data(cfg.data)
    model = build_model(cfg.model.preset, tok.vocab_size, cfg.model.seed, torch.device("cpu"))
    sampler = BatchSampler(corpus.shard(0, 1), cfg.train.batch_size, cfg.model.block_size, 0)
    loop = InnerLoop(model, sampler, cfg.train, cfg.model.block_size, torch.device("cpu"))
    loop.held_out = eval_batches(corpus.val, cfg.train.batch_size, cfg.model.block_size, 1)
    roles = roles_of({k: tuple(p.shape) for k, p in named_params(model).items()})
    return cfg, loop, roles, Schedule(loop, overlap=overlap, budget_s=0.0)


def test_the_probe_measures_each_role_of_a_real_delta_and_puts_the_model_back():
    cfg, loop, roles, sched = _setup()
    held = Replica()
    held.build(loop.model, 1, 4096)
    start = held.arrays
    seen = {}

    def probe(end, delta):
        seen["before"], seen["end"] = flat_copy(loop.model), end
        sens = role_sensitivity(loop.model, end, delta, roles, loop.held_out)
        seen["after"] = flat_copy(loop.model)
        zeroed = role_sensitivity(loop.model, end, {k: np.zeros_like(v) for k, v in delta.items()}, roles,
                                  loop.held_out)
        return sens, zeroed

    delta, info = asyncio.run(sched.round(0, 0.0, held, probe=probe))
    sens, zeroed = info["probe"]
    assert set(sens) == set(roles.values()) and all(np.isfinite(v) and v >= 0 for v in sens.values())
    assert sum(sens.values()) > 0                       # undoing a round's change costs the held-out loss
    assert all(v == 0.0 for v in zeroed.values())        # nothing undone: exactly the loss at the end
    for k in start:                                      # the model holds where the round ended, bit for bit
        np.testing.assert_array_equal(seen["after"][k], seen["before"][k])
        np.testing.assert_array_equal(seen["before"][k], seen["end"][k])


def test_role_weights_give_each_role_its_share_of_the_sensitivity():
    energy = {"critical": 0.01, "embedding": 0.2, "attention": 0.3, "mlp": 0.49}
    sens = {"critical": 0.04, "embedding": 0.01, "attention": 0.03, "mlp": 0.02}
    w = role_weights(sens, energy)
    share = {r: energy[r] * w[r] for r in energy}
    assert sum(share.values()) == pytest.approx(1.0)                       # an energy-weighted mean of 1
    assert sorted(share, key=share.get) == sorted(sens, key=sens.get)      # shares follow sensitivity
    assert share["critical"] > 0.3 and w["critical"] > 30 * w["mlp"]       # little energy, much effect
    assert w["other"] == DEFAULT_ROLE_WEIGHTS["other"]                      # a role the delta lacks
    assert min(share.values()) > 0.1 * 0.25 / 1.1 - 1e-9                   # smoothed: none drops to nothing
    assert role_weights({}, energy) == DEFAULT_ROLE_WEIGHTS                 # no signal: energy alone
    assert role_energy({"a": np.array([3.0, 4.0]), "b": np.zeros(2)}, {"a": "mlp", "b": "critical"}) == \
        {"mlp": 1.0, "critical": 0.0}


def test_a_site_s_manifest_weighs_roles_as_its_probes_say():
    cfg, loop, roles, _ = _setup()
    up = Uplink("a", cfg, roles)
    rng = np.random.default_rng(0)
    delta = {k: rng.standard_normal(v.size).astype(np.float32) * 1e-3 for k, v in flat_copy(loop.model).items()}
    energy = role_energy(delta, roles)
    sens = {r: (1.0 if r == "critical" else 0.01) for r in energy}
    up.calibrate(sens, delta)
    target = role_weights(sens, energy)
    assert up.role_weights["critical"] == pytest.approx(0.5 * (1 + target["critical"]))   # halfway there
    _, _, manifest, _ = up._encode(0, delta, {"tokens": 64, "steps": 1}, EncodeStats(), protects=False)
    critical = sum(c.importance for c in manifest.chunks if c.role == "critical")
    assert critical > 2 * energy["critical"]            # its share of the importance grew past its energy's
