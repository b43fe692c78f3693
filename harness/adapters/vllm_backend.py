"""vLLM's compilation backend, driven as vLLM's model runner drives it (vLLM pins a torch of its own: it runs
only where that torch is installed)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from .base import STATIC_ARGUMENTS, Built, Capabilities, Implementation, missing, padded_server


class VLLM(Implementation):
    """vLLM's compilation backend, driven as vLLM's model runner drives it: the model behind
    `@support_torch_compile` (at most 4 tensor arguments, dim 0 dynamic) under a `VllmConfig` with
    `CompilationMode.VLLM_COMPILE`, PIECEWISE graphs, the splitting ops and capture sizes; each call under
    `set_forward_context` with the runtime mode and a `BatchDescriptor(num_tokens=n)`. `build` compiles with
    one run under NONE, then captures each size largest first; served by `padded_server`, above the largest
    size under NONE. Written against vLLM's 0.11 API."""

    name = "vllm"
    capabilities = Capabilities(
        cuda_graphs=True, padding=True, piecewise=True, shared_pool=True, needs_cuda=True
    )
    contracts = {
        "pool": "vLLM captures into one graph pool global to the process "
        "(current_platform.get_global_graph_pool()): not observable per model",
        "compile_cache": "vLLM keeps its own compile cache (~/.cache/vllm/torch_compile_cache); this adapter "
        "does not observe its compiles",
        "argument_writes": STATIC_ARGUMENTS.format("vLLM's model runner"),
    }

    def unavailable_reason(self) -> str | None:
        exc = missing("vllm")
        if exc:
            return (
                f"vllm is not importable here ({exc}). vLLM pins a torch build of its own and is installed "
                "from the network, so it cannot be installed on a machine without network access. Fix: pip "
                "install vllm in an environment whose torch is the one vLLM pins, and run there"
            )
        return super().unavailable_reason()

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        from vllm.compilation.decorators import support_torch_compile
        from vllm.config import (
            CompilationConfig,
            CompilationMode,
            CUDAGraphMode,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.forward_context import BatchDescriptor, set_forward_context

        sizes = sorted(set(capture_sizes))
        static = [a.clone() for a in make_inputs(sizes[-1])]
        if len(static) > 4:
            raise ValueError(
                f"the vllm adapter takes models of at most 4 tensor arguments, not {len(static)}"
            )
        vllm_config = VllmConfig(
            compilation_config=CompilationConfig(
                mode=CompilationMode.VLLM_COMPILE,
                cudagraph_mode=CUDAGraphMode.PIECEWISE,
                splitting_ops=list(splitting_ops),
                cudagraph_capture_sizes=sizes,
            )
        )

        class Wrapped(torch.nn.Module):
            def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
                super().__init__()
                self.inner = model

            def forward(self, a0, a1=None, a2=None, a3=None):
                return self.inner(*(a0, a1, a2, a3)[: len(static)])

        with set_current_vllm_config(vllm_config):
            dims = {f"a{i}": 0 for i in range(len(static))}
            compiled = support_torch_compile(dynamic_arg_dims=dims)(Wrapped)(
                vllm_config=vllm_config, prefix=""
            )

        def run(args: Sequence[Any], n: int | None) -> Any:
            mode = CUDAGraphMode.NONE if n is None else CUDAGraphMode.PIECEWISE
            with (
                set_current_vllm_config(vllm_config),
                set_forward_context(
                    None,
                    vllm_config,
                    cudagraph_runtime_mode=mode,
                    batch_descriptor=None if n is None else BatchDescriptor(num_tokens=n),
                ),
            ):
                return compiled(*args)

        def replay(n: int) -> Any:
            return run([s[:n] for s in static], n)

        start = time.perf_counter()
        with torch.no_grad():
            run(static, None)  # trace and compile
            for n in reversed(sizes):
                replay(n)
        if static[0].is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return Built(
            padded_server(sizes, static, replay, lambda *args: run(args, None)),
            capture_order=sizes[::-1],
            capture_seconds=seconds,
            owner=(compiled, static),
        )
