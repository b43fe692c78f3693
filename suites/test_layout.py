"""The design card's layout rules, checked on the source: reference/ never imports harness/ or suites/, harness/
never imports suites/, and reference/ reaches private torch APIs only through `_compat.py` (issue 9), apart from
the few documented ones it names here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# torch._* names that torch documents for users: dynamic-shape marking, custom backends, and checks on sizes
DOCUMENTED = {"torch._dynamo.mark_dynamic", "torch._dynamo.list_backends", "torch._dynamo.register_backend",
              "torch._check"}


def _sources(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _private(name: str) -> bool:
    """`torch._x`, not a dunder such as `torch.__version__`."""
    return name.startswith("torch._") and not name.startswith("torch.__")


def private_torch_uses(path: Path) -> set[str]:
    """The private torch names a file uses: `torch._x...` attribute chains (their longest form) and imports from
    `torch._x` modules."""
    found = {name for name in _imports(path) if _private(name)}
    chains = {d for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)
              for d in [_dotted(node)] if d and _private(d)}
    found |= {c for c in chains if not any(o != c and o.startswith(c + ".") for o in chains)}
    return found


@pytest.mark.parametrize("folder, forbidden", [("reference", ("pieceworks.harness", "harness", "suites")),
                                               ("harness", ("suites",))])
def test_lower_layers_never_import_higher_ones(folder, forbidden):
    bad = {str(p.relative_to(REPO)): sorted(n for n in _imports(p) if n.split(".")[0] in forbidden
                                             or any(n.startswith(f + ".") or n == f for f in forbidden))
           for p in _sources(folder)}
    assert not {k: v for k, v in bad.items() if v}


def test_private_torch_apis_only_in_compat():
    found = {str(p.relative_to(REPO)): sorted(private_torch_uses(p) - DOCUMENTED)
             for p in _sources("reference") if p.name != "_compat.py"}
    assert not {k: v for k, v in found.items() if v}, (
        "private torch APIs outside reference/_compat.py (add a feature-detected accessor there)")


def test_the_private_use_finder_sees_attribute_chains_and_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("import torch\nfrom torch._inductor import config\nx = torch._inductor.config.patch(a=1)\n"
                      "y = torch._dynamo.mark_dynamic\nz = torch.compile\nv = torch.__version__\n")
    assert private_torch_uses(source) == {"torch._inductor", "torch._inductor.config.patch", "torch._dynamo.mark_dynamic"}
