"""The package's layout: no import cycle between its files or its rooms (a top-level module or folder), at
most twelve top-level modules, and the names that moved into folders still importing under their old names
with a warning for one release."""

from __future__ import annotations

import ast
import importlib
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import pytest_ptn

PACKAGE = Path(pytest_ptn.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every pytest_ptn module ``path`` imports, wherever it does (module scope, function, TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES}
            found.add(node.module)
    return {name for name in found if name in MODULES}


def room(module: str) -> str:
    """The top-level module or folder a module belongs to (the package's own ``__init__`` is one room)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges.setdefault(name, set()).update(i for i in imports(path) if i != name)
    return edges


def test_no_file_imports_itself_through_others() -> None:
    edges = graph()
    for name in edges:  # a package imports its own __init__ implicitly: not a cycle of the code
        edges[name] = {i for i in edges[name] if not name.startswith(f"{i}.")}
    try:
        tuple(TopologicalSorter(edges).static_order())
    except CycleError as cycle:
        pytest.fail(f"import cycle: {' -> '.join(cycle.args[1])}")


def test_no_room_imports_a_room_above_it() -> None:
    """Rooms that import each other (any two files of theirs) have no floor order: one import runs back up."""
    rooms: dict[str, set[str]] = {}
    for name, targets in graph().items():
        rooms.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    try:
        tuple(TopologicalSorter(rooms).static_order())
    except CycleError as cycle:
        pytest.fail(f"rooms importing each other: {' -> '.join(cycle.args[1])}")


def test_the_top_level_holds_at_most_twelve_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


@pytest.mark.parametrize("old", sorted(pytest_ptn.MOVED))
def test_a_moved_module_imports_under_its_old_name_with_a_warning(old: str) -> None:
    new = importlib.import_module(f"pytest_ptn.{pytest_ptn.MOVED[old]}")
    sys.modules.pop(f"pytest_ptn.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"pytest_ptn.{old} moved to {new.__name__}"):
        moved = importlib.import_module(f"pytest_ptn.{old}")
    assert moved is new


def test_nothing_in_the_package_uses_an_old_name() -> None:
    old = {f"pytest_ptn.{name}" for name in pytest_ptn.MOVED}
    for name, path in MODULES.items():
        used = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                used |= {a.name for a in node.names} & old
            elif isinstance(node, ast.ImportFrom) and node.module:
                used |= ({node.module} | {f"{node.module}.{a.name}" for a in node.names}) & old
        assert not used, f"{name} imports {used}"
