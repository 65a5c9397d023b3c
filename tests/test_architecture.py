"""The house rule: each module imports only its own layer or the layers below it, and no import circle.

The layers are declared once, here (docs/DESIGN.md "Architecture" draws them). Every import statement
counts, those inside functions and under ``TYPE_CHECKING`` included: a circle hidden in a local import is
still a circle for a reader, and still one for Python the day someone moves the import up. Importing
``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``, so those package inits count as imported
too — except the root ``simkv/__init__.py``, which loads nothing until a name is asked of it (PEP 562,
checked below). The walk uses ``ast`` alone: no module is imported to check the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("specs", ("simkv.errors", "simkv.units", "simkv.jsonout", "simkv.jsonfile", "simkv.version", "simkv.ledger", "simkv.kvspec", "simkv.weights", "simkv.shipped", "simkv.models",
               "simkv.hfconfig", "simkv.precision", "simkv.workload", "simkv.cost", "simkv.limits")),
    ("policies", ("policies",)),
    ("engines", ("simkv.layout", "simkv.engine", "simkv.reference", "simkv.chains", "simkv.steps",
                 "simkv.memory", "simkv.metrics", "simkv.latency")),
    ("scenario", ("simkv.scenario", "simkv.figures", "simkv.flags")),
    # serving's rooms, lowest first: workloads and KV pools, the schedulers, the engine and its fast paths, the rest
    ("serving: workloads and KV", ("simkv.serving.requests", "simkv.serving.kv")),
    ("serving: schedulers", ("simkv.serving.sched",)),
    ("serving: engine", ("simkv.serving.engine",)),
    ("serving", ("simkv.serving",)),
    ("lab and validate", ("simkv.lab", "simkv.validate")),
    ("dashboard", ("simkv.dashboard",)),
    ("command line", ("simkv.cli", "simkv.commands")),  # `simkv app` starts the dashboard; never the reverse
    ("library facade", ("simkv",)),
    ("programs", ("app", "experiments")),
)

#: What the walk reads: the package, the policies, the dashboard's script and the experiments.
SOURCES = ("simkv", "policies", "experiments", "app.py")


def module_files(root: Path, sources=SOURCES) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file under ``sources`` (a package's is its ``__init__``)."""
    files = {}
    for source in sources:
        path = root / source
        for file in ([path] if path.suffix == ".py" else sorted(path.rglob("*.py"))):
            parts = file.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return files


def _imported_names(file: Path, module: str, is_package: bool):
    """Per imported name, the dotted names it may load, likeliest first (``from m import x``: m.x, else m)."""
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        yield from _imported_names_of(node, module, is_package)


def _imported_names_of(node: ast.AST, module: str, is_package: bool):
    package = module if is_package else module.rpartition(".")[0]
    if isinstance(node, ast.Import):
        yield from ([a.name] for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module
        yield from ([f"{source}.{a.name}", source] for a in node.names)


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the project modules its import statements load, package inits on the way included."""
    graph: dict[str, set[str]] = {}
    for module, file in files.items():
        targets = set()
        for candidates in _imported_names(file, module, file.name == "__init__.py"):
            # "from simkv import figures" loads the module simkv.figures; "from simkv import simulate" the
            # package itself. The first candidate that is a project module is the one loaded.
            for name in candidates:
                known = _longest_known(name, files)
                if known:
                    targets.add(known)
                    targets.update(_package_inits(known, module, files))
                    break
        graph[module] = targets - {module}
    return graph


def _longest_known(name: str, files) -> str | None:
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def _package_inits(target: str, importer: str, files) -> set[str]:
    """The package inits that loading ``target`` runs, other than the importer's own packages and the root
    ``simkv``, whose init imports nothing on load (test_root_package_loads_lazily)."""
    parts = target.split(".")
    inits = {".".join(parts[:i]) for i in range(1, len(parts))} - {"simkv"}
    own = {importer.rsplit(".", i)[0] for i in range(importer.count(".") + 1)}
    return {p for p in inits if p in files and p not in own}


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer: declare it in tests/test_architecture.py LAYERS "
                             "and docs/DESIGN.md")
    return best[0]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:  # recursion depth ≤ the number of modules (~100)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def violations(graph: dict[str, set[str]]) -> list[str]:
    """One line per import circle and per import of a higher layer."""
    lines = [f"import circle: {' <-> '.join(c)}" for c in circles(graph)]
    for module in sorted(graph):
        for target in sorted(graph[module]):
            if layer_of(target) > layer_of(module):
                lines.append(f"upward import: {module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                             f"({LAYERS[layer_of(target)][0]})")
    return lines


def test_every_module_is_in_a_layer():
    for module in module_files(ROOT):
        layer_of(module)


def test_no_circles_and_no_upward_imports():
    assert violations(import_graph(module_files(ROOT))) == []


def test_root_package_loads_lazily():
    """``import simkv.errors`` runs ``simkv/__init__.py``: it may load nothing above the specs layer then, or the
    policies (which import simkv.errors) would load the scenario layer above them — the circle this rule stops.
    Its names come from ``__getattr__`` on first use; nothing inside the project asks it for one (the facade is
    a layer above every module), so the edges it loads through ``importlib`` cannot close a circle."""
    files = module_files(ROOT)
    at_load = ast.parse((ROOT / "simkv" / "__init__.py").read_text()).body  # module level only, not __getattr__
    loaded = {_longest_known(name, files) for node in at_load
              for candidates in _imported_names_of(node, "simkv", True) for name in candidates[:1]} - {None}
    assert {module for module in loaded if layer_of(module) > 0} == set()


def test_the_check_fails_on_a_circle(tmp_path):
    """Fed a package whose two modules import each other (one inside a function), the check names the circle."""
    pkg = tmp_path / "simkv" / "serving"
    pkg.mkdir(parents=True)
    (tmp_path / "simkv" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from simkv.serving import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("from simkv.serving.b import f\n")
    graph = import_graph(module_files(tmp_path, ("simkv",)))
    assert violations(graph) == ["import circle: simkv.serving.a <-> simkv.serving.b"]


def test_the_check_fails_on_an_upward_import(tmp_path):
    """A policy reaching up into the scenario layer, and a lower package's init pulled in by a deep import."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "__init__.py").write_text("")
    (tmp_path / "policies" / "x.py").write_text("import simkv.scenario\n")
    (tmp_path / "simkv" / "lab").mkdir(parents=True)
    (tmp_path / "simkv" / "__init__.py").write_text("")
    (tmp_path / "simkv" / "scenario.py").write_text("")
    (tmp_path / "simkv" / "lab" / "__init__.py").write_text("")
    (tmp_path / "simkv" / "lab" / "sweep.py").write_text("")
    (tmp_path / "simkv" / "serving.py").write_text("from simkv.lab.sweep import x\n")
    graph = import_graph(module_files(tmp_path, ("simkv", "policies")))
    assert graph["simkv.serving"] == {"simkv.lab", "simkv.lab.sweep"}
    assert violations(graph) == [
        "upward import: policies.x (policies) imports simkv.scenario (scenario)",
        "upward import: simkv.serving (serving) imports simkv.lab (lab and validate)",
        "upward import: simkv.serving (serving) imports simkv.lab.sweep (lab and validate)",
    ]


@pytest.mark.parametrize("module, layer", [("simkv.engine", "engines"), ("simkv.validate.genai", "lab and validate"),
                                           ("simkv", "library facade"), ("experiments.stagger", "programs")])
def test_layer_of_takes_the_longest_prefix(module, layer):
    assert LAYERS[layer_of(module)][0] == layer
