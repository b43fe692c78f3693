"""The adapter API: what an implementation claims (`Capabilities`), what a build returns (`Built`), the base
class (`Implementation`), and the padded server engines' model runners use.

Contract of `Built.__call__`: called like the model; outputs are valid until the next call (clone what you
keep); inference only (under `torch.no_grad()`); not thread-safe. A `Built` owns its graphs and pools:
dropping the last reference frees them (after `torch.cuda.synchronize()` and a gc).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pieceworks import batch_of
from pieceworks.core import padded_size, unpad

__all__ = [
    "Built",
    "Capabilities",
    "Implementation",
    "InputsMaker",
    "STATIC_ARGUMENTS",
    "missing",
    "padded_server",
]

InputsMaker = Callable[[int], tuple]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an implementation claims. Checks needing a capability an implementation lacks are not
    applicable."""

    cuda_graphs: bool = False  # replays CUDA graphs for captured sizes
    padding: bool = False  # a batch between captured sizes replays the next captured size's graph
    piecewise: bool = False  # splitting ops run eagerly between graphs
    shared_pool: bool = False  # every captured size lives in one memory pool
    compile_cache: bool = False  # an on-disk compile cache (warm starts)
    needs_cuda: bool = False  # cannot run at all without a CUDA device


@dataclasses.dataclass
class Built:
    """A built implementation: `fn(*args)` serves a batch. The other fields are what the harness may observe
    (None: not observable)."""

    fn: Callable[..., Any]
    capture_order: list[int] | None = None  # batch sizes in the order their graphs were captured
    pool: Any = None  # the graph pool handle (`torch.cuda.graph_pool_handle()`), for per-pool allocator bytes
    capture_seconds: float | None = None  # wall time of the capture phase
    owner: Any = None  # whatever must stay alive while `fn` is used
    capture_report: dict[str, Any] | None = None  # the implementation's own account of its capture
    compiles: int | None = None  # pieces the build compiled afresh (a warm start from a compile cache: 0)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class Implementation:
    """Base adapter. Subclasses set `name`, `capabilities`, `contracts` and implement `build`."""

    name: str = "?"
    capabilities: Capabilities = Capabilities()
    contracts: dict[str, str] = {}  # capability not claimed -> why (the implementation's contract)

    def unavailable_reason(self) -> str | None:
        """None when this implementation can run here; else why not (missing package, no CUDA)."""
        if self.capabilities.needs_cuda and not torch.cuda.is_available():
            return f"{self.name} needs CUDA: torch {torch.__version__} sees no CUDA device"
        return None

    def build(
        self,
        model: torch.nn.Module,
        make_inputs: InputsMaker,
        capture_sizes: Sequence[int],
        splitting_ops: Sequence[str],
    ) -> Built:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<implementation {self.name}>"


def missing(module: str) -> ImportError | None:
    """The ImportError of importing `module`, or None when it imports."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return exc
    return None


STATIC_ARGUMENTS = (
    "{} copies arguments into static input buffers and never back: what the model writes into "
    "its arguments stays there (models served this way write state such as a KV cache, never "
    "their inputs)"
)


def padded_server(
    sizes: Sequence[int], static: list[Any], replay: Callable[[int], Any], above: Callable[..., Any]
) -> Callable[..., Any]:
    """Serve a batch of b rows as an engine's model runner does: copy it into the first b rows of the max-size
    `static` buffers, `replay(n)` for the smallest captured size n >= b (padded rows hold rows of earlier
    calls) and cut the outputs back to b rows; above the largest size, `above(*args)`."""
    ordered = sorted(sizes)

    def serve(*args: Any) -> Any:
        batch = batch_of(args)
        if (n := padded_size(ordered, batch)) is None:
            return above(*args)
        for buffer, a in zip(static, args):
            if isinstance(a, torch.Tensor):
                buffer[:batch].copy_(a)
        return unpad(replay(n), batch, n)

    return serve
