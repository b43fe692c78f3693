"""The layer rules, checked on the source, and the absence of import circles.

- The core (reference/*.py) imports only the core; its facade `pieceworks/__init__.py` alone also re-exports
  the model layer (the user's API is both).
- The model layer (reference/model/) imports the core only through `pieceworks.core`, the technique's public
  names, as any engine would, and otherwise only itself.
- Tools (harness/, ci/) import pieceworks only through its three public doors, `pieceworks`, `pieceworks.core`
  and `pieceworks.model`, and their own packages; the harness never imports suites/ or ci/.
- No module of reference/, harness/ or ci/ takes part in an import circle (imports under `if TYPE_CHECKING:`
  are for the type checker and do not count).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {
    "reference": "pieceworks",
    "harness": "pieceworks.harness",
    "ci/gate": "pieceworks.gate",
    "ci/report": "pieceworks.report",
}
DOORS = {"pieceworks", "pieceworks.core", "pieceworks.model"}


def module_name(path: Path) -> str:
    """The import name of a source file of one of `PACKAGES` (the longest folder that holds it)."""
    rel = path.relative_to(REPO)
    folder = max((f for f in PACKAGES if rel.as_posix().startswith(f + "/")), key=len)
    parts = [*PACKAGES[folder].split("."), *rel.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    found = {}
    for folder in PACKAGES:
        for path in sorted((REPO / folder).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of import nodes under `if TYPE_CHECKING:`."""
    return {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        for n in ast.walk(node)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `path` (module `name`) imports at run time: `from pkg import sub` names the
    submodule where `sub` is one, else `pkg`; relative imports resolved."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m.split(".")[0] in ("pieceworks", "suites")}


def graph() -> dict[str, set[str]]:
    found = sources()
    return {name: imports(path, name, set(found)) for name, path in found.items()}


def test_the_core_imports_only_the_core():
    bad = {
        name: sorted(m for m in deps if m.startswith("pieceworks.model") or not m.startswith("pieceworks"))
        for name, deps in graph().items()
        if name.count(".") == 1
        and name != "pieceworks"
        and not name.startswith(
            ("pieceworks.model", "pieceworks.harness", "pieceworks.gate", "pieceworks.report")
        )
    }
    assert not {k: v for k, v in bad.items() if v}


def test_the_model_layer_uses_the_core_through_its_public_names_only():
    bad = {
        name: sorted(m for m in deps if not (m == "pieceworks.core" or m.startswith("pieceworks.model")))
        for name, deps in graph().items()
        if name.startswith("pieceworks.model")
    }
    assert {k: v for k, v in bad.items() if v} == {}, "import from pieceworks.core (add the name there)"


@pytest.mark.parametrize("tool", ["pieceworks.harness", "pieceworks.gate", "pieceworks.report"])
def test_tools_use_pieceworks_through_its_doors(tool):
    own = ("pieceworks.harness", "pieceworks.gate", "pieceworks.report")
    bad = {
        name: sorted(m for m in deps if m not in DOORS and not m.startswith(own))
        for name, deps in graph().items()
        if name.startswith(tool)
    }
    assert not {k: v for k, v in bad.items() if v}


def test_the_harness_never_imports_suites_or_ci():
    bad = {
        name: sorted(m for m in deps if m.startswith(("suites", "pieceworks.gate", "pieceworks.report")))
        for name, deps in graph().items()
        if name.startswith("pieceworks.harness")
    }
    assert not {k: v for k, v in bad.items() if v}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert circles(graph()) == []


def test_the_circle_finder_finds_a_circle_and_the_module_names_are_right(tmp_path):
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert module_name(REPO / "reference" / "model" / "binding.py") == "pieceworks.model.binding"
    assert module_name(REPO / "reference" / "__init__.py") == "pieceworks"
    edges = graph()
    assert "pieceworks.core" in edges["pieceworks.model.compiled_model"]
    assert "pieceworks.runtime" in edges["pieceworks.backend"]
