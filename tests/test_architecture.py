"""The house: no import circle between the modules of fusion_advisor and kernel_library, no module of
fusion_advisor over :data:`MAX_LINES` lines, and no test that imports benchmarks/

The import graph is read from the source (AST), function-local imports included: a circle hidden by importing
inside a function still ties the two modules together. ``from package import name`` counts as an import of the
submodule ``package.name`` when there is one, else of ``package``. An import of an enclosing package (a module
reading ``fusion_advisor.__version__``) is not an edge: Python has imported the package before any of its modules,
whatever the package's own lazy attributes import later.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fusion_advisor", "kernel_library")
#: the longest module of fusion_advisor a newcomer should have to read in one go (the issue's "about 900").
MAX_LINES = 900


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``)."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _resolve(name: str, modules: dict) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of ``modules``."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph() -> nx.DiGraph:
    """Module -> the modules it imports, anywhere in its source (edges to enclosing packages left out)."""
    modules = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for mod, (path, is_pkg) in modules.items():
        package = mod if is_pkg else mod.rpartition(".")[0]
        targets: list[str | None] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [_resolve(a.name, modules) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                targets += [_resolve(f"{full}.{a.name}", modules) or _resolve(full, modules) for a in node.names]
        for t in targets:
            if t and t != mod and not mod.startswith(t + "."):
                g.add_edge(mod, t)
    return g


def test_the_graph_sees_function_local_imports():
    g = import_graph()
    # cli imports the pipeline inside its command function only
    assert g.has_edge("fusion_advisor.cli", "fusion_advisor.analyze.pipeline")
    assert g.has_edge("fusion_advisor.analyze.pipeline", "fusion_advisor.analyze.capture")


def test_no_import_circles():
    g = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    examples = [" -> ".join(next(nx.simple_cycles(g.subgraph(c)))) for c in circles]
    assert not circles, "import circles (break them with a module both sides import):\n" + "\n".join(examples)


def test_no_module_over_max_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "fusion_advisor").rglob("*.py")}
    over = {p: n for p, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each by what it does): {over}"


def test_one_dynamo_backend_records_graph_breaks():
    """Graph breaks are read from dynamo (``compile_subgraph_reason``) and graphs lowered by AOTAutograd in one
    module only, :mod:`fusion_advisor.analyze.capture`: analyze, profile and apply hook into its backend."""
    readers = {str(p.relative_to(ROOT)) for p in (ROOT / "fusion_advisor").rglob("*.py")
               if "compile_subgraph_reason" in p.read_text() or "aot_autograd(" in p.read_text()}
    assert readers == {"fusion_advisor/analyze/capture.py"}


def test_analyze_and_apply_see_the_same_graph_break():
    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.load import load_model
    from fusion_advisor.apply.backend import RewriteBackend

    loaded = load_model(ROOT / "tests" / "data" / "models" / "graph_break.py")
    seen = capture(loaded, methods=("dynamo",))
    backend = RewriteBackend({}, match=False)
    backend.compile(loaded.module)(*loaded.inputs)
    assert [(b.graph_index, b.source.line) for b in backend.breaks] == \
        [(b.graph_index, b.source.line) for b in seen.breaks] == [(0, 15)]  # the graph that ended at the break
    assert backend.graph_count == len(seen.graphs) == 2


def test_tests_never_import_benchmarks():
    # benchmarks/ are run on a GPU machine by hand and change with each measurement; a test that imports one ties
    # the suite to a script's internals (tests/data/models holds the models both share)
    found = []
    for f in sorted((ROOT / "tests").rglob("*.py")):
        try:
            tree = ast.parse(f.read_text(), str(f))
        except SyntaxError:  # tests/data/bad holds files that are invalid on purpose
            continue
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{f.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                      if n == "benchmarks" or n.startswith("benchmarks.")]
    assert not found, found
