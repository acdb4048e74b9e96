"""The code's shape stays readable (docs/architecture.md): no module over 700
lines, no function over 80 lines outside the benchmarks, and no import cycle
between gpufeed's modules (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpufeed

ROOT = Path(gpufeed.__file__).parent
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def test_no_module_is_too_long():
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    assert {n: c for n, c in long.items() if c > MAX_MODULE_LINES} == {}


def test_no_function_is_too_long():
    long = []
    for name, path in _modules().items():
        if name.startswith("gpufeed.bench"):
            continue  # benchmarks are scripts: a table of steps reads best in one place
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}:{node.lineno} ({n} lines)")
    assert long == []


def _runtime_nodes(tree: ast.AST):
    """Every node, except those under ``if TYPE_CHECKING:`` (not imported at run time)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # "from .x import y" may name a module y
                if f"{target}.{alias.name}" in modules:
                    out.add(f"{target}.{alias.name}")
            if target in modules:
                out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
    out.discard(name)
    # a module importing a package it lives in runs that package's __init__ first; those are fine
    return {t for t in out if not name.startswith(t + ".")}


def test_no_import_cycles():
    modules = _modules()
    graph = {n: _imports(n, p, modules) for n, p in modules.items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert cycles == []


def test_test_modules_have_distinct_names():
    """pytest imports test modules by base name (the test folders are not
    packages): two with one name stop the whole run at collection."""
    seen: dict[str, Path] = {}
    for path in sorted(Path(__file__).parent.rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a name: rename one"
        seen[path.name] = path
