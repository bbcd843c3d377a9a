"""Conventions of docs/architecture.md that a grep can check."""

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
        if p.relative_to(PKG).as_posix() not in ("transport/wire.py", "transport/net.py"):
            assert not re.search(r"(from|import)\s+(\.|wantrain\.transport\.)proto\b", p.read_text()), p


def test_public_surface_resolves():
    for name in wantrain.__all__:
        assert getattr(wantrain, name) is not None


def test_the_conformance_site_needs_nothing_of_wantrain_but_the_generated_stubs():
    """tests/conformance implements a site from docs/protocol.md alone (issue 10)."""
    for p in (Path(__file__).parent / "conformance").glob("*.py"):
        for m in re.finditer(r"^\s*(?:from|import)\s+(wantrain[\w.]*)", p.read_text(), re.M):
            assert m.group(1).startswith("wantrain.transport.proto"), (p.name, m.group(1))


# ------------------------------------------------------------------ docs/architecture.md's layers

ROOT = PKG.parent
ARCH = (ROOT / "docs" / "architecture.md").read_text()


def layers() -> dict[str, int]:
    """The `layers` block: a key is a module or a package (dotted, under wantrain), and covers the
    modules under it that no longer key names."""
    block = re.search(r"```layers\n(.*?)```", ARCH, re.S).group(1)
    out = {}
    for line in block.strip().splitlines():
        number, _, rest = line.partition(" ")
        for module in rest.partition(":")[2].split():
            out[module] = int(number)
    return out


def key_of(module: str, keys) -> str | None:
    """The layer key of a dotted wantrain module: itself, or the nearest package above it that has one."""
    parts = module.split(".")[1:] or ["__init__"]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in keys:
            return ".".join(parts[:n])
    return None


def keyed_graph() -> dict[str, set[str]]:
    """module_graph collapsed onto the layer keys: which key imports which."""
    keys = layers()
    out: dict[str, set[str]] = {}
    for module, deps in module_graph().items():
        mine = key_of(module, keys)
        assert mine is not None, f"{module} is in no layer of docs/architecture.md"
        out.setdefault(mine, set()).update(k for d in deps if (k := key_of(d, keys)) not in (None, mine))
    return out


def test_every_module_has_a_layer_and_imports_point_down():
    layer = layers()
    for mine, deps in keyed_graph().items():
        for dep in deps:
            assert layer[dep] <= layer[mine], f"{mine} (layer {layer[mine]}) imports {dep} (layer {layer[dep]})"


def test_no_circle_between_the_units_of_the_layers():
    """A package-level loop (messages.py importing recovery/'s manifest while recovery/ imported
    messages) is a circle of concepts even where no two modules import each other."""
    graph = keyed_graph()
    assert not circles(graph), circles(graph)


def test_the_roles_meet_only_on_the_wire_and_the_leaves_stay_leaves():
    leaves = {"launch.plan", "config.presets", "errors"}
    for mine, deps in keyed_graph().items():
        if mine == "ps":
            assert "site" not in deps, deps
        if mine == "site":
            assert "ps" not in deps, deps
        if mine in leaves:
            assert deps <= leaves, (mine, deps)


def test_the_top_level_shows_the_rooms_at_a_glance():
    """wantrain/ holds its rooms (packages) and a few modules every room uses: at most about 15
    entries besides __init__.py, __main__.py and py.typed."""
    entries = sorted(p.name for p in PKG.iterdir() if p.name not in ("__init__.py", "__main__.py", "py.typed",
                                                                     "__pycache__"))
    assert len(entries) <= 15, entries


def test_architecture_names_every_module():
    """docs/architecture.md's concept table names every module, by its path under wantrain/ or by its
    file name in the row of its package."""
    rows = [line for line in ARCH.splitlines() if line.startswith("|")]
    missing = []
    for p in sources():
        rel = p.relative_to(PKG).as_posix()
        if p.name == "__init__.py" and p.parent != PKG:
            rel = p.parent.relative_to(PKG).as_posix() + "/"
        package = p.parent.relative_to(PKG).as_posix() + "/" if p.parent != PKG else ""
        named = f"`{rel}`" in ARCH or any(f"`{package}`" in row and (f"`{p.name}`" in row or p.name == "__init__.py")
                                          for row in rows if package)
        if not named and p.name not in ("__init__.py", "__main__.py"):
            missing.append(rel)
    assert not missing, missing


def test_testbed_imports_only_the_plan_of_wantrain():
    for p in (ROOT / "testbed").rglob("*.py"):
        for m in re.finditer(r"^\s*(?:from|import)\s+(wantrain[\w.]*)", p.read_text(), re.M):
            assert m.group(1) == "wantrain.launch.plan", (p.name, m.group(1))


def test_a_config_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, wantrain; wantrain.RunConfig(); import wantrain.launch.plan; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_the_panel_and_the_command_line_load_neither_torch_nor_numba():
    """A notebook kernel that drives runs, and `wantrain` itself, hold no model and code no delta:
    torch (about 150 MB a process) and numba (about 30 MB) are for the PS and the sites."""
    import subprocess
    import sys
    code = ("import sys, wantrain.ui, wantrain.commands.cli, wantrain.transport.wire; "
            "print(sorted(m for m in ('torch', 'numba') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", (r.stdout, r.stderr)


# A file past about 400 lines is a smell to look at (DEVELOPERS.md): split it along a seam, a second
# reason to change, never to get under the count. One that is long for a reason is named here, with
# the reason and a ceiling: its size when it was named plus a small margin, so an exemption bounds
# what it exempts (raising a ceiling is a decision a commit states, not a drift).
LONG_BY_DESIGN: dict[str, tuple[int, str]] = {
    "wantrain/ps/server.py": (455, "the composition root of the PS's owners and the one place a site's messages "
                                   "move the round (join, ready, chunk, metrics, hash report, deadline, commit): "
                                   "its handlers share the round's state, and apart they would each reach into it"),
    "wantrain/ps/servicer.py": (430, "the gRPC adapter: each RPC's translation between the wire and the PS "
                                     "(Session, Lane, Watch, Ping, Report), sharing one account of streams per "
                                     "address and one way to refuse and log; apart, each would reach into that "
                                     "accounting"),
    "wantrain/launch/run.py": (440, "the composition root of a run's processes: starting, following and stopping "
                                    "them and the faults injected on purpose (kill, outage, restart or move the "
                                    "PS, drop an SSH link) act on the same processes and their bookkeeping (which "
                                    "were killed on purpose, restarts, the relay)"),
    "wantrain/config/sections.py": (420, "the run config's sections: one frozen dataclass per owner, each field's "
                                         "meaning, default and check beside it, the one place a user reads what a "
                                         "setting does"),
}
MAX_LINES = 400
CEILING_MARGIN = 0.06      # a ceiling at most this share above the file's size


def test_no_module_is_longer_than_the_guard_without_a_named_reason():
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in sources()}
    long = {rel: n for rel, n in lines.items() if n > MAX_LINES and rel not in LONG_BY_DESIGN}
    assert not long, long
    for rel, (ceiling, reason) in LONG_BY_DESIGN.items():
        assert rel in lines and len(reason) > 20, rel
        assert lines[rel] <= ceiling, f"{rel}: {lines[rel]} lines, past its ceiling of {ceiling}: split it or say why"
        # An exemption that no longer exempts anything, or whose ceiling leaves room to grow a lot, is stale.
        assert lines[rel] > MAX_LINES, f"{rel} is {lines[rel]} lines now: take it off LONG_BY_DESIGN"
        assert ceiling <= lines[rel] * (1 + CEILING_MARGIN), f"{rel}: ceiling {ceiling} far above its {lines[rel]} lines"


# ------------------------------------------------------------------ the shape of the code


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def module_graph() -> dict[str, set[str]]:
    """Every wantrain module -> the wantrain modules it imports, wherever the import is (a function,
    an `if TYPE_CHECKING:` block): a circle that only type checkers see is still a circle of concepts."""
    import ast
    modules = {module_name(p): p for p in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from package import module` imports that module; `from package import name`, the package
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_anywhere_in_wantrain():
    """Modules import each other one way: a circle means two modules share one concept, or one
    reaches into another's state (as commit.py and state.py once did into the server's)."""
    graph = module_graph()
    assert graph["wantrain.ps.server"] >= {"wantrain.ps.commit", "wantrain.ps.ledger"}    # the graph sees imports
    assert not circles(graph), circles(graph)


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def declared_elsewhere(tree) -> list[tuple[str, list[str]]]:
    """Classes that annotate attributes they never assign: a mixin declaring what another class holds."""
    import ast
    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        decorators = {ast.unparse(d).split("(")[0].rpartition(".")[2] for d in cls.decorator_list}
        bases = {ast.unparse(b).rpartition(".")[2] for b in cls.bases}
        if decorators & {"dataclass"} or bases & {"NamedTuple", "TypedDict", "Protocol", "Enum", "IntEnum"}:
            continue                        # their annotations are their fields
        declared = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        assigned = {t.attr for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")}
        foreign = [a for a in declared if a not in assigned and not any(
            isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == a and n.value is not None
            for n in cls.body)]
        if foreign:
            out.append((cls.name, foreign))
    return out


def test_no_class_declares_attributes_that_another_class_holds():
    """State belongs to the object that owns it: no mixin that annotates a host class's attributes
    (as `RunFaults` once declared thirteen of `Run`'s)."""
    import ast
    found = {str(p.relative_to(ROOT)): d for p in sources() if (d := declared_elsewhere(ast.parse(p.read_text())))}
    assert not found, found
    mixin = ast.parse("class Faults:\n    workers: dict\n    def kill(self):\n        self.workers.clear()\n")
    assert declared_elsewhere(mixin) == [("Faults", ["workers"])]
