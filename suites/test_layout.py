"""The layout rules, checked on the source: reference/ never imports harness/, suites/ or ci/, harness/ never
imports suites/ or ci/ (and its models and adapters no other part of it), reference/ reaches private torch
APIs only through `_compat.py` (apart from the few documented ones named here), and the tools (harness/,
suites/, ci/) use only public names of the core: no name with a leading underscore that reference/ defines,
whether imported, read as an attribute or named in a string (as monkeypatching does)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# torch._* names that torch documents for users: dynamic-shape marking, custom backends, and checks on sizes
DOCUMENTED = {"torch._dynamo.mark_dynamic", "torch._check"}


def _sources(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def _imports(path: Path, harness: str | None = None) -> set[str]:
    """The modules `path` imports; with `harness` (its import name), a relative import of a file under
    harness/ by its absolute name (`from ..models import toy`: pieceworks.harness.models.toy)."""
    names = set()
    parts = (
        path.relative_to(REPO / "harness").parent.parts
        if harness and path.is_relative_to(REPO / "harness")
        else None
    )
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level and parts is not None:
            base = ".".join([harness, *parts[: len(parts) - node.level + 1]])
            names.update(f"{base}.{node.module}" if node.module else f"{base}.{a.name}" for a in node.names)
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
    """The private torch names a file uses: `torch._x...` attribute chains (their longest form) and imports
    from `torch._x` modules."""
    found = {name for name in _imports(path) if _private(name)}
    chains = {
        d
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        for d in [_dotted(node)]
        if d and _private(d)
    }
    found |= {c for c in chains if not any(o != c and o.startswith(c + ".") for o in chains)}
    return found


CI = (
    "pieceworks.gate",
    "pieceworks.report",
    "pieceworks.conformance",
)  # ci/ and the conformance suite: tools on top
HARNESS = "pieceworks.harness"


@pytest.mark.parametrize(
    "folder, forbidden",
    [
        ("reference", ("pieceworks.harness", "harness", "suites", *CI)),
        ("harness", ("suites", *CI)),
        # models and adapters stand on the core alone; measurement and test tools on them
        ("harness/models", (f"{HARNESS}.adapters", f"{HARNESS}.measure", f"{HARNESS}.testing")),
        ("harness/adapters", (f"{HARNESS}.models", f"{HARNESS}.measure", f"{HARNESS}.testing")),
    ],
)
def test_lower_layers_never_import_higher_ones(folder, forbidden):
    bad = {
        str(p.relative_to(REPO)): sorted(
            n
            for n in _imports(p, HARNESS)
            if n.split(".")[0] in forbidden or any(n.startswith(f + ".") or n == f for f in forbidden)
        )
        for p in _sources(folder)
    }
    assert not {k: v for k, v in bad.items() if v}


def test_private_torch_apis_only_in_compat():
    found = {
        str(p.relative_to(REPO)): sorted(private_torch_uses(p) - DOCUMENTED)
        for p in _sources("reference")
        if p.name != "_compat.py"
    }
    assert not {k: v for k, v in found.items() if v}, (
        "private torch APIs outside the layers' _compat.py (add a feature-detected accessor there)"
    )


def test_the_private_use_finder_sees_attribute_chains_and_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "import torch\nfrom torch._inductor import config\nx = torch._inductor.config.patch(a=1)\n"
        "y = torch._dynamo.mark_dynamic\nz = torch.compile\nv = torch.__version__\n"
    )
    assert private_torch_uses(source) == {
        "torch._inductor",
        "torch._inductor.config.patch",
        "torch._dynamo.mark_dynamic",
    }


TOOLS = ("harness", "suites", "ci")
OWN = ("harness", "gate", "conformance", "report")  # pieceworks' own tool packages


DOORS = ("pieceworks", "pieceworks.core", "pieceworks.model")  # the user's API, the tools' view, the layer


@pytest.mark.parametrize("folder", ["harness", "suites/benchmarks"])
def test_the_harness_and_the_benchmarks_use_pieceworks_through_its_doors(folder):
    """What `pieceworks` (the user's API), `pieceworks.core` (the technique's public names) and
    `pieceworks.model` export is enough to build the harness and the benchmarks: no import of a core module
    (`pieceworks.runtime`, `import pieceworks.key`), so a user's own tool can do what ours do."""
    found = {
        str(p.relative_to(REPO)): sorted(
            n
            for n in _imports(p)
            if n.startswith("pieceworks.") and n.split(".")[1] not in OWN and n not in DOORS
        )
        for p in _sources(folder)
    }
    assert not {k: v for k, v in found.items() if v}, "import the name from pieceworks.core instead"


def _private_names_defined(paths: list[Path]) -> set[str]:
    """Names with one leading underscore that these files define: functions, classes, module globals,
    attributes set on objects (`self._x = ...`, `object.__setattr__(self, "_x", ...)`) and the modules
    themselves."""
    found = {p.stem for p in paths if p.stem.startswith("_") and not p.stem.startswith("__")}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and _dotted(node.func) == "object.__setattr__"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
            ):
                found.add(node.args[1].value)
    return {n for n in found if isinstance(n, str) and n.startswith("_") and not n.startswith("__")}


def core_private_uses(path: Path, private: set[str]) -> set[str]:
    """Where a tool file reaches a private name of the core: imports of `pieceworks._x` or of `_x` from a core
    module, attributes named like one of `private`, and strings equal to one
    (`monkeypatch.setattr(obj, "_x")`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            for alias in node.names:
                full = f"{module}.{alias.name}" if module else alias.name
                core = full.startswith("pieceworks.") and full.split(".")[1] not in OWN
                if core and any(
                    part.startswith("_") and not part.startswith("__") for part in full.split(".")
                ):
                    found.add(f"import {full}")
        elif isinstance(node, ast.Attribute) and node.attr in private:
            found.add(f".{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in private:
            found.add(repr(node.value))
    return found


def test_tools_use_only_public_names_of_the_core():
    core = _private_names_defined(_sources("reference"))
    tools = [p for folder in TOOLS for p in _sources(folder) if p.name != "test_layout.py"]
    private = core - _private_names_defined(tools)  # a tool's own private helper of the same name is its own
    found = {str(p.relative_to(REPO)): sorted(core_private_uses(p, private)) for p in tools}
    assert not {k: v for k, v in found.items() if v}, (
        "tools reaching into the core's private names: use its public view (see pieceworks/__init__.py)"
    )


def test_mutants_use_only_public_names_of_the_harness_the_gate_and_the_report():
    """The mutants break the product through its public names, so that a refactor of a private helper cannot
    turn one into a no-op that still "passes" its registry checks."""
    mutants = _sources("suites/mutants")
    tools = _sources("harness") + _sources("ci/gate") + _sources("ci/report")
    private = _private_names_defined(tools) - _private_names_defined(mutants)
    found = {str(p.relative_to(REPO)): sorted(core_private_uses(p, private)) for p in mutants}
    assert mutants and not {k: v for k, v in found.items() if v}, (
        "mutants patching private harness, gate or report names"
    )


def test_the_core_private_use_finder_sees_imports_attributes_and_strings(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "import pieceworks._compat\nfrom pieceworks.plan import _Ref, record_plan\n"
        "from pieceworks.report import _table\nx = model._binder\ny = model.runtime\n"
        "mp.setattr(runtime, '_phase', 1)\n"
    )
    assert core_private_uses(source, {"_binder", "_phase", "_Ref"}) == {
        "import pieceworks._compat",
        "import pieceworks.plan._Ref",
        "._binder",
        "'_phase'",
    }


# What `import pieceworks` must not add to what `import torch` loaded: Dynamo and Inductor (a process that
# reads a config or a result never pays for them; a compile imports them), and the packages of pyproject's
# extras, by import name
NOT_ON_IMPORT = {"torch._dynamo", "torch._inductor", "transformers", "asv", "matplotlib", "pynvml", "pytest"}
NOT_ON_IMPORT |= {"hypothesis", "piecewise_cuda_graphs", "breakable_cuda_graphs"}


def test_importing_pieceworks_loads_neither_dynamo_nor_an_optional_package():
    code = "import sys, torch; old = set(sys.modules); import pieceworks; print(*set(sys.modules) - old)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not NOT_ON_IMPORT & set(done.stdout.split()), NOT_ON_IMPORT & set(done.stdout.split())
