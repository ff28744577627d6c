"""The layout the code promises (docs/architecture.md), checked on the source itself.

    language  <-  plan  <-  backends  <-  runtime  <-  integrations  <-  cli

A package imports only from those to its left (backends' registry and checks modules
are what the language consults about backend settings). No import cycle, counting
imports inside functions and modules named to importlib; no module over ~400 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "policy_engine"
MAX_LINES = 400
LAYERS = ["errors", "_resources", "language", "plan", "backends", "runtime", "testing",
          "integrations", "cli"]
# What the language may ask the backends: the registry and each backend's checks.
LANGUAGE_MAY_IMPORT = {"policy_engine.backends", "policy_engine.backends.torch",
                       "policy_engine.backends.mstx.checks",
                       "policy_engine.backends.nsight.checks",
                       "policy_engine.backends.nsight.launch"}
TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py", "testing.py", "_resources.py"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str) -> set[str]:
    """Modules of the package ``name`` imports, wherever in the file (TYPE_CHECKING
    blocks left out: they never run)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    typing_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING"
                   for sub in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "." in node.value and node.value in MODULES and node.value != name:
            found.add(node.value)  # a module named to importlib (the backend registry)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports(name) for name in MODULES}


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in GRAPH[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert cycles == []


def layer(name: str) -> str:
    return name.split(".")[1].removesuffix(".py") if "." in name else "__init__"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down_the_layers(name: str) -> None:
    here = layer(name)
    if here not in LAYERS:
        return
    upward = sorted(dep for dep in GRAPH[name] if layer(dep) in LAYERS
                    and LAYERS.index(layer(dep)) > LAYERS.index(here)
                    and not (here == "language" and dep in LANGUAGE_MAY_IMPORT))
    assert upward == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_modules_fit_in_one_sitting(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_top_level_holds_the_entry_points_only() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == {"language", "plan", "backends", "runtime", "integrations", "cli"}
