"""Implementations under test: one small adapter per implementation, one registry (docs/conformance.md).

An adapter's `build(model, make_inputs, capture_sizes, splitting_ops)` returns a `Built`: a callable that
serves any batch size, plus what the harness can observe; `make_inputs(batch)` gives the model's arguments for
`batch` rows. `Capabilities` say what it claims; `contracts` map a capability not claimed (or "pool",
"compiles": a `Built` field not observable; "argument_writes": the model's in-place writes to its arguments do
not reach the caller's) to why, so a check needing it is reported as not applicable with that reason. An
adapter whose package is missing is unavailable (`unavailable_reason()`).

Contract of `Built.__call__`: called like the model; outputs are valid until the next call (clone what you
keep); inference only (under `torch.no_grad()`); not thread-safe. A `Built` owns its graphs and pools:
dropping the last reference frees them (after `torch.cuda.synchronize()` and a gc). Build one implementation
of a model at a time: torch.compile-based adapters reset Dynamo when they build; builds that never enter
Dynamo again (eager, pieceworks, meta-pcg) may stay alive next to one torch.compile-based build made after
them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pkgutil
import sys
from typing import Any

from .base import Built, Capabilities, Implementation
from .meta_pcg import MetaPCG
from .modes import Pieceworks
from .torch_runtimes import (
    DynamoCudagraphs,
    Eager,
    GraphedCallables,
    Inductor,
    InductorPartition,
    InductorPartitionPadded,
    ReduceOverhead,
    ReduceOverheadPadded,
)
from .vllm_backend import VLLM

__all__ = [
    "Built",
    "Capabilities",
    "Implementation",
    "IMPLEMENTATIONS",
    "register",
    "resolve",
    "load_user_implementations",
]

IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    """Add `impl` to the registry under `impl.name` (a later registration of the same name replaces it)."""
    IMPLEMENTATIONS[impl.name] = impl
    return impl


for _impl in [
    Eager(),
    Inductor(),
    ReduceOverhead(),
    InductorPartition(),
    DynamoCudagraphs(),
    GraphedCallables(),
    *(Pieceworks(m) for m in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")),
    ReduceOverheadPadded(),
    InductorPartitionPadded(),
    MetaPCG(),
    MetaPCG("breakable", "breakable_cuda_graphs", "BreakableCUDAGraph", "breakable_graph"),
    VLLM(),
]:
    register(_impl)


def _load_file(path: str) -> Any:
    """The module of file `path`, loaded once per path (under its stem and a hash of the path)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ImportError(
            f"no file {path}. Fix: name an existing .py file, or write 'package.module:Adapter'"
        )
    digest = hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()[:8]
    name = f"pieceworks_user_{os.path.basename(path)[:-3]}_{digest}"
    if name not in sys.modules:
        file_spec = importlib.util.spec_from_file_location(name, path)
        assert file_spec is not None and file_spec.loader is not None  # a .py path: a source file's spec
        sys.modules[name] = importlib.util.module_from_spec(file_spec)
        try:
            file_spec.loader.exec_module(sys.modules[name])
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def resolve(spec: str) -> Implementation:
    """A registered name, or `package.module:Attribute` or `path/to/file.py:Attribute` naming an
    `Implementation` instance or subclass (a subclass is instantiated). Raises KeyError, ImportError,
    AttributeError or TypeError, each naming `spec` and the fix."""
    if spec in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[spec]
    if ":" not in spec:
        raise KeyError(
            f"unknown implementation {spec!r}; registered: {sorted(IMPLEMENTATIONS)}. Fix: pass one of "
            f"those, or 'package.module:Adapter' for your own (a pieceworks.harness.adapters."
            f"Implementation)"
        )
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            target = getattr(_load_file(module_name), attr)
        else:
            target = pkgutil.resolve_name(spec)
    except ImportError as exc:
        raise ImportError(
            f"implementation {spec!r}: cannot import module {module_name!r} ({exc}). Fix: make it "
            f"importable (installed, or its folder on PYTHONPATH) and write 'package.module:Adapter', "
            f"or give its file: 'path/to/file.py:Adapter'"
        ) from exc
    except AttributeError as exc:
        raise AttributeError(
            f"implementation {spec!r}: {exc}. Fix: name an Implementation instance or subclass defined there"
        ) from None
    impl = target() if isinstance(target, type) else target
    if not isinstance(impl, Implementation):
        raise TypeError(
            f"{spec} is a {type(impl).__name__}, not a pieceworks.harness.adapters.Implementation"
        )
    return impl


def load_user_implementations(specs: str | None = None) -> list[Implementation]:
    """Resolve and register users' implementations: comma-separated `package.module:Attribute` paths in
    `specs` (default: $PIECEWORKS_IMPLEMENTATIONS). Returns them, in order. Each registers under its own
    `name` (replacing a built-in of the same name); a path that does not resolve raises, naming it."""
    if specs is None:
        specs = os.environ.get("PIECEWORKS_IMPLEMENTATIONS", "")
    found = []
    for spec in filter(None, (s.strip() for s in specs.split(","))):
        if ":" not in spec:
            raise ValueError(
                f"PIECEWORKS_IMPLEMENTATIONS entry {spec!r} is not a 'package.module:Adapter' path. Fix: "
                f"write the module and the Implementation's name separated by ':'"
            )
        found.append(register(resolve(spec)))
    return found
