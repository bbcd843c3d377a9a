import os

import pytest

# Child processes (PS, sites) are started with this interpreter and must find the package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _seed():
    import numpy as np
    import torch

    np.random.seed(0)
    torch.manual_seed(0)
    yield
