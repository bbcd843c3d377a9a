import numpy as np
import torch

from wantrain.outer import OuterNesterov, weighted_average


def test_weighted_average_by_tokens():
    d = {"a": {"w": np.array([1.0, 2.0], np.float32)}, "b": {"w": np.array([3.0, 6.0], np.float32)}}
    avg = weighted_average(d, {"a": 1.0, "b": 3.0})
    np.testing.assert_allclose(avg["w"], [2.5, 5.0])


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
