"""CUDA-graph capture and replay of one runnable (a compiled piece, or the whole model for FULL) per batch size.

Contracts (the ones vLLM's users rely on):
- **One pool.** Every graph of a model is captured into one private memory pool on one side stream, sizes largest
  first, so smaller sizes reuse the blocks the larger ones left free.
- **Outputs are valid until the next replay.** A runner keeps only non-owning aliases of the tensors a capture
  produced: once the capture's forward pass drops them, their blocks return to the pool and later captures reuse
  them. A replay returns those aliases; the next replay of any graph in the pool may overwrite them. Clone what you
  keep (the harness's checked mode catches violations).
- **Inputs must sit where they were captured.** A graph reads the addresses it saw at capture. Before each replay
  the runner compares `data_ptr()`s: by default of the inputs whose address is not guaranteed (caller-owned inputs
  and the outputs of splitting ops, a handful per piece), in debug mode of every tensor input. A moved input raises
  `ReplayAddressError` naming the piece and the input; nothing is computed from stale memory.
- **Capture is a phase.** Graphs are captured only while `CaptureState.capturing` is set (the capture phase, or a
  lazy capture of one size); afterwards a runner never captures: a size it has no graph for runs without one.
- Not thread-safe: one forward pass at a time per model, as CUDA-graph replay of a shared pool requires.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .counters import counters

__all__ = ["CaptureState", "CUDAGraphRunner", "ReplayAddressError", "non_owning_alias"]

log = logging.getLogger("pieceworks")


class ReplayAddressError(RuntimeError):
    """A CUDA graph was about to replay with an input that is not at the address it was captured with."""


class _DeviceMemory:
    """Exposes a device pointer through `__cuda_array_interface__`, so `torch.as_tensor` can view it."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (pointer, False), "version": 3, "strides": None,
        }


def non_owning_alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor viewing `t`'s memory without keeping it allocated (public APIs only: CUDA array interface).

    When every owning reference to `t`'s storage is gone, the allocator may hand its blocks out again; the alias
    then sees whatever is written there. That is the point: see the module contract.
    """
    if not t.is_cuda or t.numel() == 0:
        return t
    storage = t.untyped_storage()
    with torch.cuda.device(t.device):
        raw = torch.as_tensor(_DeviceMemory(storage.data_ptr(), storage.nbytes()), device=t.device)
    return raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def _aliases(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return non_owning_alias(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_aliases(v) for v in value)
    return value


class CaptureState:
    """What all runners of one model share: the pool, the capture stream, and the per-call mode switches."""

    def __init__(self, debug_checks: bool = False) -> None:
        self.pool: Any = None
        self.stream: torch.cuda.Stream | None = None
        self.warmup_pool: Any = None
        self.capturing = False
        self.piecewise_active = False  # set per call by PiecewiseGraph: piece runners act only while True
        self.debug_checks = debug_checks
        self.num_warmups = 1

    def ensure_pool(self) -> None:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream()
            # Warm-ups run with their allocations routed here (see `warmup_allocations`).
            self.warmup_pool = torch.cuda.MemPool() if hasattr(torch.cuda, "MemPool") else None

    def warmup_allocations(self) -> Any:
        """Where warm-up runs allocate: a MemPool of this model's own.

        The first GEMM on the capture stream allocates that stream's cuBLAS workspaces (32 MiB each on an H100), and
        every captured GEMM keeps their address. Allocated in the graph pool they would pin it for the life of the
        process; allocated in the default pool they would be freed under the graphs by anyone who clears cuBLAS
        workspaces and empties the cache (`torch.compile(mode="reduce-overhead")` does, at each recording), and the
        next replay faults. A MemPool of our own is never handed to other allocations and never emptied while alive.
        """
        if self.warmup_pool is None:
            return contextlib.nullcontext()
        return torch.cuda.use_mem_pool(self.warmup_pool)


class _Entry:
    __slots__ = ("graph", "outputs", "addresses", "batch")

    def __init__(self, graph: torch.cuda.CUDAGraph, outputs: Any, addresses: list[int], batch: int) -> None:
        self.graph = graph
        self.outputs = outputs
        self.addresses = addresses
        self.batch = batch


class CUDAGraphRunner:
    """Replays `runnable` from a CUDA graph per batch size; runs it directly where it has no graph.

    `checked_inputs`: indices of the tensor arguments whose address is compared before every replay (all tensor
    arguments when `state.debug_checks`). `uncapturable`: a reason, if the runnable must never be captured.
    """

    def __init__(
        self,
        runnable: Callable[..., Any],
        name: str,
        state: CaptureState,
        locate_batch: Callable[[Sequence[Any]], int | None],
        checked_inputs: Sequence[int],
        input_names: Sequence[str],
        uncapturable: str | None = None,
        mutated_inputs: Sequence[int] = (),
    ) -> None:
        self.runnable = runnable
        self.name = name
        self.state = state
        self.locate_batch = locate_batch
        self.checked_inputs = list(checked_inputs)
        self.input_names = list(input_names)
        self.uncapturable = uncapturable
        self.mutated_inputs = list(mutated_inputs)
        self.entries: dict[int, _Entry] = {}

    def __call__(self, *args: Any) -> Any:
        """As a piece of the stitching module: replay or capture while PIECEWISE is active, else run plainly."""
        state = self.state
        if state.piecewise_active:
            entry = self.entries.get(self.locate_batch(args))
            if entry is not None:
                return self.replay(entry, args)
            if state.capturing and self.uncapturable is None:
                return self.capture(args)
        return self.runnable(*args)

    def replay(self, entry: _Entry, args: Sequence[Any]) -> Any:
        indices = range(len(args)) if self.state.debug_checks else self.checked_inputs
        addresses = entry.addresses
        for i in indices:
            a = args[i]
            if isinstance(a, torch.Tensor) and a.data_ptr() != addresses[i]:
                self._moved(entry, i, a)
        entry.graph.replay()
        return entry.outputs

    def _moved(self, entry: _Entry, i: int, a: torch.Tensor) -> None:
        raise ReplayAddressError(
            f"{self.name}: input {i} ({self.input_names[i]}) is at {a.data_ptr():#x}, but the CUDA graph for batch "
            f"size {entry.batch} was captured reading {entry.addresses[i]:#x}; replaying would read stale memory. "
            f"Fix: keep inputs in static buffers (pieceworks.compile does this for model inputs), and make "
            f"splitting ops write into buffers allocated by the piece before them instead of returning new tensors"
        )

    def capture(self, args: Sequence[Any]) -> Any:
        """Warm up, capture into the shared pool, replay once; return the owning outputs of the capture."""
        batch = self.locate_batch(args)
        state = self.state
        state.ensure_pool()
        graph = torch.cuda.CUDAGraph()
        stream = state.stream
        stream.wait_stream(torch.cuda.current_stream())
        # Warm-ups really run: inputs the runnable writes to in place are put back before the capture, so that
        # the one replay below is the only write this call makes (a lazy capture serves a real request).
        saved = [(i, args[i].clone()) for i in self.mutated_inputs if isinstance(args[i], torch.Tensor)]
        with torch.cuda.stream(stream):
            with state.warmup_allocations():  # on the capture stream, so its library workspaces are made here
                for _ in range(state.num_warmups):
                    self.runnable(*args)
            for i, value in saved:
                args[i].copy_(value)
            del saved
            graph.capture_begin(pool=state.pool)
            try:
                outputs = self.runnable(*args)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()  # the capture recorded work without doing it; compute this call's real outputs
        addresses = [a.data_ptr() if isinstance(a, torch.Tensor) else 0 for a in args]
        self.entries[batch] = _Entry(graph, _aliases(outputs), addresses, batch)
        counters.num_cudagraph_captured += 1
        return outputs

    def reset(self) -> None:
        """Drop every graph (their pool blocks are freed once no graph of the pool is left)."""
        self.entries.clear()
