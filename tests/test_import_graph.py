"""The import graph of src/infragent: no cycles between modules, none between packages, and the engine below
its server. Every import statement counts, at the top of a file or inside a function or a TYPE_CHECKING block:
an import hidden in a function is still a dependency."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module and package under src/infragent."""
    found = {}
    for path in sorted((SRC / "infragent").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules this one imports (an imported name that is a module counts as that module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in out if m in modules and m != name}


def _graph() -> tuple[dict[str, set[str]], dict[str, Path]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}, modules


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _package(name: str, modules: dict[str, Path]) -> str:
    return name if modules[name].name == "__init__.py" else name.rpartition(".")[0]


def test_the_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    graph, _ = _graph()
    assert len(graph) > 100  # the walk found the project
    assert _cycles(graph) == []


def test_no_two_packages_import_each_other():
    """Packages are folders; a package and the folders inside it (engine and engine.models) are one
    concern and are not compared, every other pair is."""
    graph, modules = _graph()
    packages: dict[str, set[str]] = {}
    for name, deps in graph.items():
        mine = _package(name, modules)
        for dep in deps:
            theirs = _package(dep, modules)
            if not (theirs == mine or theirs.startswith(mine + ".") or mine.startswith(theirs + ".")):
                packages.setdefault(mine, set()).add(theirs)
    assert _cycles(packages) == []


def test_the_engine_does_not_import_its_server():
    graph, _ = _graph()
    server = "infragent.engine.server"
    upward = sorted(f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
                    if name.startswith("infragent.engine.") and not name.startswith(server)
                    and dep.startswith(server))
    assert upward == []
