"""Conventions from DESIGN.md that a grep can check."""

import re
from pathlib import Path

import wantrain

PKG = Path(wantrain.__file__).parent


def sources():
    return [p for p in PKG.rglob("*.py") if "proto" not in p.relative_to(PKG).parts]


def test_wantrain_never_imports_testbed():
    for p in sources():
        assert not re.search(r"^\s*(from|import)\s+testbed\b", p.read_text(), re.M), p


def test_only_wire_imports_the_generated_code():
    for p in sources():
        if p.name != "wire.py":
            assert not re.search(r"(from|import)\s+(\.|wantrain\.)proto\b", p.read_text()), p


def test_public_surface_resolves():
    for name in wantrain.__all__:
        assert getattr(wantrain, name) is not None


def test_the_conformance_site_needs_nothing_of_wantrain_but_the_generated_stubs():
    """tests/conformance implements a site from docs/protocol.md alone (issue 10)."""
    for p in (Path(__file__).parent / "conformance").glob("*.py"):
        for m in re.finditer(r"^\s*(?:from|import)\s+(wantrain[\w.]*)", p.read_text(), re.M):
            assert m.group(1).startswith("wantrain.proto"), (p.name, m.group(1))
