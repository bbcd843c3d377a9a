"""The docs stand alone: every relative link and every file they cite exists in this repository,
and nothing in it points outside (a user of the project has only the repository)."""

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")                       # [text](target)
# A cited file or folder in backticks: a path with a known suffix, or one that ends in a slash.
CITED = re.compile(r"`((?:\.{1,2}/)?[\w.-]+(?:/[\w.-]+)*(?:\.(?:py|md|toml|txt|json|ipynb|csv|proto|sh|cfg|yml)"
                   r"|/))(?:[:#][^`]*)?`")


def _texts() -> list[tuple[Path, str]]:
    """The docs, README.md and the notebooks' markdown cells."""
    out = [(p, p.read_text()) for p in sorted((ROOT / "docs").glob("*.md"))] + [(ROOT / "README.md",
                                                                                   (ROOT / "README.md").read_text())]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out.append((nb, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
    return out


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


# What a run or the tests write (ignored by git), named where the docs say where to look.
MADE_BY_RUNS = re.compile(r"(runs|test-output|[A-Z_]+)/")


def _exists(cited: str, where: Path, tracked: list[str]) -> bool:
    """A cited path exists: from the citing file's folder, from the root, or as the tail of a file or
    folder of the repository (the docs name modules by their place in a package: `ps/server.py`),
    or it is one that a run writes."""
    if MADE_BY_RUNS.match(cited):
        return True
    cited = cited.rstrip("/")
    for base in (where.parent, ROOT):
        p = (base / cited).resolve()
        if p.is_relative_to(ROOT) and p.exists():
            return True
    if cited.startswith(".."):
        return False
    return any(t == cited or t.endswith("/" + cited) or f"/{cited}/" in f"/{t}" for t in tracked)


def test_every_link_and_cited_file_in_the_docs_exists():
    tracked = _tracked()
    missing = []
    for path, text in _texts():
        for m in LINK.finditer(text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"[a-z]+:", target):
                continue                                     # an anchor, a web address
            if not _exists(target, path, tracked):
                missing.append(f"{path.relative_to(ROOT)}: link {m.group(1)}")
        for m in CITED.finditer(text):
            if not _exists(m.group(1), path, tracked):
                missing.append(f"{path.relative_to(ROOT)}: cites {m.group(1)}")
    assert not missing, "\n".join(missing)


def test_nothing_in_the_repository_points_outside_it():
    outside = re.compile(r"DESIGN\.md|\.\./shared|shared/loss_recovery|shared/codecs")
    found = []
    for name in _tracked():
        p = ROOT / name
        if p.suffix in (".png", ".whl", ".gz") or p == Path(__file__):
            continue
        try:
            text = p.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        found += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not found, "\n".join(found)
