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


def test_only_wire_and_net_import_the_generated_code():
    for p in sources():
        if p.relative_to(PKG).as_posix() not in ("wire.py", "net.py"):
            assert not re.search(r"(from|import)\s+(\.|wantrain\.)proto\b", p.read_text()), p


def test_public_surface_resolves():
    for name in wantrain.__all__:
        assert getattr(wantrain, name) is not None


def test_the_conformance_site_needs_nothing_of_wantrain_but_the_generated_stubs():
    """tests/conformance implements a site from docs/protocol.md alone (issue 10)."""
    for p in (Path(__file__).parent / "conformance").glob("*.py"):
        for m in re.finditer(r"^\s*(?:from|import)\s+(wantrain[\w.]*)", p.read_text(), re.M):
            assert m.group(1).startswith("wantrain.proto"), (p.name, m.group(1))


# ------------------------------------------------------------------ docs/architecture.md's layers

ROOT = PKG.parent
ARCH = (ROOT / "docs" / "architecture.md").read_text()


def layers() -> dict[str, int]:
    block = re.search(r"```layers\n(.*?)```", ARCH, re.S).group(1)
    out = {}
    for line in block.strip().splitlines():
        number, _, rest = line.partition(" ")
        for module in rest.partition(":")[2].split():
            out[module] = int(number)
    return out


def wantrain_imports(path: Path) -> set[str]:
    """The top-level wantrain modules a file imports (relative or absolute)."""
    import ast
    rel = path.relative_to(PKG).parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(rel[:-1])[:len(rel) - node.level]
            target = base + (node.module.split(".") if node.module else [])
            out |= {target[0]} if target else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wantrain."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("wantrain.")}
    return out


def top_module(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("").parts
    return rel[0]


def test_every_module_has_a_layer_and_imports_point_down():
    layer = layers()
    for p in sources():
        mine = top_module(p)
        assert mine in layer, f"{mine} is in no layer of docs/architecture.md"
        for dep in wantrain_imports(p) - {mine, "proto"}:
            assert dep in layer, (p, dep)
            assert layer[dep] <= layer[mine], f"{p.relative_to(ROOT)} imports {dep} (layer {layer[dep]} > {layer[mine]})"


def test_the_roles_meet_only_on_the_wire_and_the_leaves_stay_leaves():
    for p in sources():
        mine, deps = top_module(p), wantrain_imports(p)
        if mine == "ps":
            assert "site" not in deps, p
        if mine == "site":
            assert "ps" not in deps, p
        if mine in ("plan", "presets", "errors"):
            assert deps <= {"plan", "presets", "errors", mine}, (p, deps)


def test_testbed_imports_only_the_plan_of_wantrain():
    for p in (ROOT / "testbed").rglob("*.py"):
        for m in re.finditer(r"^\s*(?:from|import)\s+(wantrain[\w.]*)", p.read_text(), re.M):
            assert m.group(1) == "wantrain.plan", (p.name, m.group(1))


def test_a_config_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, wantrain; wantrain.RunConfig(); import wantrain.plan; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_the_panel_and_the_command_line_load_neither_torch_nor_numba():
    """A notebook kernel that drives runs, and `wantrain` itself, hold no model and code no delta:
    torch (about 150 MB a process) and numba (about 30 MB) are for the PS and the sites."""
    import subprocess
    import sys
    code = ("import sys, wantrain.ui, wantrain.cli, wantrain.wire; "
            "print(sorted(m for m in ('torch', 'numba') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", (r.stdout, r.stderr)


def test_no_module_is_longer_than_400_lines():
    """A file past about 400 lines is a smell to look at (DEVELOPERS.md): split it along a seam, a
    second reason to change, never to get under the count."""
    long = {str(p.relative_to(ROOT)): n for p in sources() if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
