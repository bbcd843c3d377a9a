import numpy as np
import torch

import pytest

from wantrain.outer.aggregate import weighted_mean
from wantrain.errors import WantrainError
from wantrain.outer.nesterov import OuterNesterov


def test_weighted_mean_by_tokens():
    avg = weighted_mean([np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32)], [1.0, 3.0])
    np.testing.assert_allclose(avg, [2.5, 5.0])
    with pytest.raises(WantrainError, match="no weight"):
        weighted_mean([np.ones(2, np.float32)], [0.0])


def test_nesterov_matches_torch_sgd():
    rng = np.random.default_rng(0)
    p = torch.zeros(50)
    p.requires_grad_(True)
    sgd = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    ours = OuterNesterov(0.7, 0.9)
    mine = np.zeros(50, np.float32)
    for _ in range(6):
        g = rng.standard_normal(50).astype(np.float32)
        p.grad = torch.from_numpy(g.copy())
        sgd.step()
        mine += ours.update({"w": g})["w"]
    np.testing.assert_allclose(mine, p.detach().numpy(), rtol=1e-5, atol=1e-5)
