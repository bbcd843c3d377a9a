"""The tutorials as committed: five of them, no outputs, sized through the documented switch.

(nbmake runs them: `notebooks` is in pytest's testpaths and `--nbmake` in its options.)
"""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ["00-what-is-diloco", "01-quickstart", "02-compression", "03-wan-traces", "04-faults", "05-heterogeneous-sites",
             "06-remote-sites"]


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
