"""The reduced soak: random site kills and one PS kill; final loss within 2 % of fault-free."""

import pytest

from .soak import soak


@pytest.mark.timeout(600)
def test_reduced_soak(tmp_path):
    result = soak(rounds=8, site_kills=2, seed=0, root=tmp_path)
    print(f"\nfault-free {result['clean']['val_loss']:.4f}, faulty {result['faulty']['val_loss']:.4f}, "
          f"gap {100 * result['relative_gap']:.2f} %, faults {result['faulty']['faults']}")
    assert result["faulty"]["ps_restarts"] == 1 and len(result["faulty"]["faults"]) == 3
    assert result["relative_gap"] <= 0.02
