"""pgsolo's modules import each other in no circle, counting the imports made only for a
type checker (``if TYPE_CHECKING:``), which import-linter's layers leave out.

A circle of type-only imports is a circle of meaning: to read one module of it you read
them all (issue 23 found eight modules of ``locking/`` in one). Read, not imported."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The pgsolo modules ``path`` imports, anywhere in it (a name imported from a package
    counts as its module when it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in modules and m != name}


def test_no_module_of_pgsolo_imports_itself_through_others() -> None:
    paths = sorted(SRC.joinpath("pgsolo").rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports_of(p, modules) for p in paths}
    # A package's __init__ importing its own modules is how a package is made: not a
    # circle of meaning. Only edges between modules that are not each other's package.
    edges = {
        m: {t for t in targets if not t.startswith(m + ".") and not m.startswith(t + ".")}
        for m, targets in graph.items()
    }
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                circles.append(path[path.index(t) :])
            elif t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert circles == []
