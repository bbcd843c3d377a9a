import os

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run, so that a red CI run can be replayed;
# HYPOTHESIS_PROFILE=explore searches afresh (add what it finds as an @example).
settings.register_profile("seeded", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))

# Child processes (PS, sites) are started with this interpreter and must find the package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _seed():
    import numpy as np
    import torch

    np.random.seed(0)
    torch.manual_seed(0)
    yield


_LEAKED: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _reap_leftover_processes():
    """After each module: kill whatever processes its tests left running (see tests/reaper.py)."""
    yield
    from .reaper import reap
    _LEAKED.extend(reap())


def pytest_terminal_summary(terminalreporter):
    from .reaper import reap
    _LEAKED.extend(reap(grace_s=1.0))
    if _LEAKED:
        terminalreporter.section("processes left running by tests (killed)")
        for line in _LEAKED:
            terminalreporter.write_line(line)
