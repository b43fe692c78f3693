"""torch's own runtimes: eager, torch.compile (Inductor; CUDA-graph trees per size, padded or not; Inductor's
graph partition), and `torch.cuda.make_graphed_callables`. The torch.compile-based ones reset Dynamo when they
build."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch

from pieceworks import batch_of

from .base import STATIC_ARGUMENTS, Built, Capabilities, Implementation, padded_server


class Eager(Implementation):
    name = "eager"
    contracts = {
        "cuda_graphs": "runs the model eagerly: no CUDA graphs (the reference the others are compared with)"
    }

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        return Built(model)


class Inductor(Implementation):
    """`torch.compile(model, **options)`; without options, its defaults (Inductor, no CUDA graphs, automatic
    dynamic shapes). `build` calls every given size `calls` times, largest first, so that compiles (and
    recordings) happen before anyone times the result."""

    name = "inductor"
    contracts = {"cuda_graphs": "torch.compile's defaults: Inductor kernels, no CUDA graphs"}
    options: dict[str, Any] = {}
    calls = 1

    def compile_options(self, splitting_ops: Sequence[str]) -> dict[str, Any]:
        """The keyword arguments of `torch.compile` for a model split at `splitting_ops`."""
        return self.options

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        # an earlier build of the same model with another backend must not serve this one
        torch._dynamo.reset()
        sizes = sorted(set(capture_sizes), reverse=True)
        config = torch._dynamo.config  # dynamic=False compiles once per size: let Dynamo keep them all
        config.recompile_limit = max(config.recompile_limit, len(sizes) + 8)
        compiled = torch.compile(model, **self.compile_options(splitting_ops))
        with torch.no_grad():
            for n in sizes:
                inputs = make_inputs(n)
                for _ in range(self.calls):
                    compiled(*inputs)
        if self.capabilities.needs_cuda:
            torch.cuda.synchronize()
        return Built(compiled, owner=compiled)


class _PerSizeRecording(Inductor):
    """`torch.compile(model, dynamic=False, ...)` with CUDA-graph trees: one trace, compile and recording per
    batch size, no padding. Three calls per size: the trees warm up, then record; a size not given compiles
    and records when first called."""

    capabilities = Capabilities(cuda_graphs=True, shared_pool=True, needs_cuda=True)
    contracts = {
        "padding": "records one CUDA graph per batch size (a new size compiles and records when first called)"
        " instead of padding",
        "pool": "CUDA-graph trees keep their pool private to torch: Built.pool is None, pool bytes are not "
        "observable",
    }
    calls = 3


class ReduceOverhead(_PerSizeRecording):
    """`torch.compile(model, mode="reduce-overhead", dynamic=False)`: Inductor plus CUDA-graph trees."""

    name = "reduce-overhead"
    options = {"mode": "reduce-overhead", "dynamic": False}


class InductorPartition(_PerSizeRecording):
    """`torch.compile(model, dynamic=False)` with CUDA-graph trees (reduce-overhead's `triton.cudagraphs`) and
    Inductor's graph partition told to keep the splitting ops out of the graphs (`graph_partition`,
    `custom_should_partition_ops`): stock torch.compile as a piecewise runtime, one recording per batch
    size."""

    name = "inductor-partition"
    capabilities = Capabilities(cuda_graphs=True, piecewise=True, shared_pool=True, needs_cuda=True)

    def unavailable_reason(self) -> str | None:
        if not hasattr(torch._inductor.config, "custom_should_partition_ops"):
            return (
                "inductor-partition needs Inductor's custom_should_partition_ops, which torch "
                f"{torch.__version__} lacks. Fix: use a torch with it (2.10 or later)"
            )
        return super().unavailable_reason()

    def compile_options(self, splitting_ops):
        return {
            "dynamic": False,
            "options": {
                "triton.cudagraphs": True,
                "graph_partition": True,
                "custom_should_partition_ops": list(splitting_ops),
            },
        }


class _Padded:
    """A per-size recording peer served as an engine's model runner serves one: compiled with automatic
    dynamic shapes (a static compile, a dynamic one, and batch 1's), one CUDA graph recorded per capture size,
    and every batch padded to the next capture size in static buffers (`padded_server`); above the largest,
    run as called."""

    capabilities = Capabilities(cuda_graphs=True, padding=True, shared_pool=True, needs_cuda=True)

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        sizes = sorted(set(capture_sizes))
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in make_inputs(sizes[-1])]

        def views(n: int) -> list[Any]:
            return [a[:n] if isinstance(a, torch.Tensor) else a for a in static]

        built = super().build(model, views, sizes, splitting_ops)
        return Built(padded_server(sizes, static, lambda n: built(*views(n)), built), owner=(built, static))


class ReduceOverheadPadded(_Padded, ReduceOverhead):
    name = "reduce-overhead-padded"
    options = {"mode": "reduce-overhead"}
    contracts = {
        "pool": ReduceOverhead.contracts["pool"],
        "argument_writes": STATIC_ARGUMENTS.format("the adapter (an engine's model runner)"),
    }


class InductorPartitionPadded(_Padded, InductorPartition):
    name = "inductor-partition-padded"
    capabilities = dataclasses.replace(_Padded.capabilities, piecewise=True)
    contracts = ReduceOverheadPadded.contracts

    def compile_options(self, splitting_ops):
        return {
            key: value for key, value in super().compile_options(splitting_ops).items() if key != "dynamic"
        }


class DynamoCudagraphs(_PerSizeRecording):
    """`torch.compile(model, backend="cudagraphs", dynamic=False)`: AOT eager (no Inductor) plus CUDA-graph
    trees."""

    name = "dynamo-cudagraphs"
    options = {"backend": "cudagraphs", "dynamic": False}


class GraphedCallables(Implementation):
    """`torch.cuda.make_graphed_callables`: one graphed callable per captured size (each in a pool of its
    own), largest first; any other size runs the eager model. The model is passed as a plain function, so
    torch neither replaces its `forward` nor treats its parameters as inputs. Every argument must be a
    tensor."""

    name = "make-graphed-callables"
    capabilities = Capabilities(cuda_graphs=True, needs_cuda=True)
    contracts = {
        "padding": "one graphed callable per captured size; other sizes run eagerly: no padding",
        "shared_pool": "each graphed callable captures into a pool of its own",
        "argument_writes": STATIC_ARGUMENTS.format("a graphed callable"),
    }

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        sizes = sorted(set(capture_sizes), reverse=True)
        start = time.perf_counter()
        with torch.no_grad():
            graphed = {
                n: torch.cuda.make_graphed_callables(lambda *args: model(*args), tuple(make_inputs(n)))
                for n in sizes
            }
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start

        def serve(*args: Any) -> Any:
            return graphed.get(batch_of(args), model)(*args)

        return Built(serve, capture_order=sizes, capture_seconds=seconds, owner=graphed)
