"""Meta's compiler-free piecewise CUDA graphs: `piecewise-cuda-graphs` ("meta-pcg") and its successor
`breakable-cuda-graphs` ("breakable")."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pieceworks.core import op_names

from .base import STATIC_ARGUMENTS, Built, Capabilities, Implementation, missing, padded_server


class _NoGraphBreaks(torch.overrides.TorchFunctionMode):
    """While active, every call of a splitting op goes through `no_graph` (Meta pcg's eager break)."""

    def __init__(self, splitting_ops: Sequence[str], no_graph: Callable[..., Any]) -> None:
        super().__init__()
        self.splitting_ops, self.no_graph, self.breaks = set(splitting_ops), no_graph, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if op_names(func) & self.splitting_ops:
            self.breaks += 1
            return self.no_graph(func)(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class MetaPCG(Implementation):
    """Meta's compiler-free piecewise CUDA graphs, `breakable-cuda-graphs` ("breakable") or its predecessor
    `piecewise-cuda-graphs` ("meta-pcg"), both on PyPI with one API under two sets of names: the eager model
    captured per batch size as a sequence of CUDA graphs with the splitting ops run eagerly between them (its
    `no_graph`), all sizes in one pool, largest first, on one side stream after a warm-up there; served by
    `padded_server`. The splitting ops must write into buffers they are given and return no CUDA tensor (the
    package's rule); non-tensor arguments must equal the example's."""

    capabilities = Capabilities(
        cuda_graphs=True, padding=True, piecewise=True, shared_pool=True, needs_cuda=True
    )
    contracts = {"argument_writes": STATIC_ARGUMENTS.format("the adapter (an engine's model runner)")}

    def __init__(
        self,
        name: str = "meta-pcg",
        module: str = "piecewise_cuda_graphs",
        sequence: str = "CUDAGraphSequence",
        capture: str = "piecewise_graph",
    ) -> None:
        self.name, self.module, self.sequence, self.capture = name, module, sequence, capture

    def unavailable_reason(self) -> str | None:
        if missing(self.module):
            package = self.module.replace("_", "-")
            return (
                f"{self.name} needs Meta's {package} (PyPI, pure Python), which is not installed. Fix: "
                f"pip install 'pieceworks[pcg]' (or pip install {package})"
            )
        return super().unavailable_reason()

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        pcg = importlib.import_module(self.module)
        new_sequence, capture = getattr(pcg, self.sequence), getattr(pcg, self.capture)

        sizes = sorted(set(capture_sizes), reverse=True)
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in make_inputs(sizes[0])]

        def views(n: int) -> list[Any]:
            return [a[:n] if isinstance(a, torch.Tensor) else a for a in static]

        stream, pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()
        # The warm-up makes the capture stream's cuBLAS workspace, which every captured GEMM keeps using. In a
        # MemPool of its own it stays mapped when other code (reduce-overhead's graph trees) clears cuBLAS
        # workspaces and empties the cache; in the default pool it would be freed under the graphs.
        warmup_pool = torch.cuda.MemPool()
        captured: dict[int, tuple[Any, Any]] = {}
        start = time.perf_counter()
        with torch.no_grad():
            stream.wait_stream(torch.cuda.current_stream())
            with (
                torch.cuda.stream(stream),
                torch.cuda.use_mem_pool(warmup_pool),
            ):  # workspaces of the capture stream
                for n in sizes:
                    model(*views(n))
            torch.cuda.current_stream().wait_stream(stream)
            for n in sizes:
                seq, breaks = new_sequence(pool=pool), _NoGraphBreaks(splitting_ops, pcg.no_graph)
                with capture(seq, stream=stream), breaks:
                    out = model(*views(n))
                if not breaks.breaks and splitting_ops:
                    raise RuntimeError(
                        f"{self.name}: no call of {list(splitting_ops)} seen while capturing batch {n}"
                    )
                captured[n] = (seq, out)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start

        def replay(n: int) -> Any:
            seq, out = captured[n]
            seq.replay()
            return out

        return Built(
            padded_server(sizes, static, replay, model),
            capture_order=sizes,
            pool=pool,
            capture_seconds=seconds,
            owner=(captured, warmup_pool),
        )
