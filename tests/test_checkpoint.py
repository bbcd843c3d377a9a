import numpy as np
import pytest

from wantrain.ps.checkpoint import load_checkpoint, save_checkpoint
from wantrain.launch.argv import ps_args


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


def test_the_ps_says_in_one_line_that_it_cannot_use_a_checkpoint(tmp_path):
    """A checkpoint of another version used to end `wantrain ps` with a traceback."""
    import torch

    from .helpers import free_port, small_config, wantrain

    (tmp_path / "run").mkdir()
    torch.save({"version": 99}, tmp_path / "run" / "checkpoint.pt")
    (tmp_path / "c.json").write_text(small_config().to_json())
    r = wantrain(*ps_args(tmp_path / "c.json", port=free_port()), "--run-dir",
                 str(tmp_path / "run"), timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("wantrain ps:") and "checkpoint version 99" in last, r.stderr


def test_a_run_folder_refuses_to_resume_under_another_config(tmp_path):
    """The run's config is the run's: `wantrain ps` given a different one refuses, in one line."""
    from wantrain.ps import ParameterServer

    from .helpers import small_config, wantrain

    ParameterServer(small_config(**{"train.rounds": 6}), run_dir=tmp_path / "run")   # its first checkpoint
    (tmp_path / "c2.json").write_text(small_config(**{"train.rounds": 7}).to_json())
    r = wantrain(*ps_args(tmp_path / "c2.json", port=0, run_dir=tmp_path / "run"), timeout=120)
    assert r.returncode == 2 and "different config" in r.stderr, r.stderr
