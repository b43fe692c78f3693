"""Capturing one runnable into a CUDA graph, and the address checks every replay path shares.

Contracts (the ones vLLM's users rely on):
- **One pool.** Every graph of a model is captured into one private memory pool (`CapturePool.handle`) on one
  side stream, sizes largest first (the runtime's order), so smaller sizes reuse the blocks the larger ones
  left free.
- **Warm-ups** (`num_warmups` runs before a capture: lazy initialisation such as loading kernels, Triton's
  autotuning and the capture stream's cuBLAS workspace must not happen inside one) run on the capture stream
  with their allocations routed to a `MemPool` of the model's own, so the stream's cuBLAS workspaces, which
  captured GEMMs keep using, are neither pinned in the graph pool nor freed under the graphs when other code
  empties the cache. Lazy work depends on the code and the shapes (cuBLAS picks other kernels, and may
  allocate a workspace, for other sizes), so every size warms up. A compiled piece whose runnable already
  warmed up at this size in this pool (an identical piece: a transformer's middle layers share one) is
  captured without (`capture_piece`): same code, same shapes, same stream. Inputs the runnable writes to in
  place are put back after the warm-ups, so the replay that follows the capture is the only write a capture
  makes.
- **Outputs are valid until the next replay.** Callers keep only `non_owning_alias`es of what a capture
  produced: once the capture's own references are dropped, the blocks return to the pool and later captures
  reuse them; the next replay of any graph in the pool may overwrite them.
- **Inputs must sit where they were captured.** `check_addresses` compares `data_ptr()`s before a replay and
  raises `ReplayAddressError` naming the graph and the input; nothing is computed from stale memory.
- **A failed capture leaves the process healthy** (`_captured`): the stream capture is ended and the allocator
  stops routing to the pool before the error reaches the caller, so memory frees; later captures begin in a
  fresh pool (`reset`), since the allocator may have forgotten the failed capture's.
- Not thread-safe: one forward pass at a time per model.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from . import _compat
from .config import CUDAGraphMode
from .counters import counters


class ReplayAddressError(RuntimeError):
    """A CUDA graph was about to replay with an input that is not at the address it was captured with."""


def non_owning_alias(value: Any) -> Any:
    """A tensor viewing `value`'s memory without keeping it allocated (public APIs only: CUDA array
    interface); anything else unchanged. When every owning reference is gone, the allocator may hand the
    blocks out again and the alias sees whatever is written there: that is the point (see the module
    contract)."""
    if not isinstance(value, torch.Tensor) or not value.is_cuda or value.numel() == 0:
        return value
    storage = value.untyped_storage()
    # The storage's bytes, exposed through the CUDA array interface so that `torch.as_tensor` views them.
    data = (storage.data_ptr(), False)
    interface = {"shape": (storage.nbytes(),), "typestr": "|u1", "data": data, "version": 3, "strides": None}
    with torch.cuda.device(value.device):
        raw = torch.as_tensor(types.SimpleNamespace(__cuda_array_interface__=interface), device=value.device)
    return raw.view(value.dtype).as_strided(value.shape, value.stride(), value.storage_offset())


def pool_bytes(pool: Any) -> int:
    """Bytes of the caching allocator's segments that belong to graph pool `pool` (a
    `graph_pool_handle()`), read from `torch.cuda.memory_snapshot()`: what the graphs of that pool hold,
    nothing else. 0 for None (no pool yet)."""
    segments = torch.cuda.memory_snapshot() if pool is not None else []
    return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(pool))


class AddressCheck(NamedTuple):
    """One input a graph reads: `args[index]` must sit at `address`. `reader`, `position` and `name` say
    who reads it, for the error."""

    index: int  # type: ignore[assignment]  # a field may shadow tuple.index; mypy rejects the override
    address: int
    reader: str
    position: int
    name: str


def check_addresses(args: Sequence[Any], checks: Sequence[AddressCheck], padded_size: int) -> None:
    """Raise `ReplayAddressError` if a checked input is not at its captured address."""
    for i, address, reader, position, name in checks:
        if (pointer := args[i].data_ptr()) != address:
            raise ReplayAddressError(
                f"{reader}: input {position} ({name}) is at {pointer:#x}, but the CUDA graph for batch "
                f"size {padded_size} was captured reading {address:#x}; replaying would read stale memory. "
                f"Fix: keep inputs in static buffers (pieceworks.compile does this for model inputs) and "
                f"keep parameters where they were captured (swap weights with an in-place copy_)"
            )


def _captured(graph: torch.cuda.CUDAGraph, fn: Callable[..., Any], args: Sequence[Any], pool: Any) -> Any:
    """`fn(*args)` captured into `graph` from `pool`; returns its outputs. However the capture fails (an
    exception in `fn`, a host sync or failed launch that invalidates the stream capture, out of memory, an
    interrupt), the stream capture is ended and the allocator stops routing to the pool before the error
    propagates: a failed capture leaves the process able to free memory and to capture again. Where
    `capture_end()` raises (the capture was invalidated), the allocator's routing to `pool`, which it never
    reached, is ended too (`_compat.end_failed_capture`); its error is raised unless `fn`'s already is."""
    graph.capture_begin(pool=pool)
    ran = False
    try:
        outputs, ran = fn(*args), True
    finally:
        try:
            graph.capture_end()
        except BaseException:
            _compat.end_failed_capture(pool)
            if ran:
                raise
    return outputs


class CapturePool:
    """The pool, capture stream and warm-up MemPool of one model, created at its first capture; only this
    object writes them (read `handle`: the graph pool's `torch.cuda.graph_pool_handle()`, None before the
    first capture). Not thread-safe."""

    # made with the first handle, in `capture`
    _stream: torch.cuda.Stream
    _warmup_pool: torch.cuda.MemPool

    def __init__(self, num_warmups: int) -> None:
        self.num_warmups = num_warmups
        self.handle: Any = None
        # (runnable, padded size) `capture_piece` warmed up
        self._warmed: set[tuple[Callable[..., Any], int]] = set()

    def reset(self) -> None:
        """Start a fresh pool for later captures (same stream and warm-up MemPool): the old pool is freed
        with the last graph captured into it (the caller drops those graphs, or keeps them and it). `capture`
        resets after a failed capture: the failed one may have been its pool's one hold, and the allocator
        forgets a pool whose graphs are gone, so no capture may begin in it again."""
        if self.handle is not None:
            torch.cuda.synchronize()
            self.handle = torch.cuda.graph_pool_handle()
            self._warmed.clear()

    def capture_piece(
        self, fn: Callable[..., Any], args: Sequence[Any], mutated: Sequence[int], padded_size: int
    ) -> tuple[Any, Any]:
        """`capture` for a compiled piece's runnable at `padded_size`: warmed up only before its
        first capture at that size in this pool."""
        warmups = 0 if (fn, padded_size) in self._warmed else self.num_warmups
        self._warmed.add((fn, padded_size))
        return self.capture(fn, args, mutated, warmups)

    def capture(
        self, fn: Callable[..., Any], args: Sequence[Any], mutated: Sequence[int], warmups: int
    ) -> tuple[Any, Any]:
        """Warm `fn(*args)` up (`warmups` runs: `num_warmups`, or none where `capture_piece` says so),
        capture it into the pool, replay it once; return `(graph, owning outputs)`.

        `mutated`: positions of `args` that `fn` writes to in place, restored after the warm-ups, so the
        replay that follows the capture is the only write a capture makes.
        """
        if self.handle is None:
            self.handle = torch.cuda.graph_pool_handle()
            self._stream, self._warmup_pool = torch.cuda.Stream(), torch.cuda.MemPool()
        # Saved on the caller's stream before the capture stream waits for it: the clones complete before any
        # warm-up can write to these inputs.
        saved = [(i, args[i].clone()) for i in mutated if warmups and isinstance(args[i], torch.Tensor)]
        graph, stream = torch.cuda.CUDAGraph(), self._stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # Warm-ups allocate from a MemPool of this model's own: the first GEMM on the capture stream
            # allocates that stream's cuBLAS workspaces, which every captured GEMM keeps reading.
            with torch.cuda.use_mem_pool(self._warmup_pool):
                for _ in range(warmups):
                    fn(*args)
            for i, value in saved:
                args[i].copy_(value)
                value.record_stream(stream)  # freed below, while the copy may still be queued on this stream
            del saved
            try:
                outputs = _captured(graph, fn, args, self.handle)
            except BaseException:
                self.reset()  # the failed capture may have been its pool's one hold
                raise
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()  # the capture recorded work without doing it: compute this call's real outputs
        counters.num_cudagraph_captured += 1
        return graph, outputs


class CaptureMismatchError(RuntimeError):
    """Ranks of a process group would capture different graphs: their collectives would wait on each other
    forever."""


def check_ranks_agree(mode: CUDAGraphMode, sizes: list[int], device: torch.device | None = None) -> None:
    """Under `torch.distributed` (initialized, world size > 1), every rank calls this before it captures a
    graph that holds collectives: a `CaptureMismatchError` on every rank, naming each rank whose mode or
    sizes (in capture order) differ from rank 0's, and how. Two collectives of the world group (the widest
    plan, then every plan), on `device` (the graph's) where the group runs NCCL; a rank that never calls it
    leaves the others waiting until the group's timeout (`init_process_group(timeout=...)`)."""
    dist, modes = torch.distributed, list(CUDAGraphMode)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # tensors, not objects: no pickle, no numpy
        on = device if "nccl" in str(dist.get_backend()) else "cpu"
        mine = torch.tensor([modes.index(mode), len(sizes), *sizes], device=on)
        dist.all_reduce(width := mine.new_tensor([mine.numel()]), dist.ReduceOp.MAX)
        found = [mine.new_zeros(int(width)) for _ in range(dist.get_world_size())]
        dist.all_gather(found, torch.nn.functional.pad(mine, (0, int(width) - mine.numel())))
        plans = [(modes[m].name, rest[:n]) for m, n, *rest in (t.tolist() for t in found)]
        if differ := "; ".join(f"rank {r}: {m} {s}" for r, (m, s) in enumerate(plans) if (m, s) != plans[0]):
            raise CaptureMismatchError(
                f"ranks would capture different CUDA graphs (mode, sizes largest first), rank 0: "
                f"{plans[0][0]} {plans[0][1]}; {differ}: their collectives would wait forever. Fix: the same "
                "cudagraph_mode, cudagraph_capture_sizes and capture() sizes on every rank"
            )
