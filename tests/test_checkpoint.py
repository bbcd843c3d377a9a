import numpy as np
import pytest

from wantrain.checkpoint import load_checkpoint, save_checkpoint


def test_round_trip_and_atomic_replace(tmp_path):
    p = tmp_path / "checkpoint.pt"
    assert load_checkpoint(p) is None
    state = {"round": 3, "params_np": {"w": np.arange(5, dtype=np.float32)}, "registry": {"a": 0}}
    save_checkpoint(p, state)
    (tmp_path / "checkpoint.pt.tmp").write_bytes(b"torn write of a later checkpoint")   # a kill mid-write
    back = load_checkpoint(p)
    assert back["round"] == 3 and back["registry"] == {"a": 0}
    assert np.array_equal(back["params_np"]["w"], state["params_np"]["w"])
    save_checkpoint(p, {**state, "round": 4})
    assert load_checkpoint(p)["round"] == 4 and not (tmp_path / "checkpoint.pt.tmp").exists()


def test_foreign_file_is_refused(tmp_path):
    import torch
    p = tmp_path / "checkpoint.pt"
    torch.save({"version": 99}, p)
    with pytest.raises(ValueError, match="checkpoint version 99"):
        load_checkpoint(p)
