"""The tutorials as committed: nine of them, no outputs, sized through the documented switch.

(nbmake runs them: `notebooks` is in pytest's testpaths and `--nbmake` in its options.)
"""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ["00-what-is-diloco", "01-quickstart", "02-compression", "03-wan-traces", "04-faults", "05-heterogeneous-sites",
             "06-remote-sites", "07-loss-recovery", "08-wan-aware"]


def committed_notebooks() -> list[Path]:
    """Every notebook git tracks anywhere, and every one in notebooks/ (committed next)."""
    r = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True)
    tracked = {ROOT / p for p in r.stdout.split()} if r.returncode == 0 else set()
    return sorted(tracked | set((ROOT / "notebooks").glob("*.ipynb")))


def outputs_of(nb: dict) -> list[str]:
    """Where a notebook carries state from a run: outputs, execution counts, saved widget state."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell.get("outputs"):
            found.append(f"cell {i} has {len(cell['outputs'])} outputs")
        if cell.get("execution_count") is not None:
            found.append(f"cell {i} has execution_count {cell['execution_count']}")
    if "widgets" in nb.get("metadata", {}):
        found.append("notebook metadata holds saved widget state")
    return found


def test_the_tutorials_are_there():
    names = [p.stem for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    assert names == TUTORIALS


@pytest.mark.parametrize("path", committed_notebooks(), ids=lambda p: p.name)
def test_committed_notebook_has_no_outputs(path):
    found = outputs_of(json.loads(path.read_text()))
    assert not found, f"{path.relative_to(ROOT)}: {'; '.join(found)} (run `make strip-notebooks`)"


def test_the_outputs_check_catches_outputs():
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "stream"}], "execution_count": 3}],
          "metadata": {"widgets": {}}}
    assert len(outputs_of(nb)) == 3


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorial_sizes_go_through_the_switch(name):
    """Sizes come from `sized(full, quick)`, so CI (WANTRAIN_QUICK=1) runs the same cells."""
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "sized(" in code and "WANTRAIN_QUICK" in "".join("".join(c["source"]) for c in nb["cells"])


@pytest.mark.parametrize("quick", ["1", "0"])
def test_a_panel_without_a_config_trains_a_smaller_model_on_smaller_batches_only_in_quick_mode(monkeypatch, quick):
    from wantrain.config import RunConfig
    from wantrain.ui.sizes import QUICK_ENV, panel_config

    monkeypatch.setenv(QUICK_ENV, quick)
    cfg, default = panel_config(), RunConfig()
    sizes = (default.train.batch_size, default.model.block_size, default.model.preset)
    assert (cfg.train.batch_size, cfg.model.block_size, cfg.model.preset) == (
        (4, 64, "micro") if quick == "1" else sizes)
    assert cfg.replace(**{"train.batch_size": sizes[0], "model.block_size": sizes[1],
                          "model.preset": sizes[2]}) == default   # nothing else


def test_the_claims_check_catches_a_count_the_run_does_not_support():
    """tests/claims.py recounts what 04 prints from the run's log: a line that says more than the log
    (one hash check too many, a fault round timed from its restart, not its first start) fails."""
    from tests.claims import check_04

    def ev(kind, t, **f):
        return {"kind": kind, "t": t, **f}
    events = [ev("round_start", 0.0, round=0), ev("round_end", 2.0, round=0), ev("round_start", 2.0, round=1),
              ev("fault", 2.5, action="restart PS"), ev("round_start", 5.0, round=1), ev("round_end", 7.0, round=1),
              ev("ready", 5.5, since_join_s=1.2), ev("hash_check", 7.1, ok=True), ev("round_start", 7.0, round=2),
              ev("round_end", 9.0, round=2)]
    true = ("rounds committed: [0, 1, 2]\nreplica hash checks: 1, mismatches: 0\n"
            "a round no fault touched took 2.0 s from its start to its commit (median of 1)\n"
            "round 1, with a fault (restart PS), took 5.0 s from its first start to its commit\n"
            "the killed site had the model again 1.2 s after it rejoined; ...\n")
    check_04(true, events)
    for wrong in (true.replace("checks: 1", "checks: 2"), true.replace("took 5.0 s", "took 2.0 s"),
                  true.replace("(median of 1)", "(median of 2)")):
        with pytest.raises(AssertionError):
            check_04(wrong, events)
