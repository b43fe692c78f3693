"""Capture and replay of one compiled graph: the per-size choice between a FULL graph, a PIECEWISE plan and no
graph.

A `Runtime` is built complete over a `CompiledGraph` (backend.py) and owns, alone, everything that changes
while serving: the capture pool (`CapturePool`, which owns its handle), the phase, and `replay_for(n)`: the
`FullGraph` or PIECEWISE `ReplayPlan` (plan.py) captured for padded batch size n. A size without one runs the
stitching module without graphs. Nothing outside this class writes its state.

Batch kinds (batch_kind.py): a call is uniform decode (inside `pieceworks.uniform_decode()`) or mixed; the
mode gives each kind its own (`mode_for(uniform)`: FULL, PIECEWISE or NONE), so a size may hold two replays, a
FULL graph for uniform decode and a PIECEWISE plan for mixed batches (FULL_AND_PIECEWISE), or one shared by
both kinds. The mode is first lowered to what the graph's splitting ops declare (`declare_graph_support`),
logged once: FULL becomes FULL_AND_PIECEWISE under an op that supports uniform decode only, and every full
mode becomes PIECEWISE (NONE for FULL_DECODE_ONLY) under one that supports no graph.

Phases (`Phase`): WAITING (from construction until `capture()`: calls run without graphs and capture nothing),
CAPTURING (inside `capture()` or one lazy capture: a call at a capture size not yet attempted captures it),
SERVING (a size without a graph follows `on_missing_graph`, or, with `lazy_capture`, is captured on first
sight; a runtime with `lazy_capture` starts here).

`run(args, batch, static)` is the one way in. `args` are the graph's flat inputs. `static=True`: the caller
guarantees that tensor inputs sit where they sat at capture (static buffers: `pieceworks.compile`), so replays
check no address (`debug_replay_checks` checks all of them, parameters included); `static=False`: the caller's
own tensors (the raw backend), so every replay checks the addresses of the caller-owned inputs its graphs read
and raises `ReplayAddressError` rather than read stale memory. `runtime(*args)` is Dynamo's entry: `run(args,
batch, False)`.

Memory and ordering: every graph goes into one pool, sizes largest first, so smaller sizes reuse the larger
ones' blocks; replay outputs alias pool memory and are valid until the next replay. Not thread-safe: one call
at a time.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ._compat import op_identity
from .batch_kind import GraphSupport, _uniform, graph_support, uniform_decode
from .config import CompilationConfig, CUDAGraphMode
from .counters import counters
from .cudagraph import CapturePool, pool_bytes
from .plan import FullGraph, ReplayPlan, record_plan
from .progress import progress

if TYPE_CHECKING:
    from .backend import CompiledGraph

log = logging.getLogger("pieceworks")


class CUDAGraphMissingError(RuntimeError):
    """A batch size that should have a CUDA graph has none, and `on_missing_graph="raise"`."""


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
        mine = torch.tensor([modes.index(mode), len(sizes), *sizes], device=device if "nccl" in str(
            dist.get_backend()) else "cpu")  # tensors, not objects: no pickle, no numpy
        dist.all_reduce(width := mine.new_tensor([mine.numel()]), dist.ReduceOp.MAX)
        dist.all_gather(found := [mine.new_zeros(int(width)) for _ in range(dist.get_world_size())],
                        torch.nn.functional.pad(mine, (0, int(width) - mine.numel())))
        plans = [(modes[m].name, rest[:n]) for m, n, *rest in (t.tolist() for t in found)]
        if differ := "; ".join(f"rank {r}: {m} {s}" for r, (m, s) in enumerate(plans) if (m, s) != plans[0]):
            raise CaptureMismatchError(
                f"ranks would capture different CUDA graphs (mode, sizes largest first), rank 0: "
                f"{plans[0][0]} {plans[0][1]}; {differ}: their collectives would wait forever. Fix: the same "
                "cudagraph_mode, cudagraph_capture_sizes and capture() sizes on every rank")


class Phase(enum.Enum):
    WAITING = "waiting"
    CAPTURING = "capturing"
    SERVING = "serving"


def capture_order(sizes: Iterable[int]) -> list[int]:
    """The order sizes are captured in: largest first, so that smaller ones reuse the pool blocks it
    leaves."""
    return sorted(set(sizes), reverse=True)


def effective_mode(config: CompilationConfig, graph: CompiledGraph) -> CUDAGraphMode:
    """The mode a graph gets: `config.cudagraph_mode`, except NONE without CUDA (warned once), FULL (or
    PIECEWISE's one piece, captured per size as a FULL graph would be) where no splitting op split the
    graph, and lowered to what the splitting ops' declared graph support allows (batch_kind.py; logged
    once)."""
    mode = config.cudagraph_mode
    if mode is CUDAGraphMode.NONE:
        return mode
    if not any(isinstance(v, torch.Tensor) and v.is_cuda for v in graph.inputs):  # (implied without CUDA)
        where = "the graph's inputs are not on CUDA" if torch.cuda.is_available() else "CUDA is not available"
        log.warning("pieceworks: cudagraph_mode=%s but %s: running without CUDA graphs (set "
                    "cudagraph_mode=NONE to silence this)", mode.name, where)
        return CUDAGraphMode.NONE
    if mode.has_piecewise and not any(p.is_splitting_graph for p in graph.pieces):  # vLLM's behaviour
        log.info("pieceworks: cudagraph_mode=%s and no splitting op in the graph (splitting_ops=%s): %s",
                 mode.name, config.splitting_ops, "FULL covers it" if mode.has_full else
                 "its one piece is captured per size, as a FULL graph would be")
        return CUDAGraphMode.FULL if mode.has_full else mode
    ops = {op_identity(n.target)[0] for p in graph.pieces if p.is_splitting_graph for n in p.graph.graph.nodes
           if n.op == "call_function" and op_identity(n.target) is not None}
    support, op = graph_support(ops)
    lowered = supported_mode(mode, support)
    if lowered is not mode:
        log.warning("pieceworks: cudagraph_mode=%s lowered to %s: splitting op %s declares graph support %s "
                    "(a full graph may not hold it for %s)", mode.name, lowered.name, op, support.name,
                    "mixed batches" if support is GraphSupport.UNIFORM_DECODE else "any batch")
    return lowered


def supported_mode(mode: CUDAGraphMode, support: GraphSupport) -> CUDAGraphMode:
    """`mode` lowered to what splitting ops of `support` allow (vLLM's downgrades): under UNIFORM_DECODE,
    FULL becomes FULL_AND_PIECEWISE (the other modes' full graphs serve uniform decode only already); under
    NEVER, every mode with full graphs becomes PIECEWISE, FULL_DECODE_ONLY NONE (it asked for no piecewise
    graphs)."""
    if not mode.has_full or support is GraphSupport.ALWAYS:
        return mode
    if support is GraphSupport.UNIFORM_DECODE:
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode is CUDAGraphMode.FULL else mode
    return CUDAGraphMode.NONE if mode is CUDAGraphMode.FULL_DECODE_ONLY else CUDAGraphMode.PIECEWISE


class Runtime:
    """Capture and replay of one `CompiledGraph`; see the module doc.

    Public view (read it; only this object writes it): `graph`, `config`, `mode` (`effective_mode`), `pool`,
    `phase`, `full_reason` (why there are no FULL graphs, or None where there are), `mode_for(uniform)`,
    `captured_sizes` and `replay_for(n, uniform)`."""

    def __init__(self, graph: CompiledGraph, config: CompilationConfig) -> None:
        self.graph = graph
        self.config = config
        self.pool = CapturePool(config.cudagraph_num_warmups)
        self.mode = effective_mode(config, graph)
        self.phase = Phase.SERVING if config.lazy_capture else Phase.WAITING
        # per (padded size, uniform decode): its FULL graph or PIECEWISE plan, in the order they were captured
        self._replays: dict[tuple[int, bool], FullGraph | ReplayPlan] = {}
        self._attempted: set[tuple[int, bool]] = set()
        self._kind_modes = {True: self.mode.decode_mode, False: self.mode.mixed_mode}
        self._warned: set[int] = set()
        self._sizes = list(config.cudagraph_capture_sizes)
        self._max_size = max(self._sizes, default=0)
        self._debug = config.debug_replay_checks
        compiled = [p for p in graph.pieces if not p.is_splitting_graph] if self.mode.has_piecewise else []
        for piece in (p for p in compiled if p.piecewise_refusal is not None):
            counters.num_cudagraph_uncapturable += 1
            log.warning("pieceworks: piece %s runs without a CUDA graph: %s", piece.submod_name,
                        piece.piecewise_refusal)
        self._graph_pieces = {p.submod_name: p for p in compiled if p.piecewise_refusal is None}
        self.full_reason = None if self.mode.has_full else "mode has no FULL graphs"
        why = next((f"piece {p.submod_name}: {p.uncapturable}" for p in graph.pieces if p.uncapturable), "")
        if self.mode.has_full and why:
            self._no_full(why)

    def _no_full(self, reason: str) -> None:
        """No FULL graphs, for `reason` (counted, logged): kinds meant for them get PIECEWISE plans instead
        (no graphs where no piece can have one)."""
        self.full_reason = reason
        counters.num_cudagraph_uncapturable += 1
        log.warning("pieceworks: no FULL CUDA graph: %s", reason)
        instead = CUDAGraphMode.PIECEWISE if self._graph_pieces else CUDAGraphMode.NONE
        self._kind_modes = {k: instead if m is CUDAGraphMode.FULL else m for k, m in self._kind_modes.items()}

    def mode_for(self, uniform: bool) -> CUDAGraphMode:
        """What serves a batch of this kind (uniform decode or mixed): FULL, PIECEWISE or NONE (no graph)."""
        return self._kind_modes[uniform]

    def _capture_kinds(self) -> list[bool]:
        """The kinds a capture phase captures per size: one capture where both kinds share a mode (under
        the mixed kind: a graph both may replay), else each kind with graphs, uniform decode (FULL) first."""
        modes = self._kind_modes
        if modes[True] is modes[False]:
            return [] if modes[False] is CUDAGraphMode.NONE else [False]
        return [k for k in (True, False) if modes[k] is not CUDAGraphMode.NONE]

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """The sizes with a graph or plan (of either kind), in the order they were captured."""
        return tuple(dict.fromkeys(size for size, _ in self._replays))

    def replay_for(self, size: int, uniform: bool | None = None) -> FullGraph | ReplayPlan | None:
        """The FULL graph or PIECEWISE plan that serves padded batch size `size` of kind `uniform`
        (default: the kind of the call under way, `pieceworks.is_uniform_decode()`), or None."""
        return self._replays.get((size, _uniform[0] if uniform is None else uniform))

    # ---- calls --------------------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        batch = self.graph.batch
        return self.run(args, None if batch is None else batch.read(args), static=False)

    def run(self, args: Sequence[Any], batch: int | None, static: bool) -> Any:
        """Replay the graph captured for `batch` and the call's kind, capture it, or run without graphs;
        see the module doc."""
        key = (batch, _uniform[0])
        replay = self._replays.get(key)
        if replay is not None:
            checks = replay.all_checks if self._debug else () if static else replay.cheap_checks
            return replay.run(args, checks)
        if self.phase is not Phase.WAITING and batch is not None and batch <= self._max_size \
                and self._kind_modes[key[1]] is not CUDAGraphMode.NONE and key not in self._attempted:
            if batch in self._sizes and (self.phase is Phase.CAPTURING or self.config.lazy_capture):
                return self._capture_size(batch, args, key[1])
            if self.phase is Phase.SERVING and self.config.on_missing_graph == "raise":
                raise CUDAGraphMissingError(
                    f"batch size {batch} has no CUDA graph (captured: {sorted(self._replays)}). Fix: pad "
                    f"batches to a captured size (pieceworks.compile does), capture this size, or set "
                    f"on_missing_graph='eager'")
            if self.phase is Phase.SERVING and batch not in self._warned:
                self._warned.add(batch)
                log.warning("pieceworks: batch size %d has no CUDA graph; running it without one", batch)
        return self.graph.split_module(*args)

    # ---- capture ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _capturing(self) -> Iterator[None]:
        """Phase CAPTURING, then SERVING. gc is frozen and disabled for the phase: no collection during
        capture can unload a module a graph uses, and none slows the phase down. Nothing is collected first
        (a full collection of a process that holds a compiler costs ~0.2 s): what is garbage now is
        collected after the phase."""
        self.phase = Phase.CAPTURING
        enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            yield
        finally:
            gc.unfreeze()
            if enabled:
                gc.enable()
            self.phase = Phase.SERVING

    def _capture_size(self, batch: int, args: Sequence[Any], uniform: bool) -> Any:
        """Capture the graph of one batch size and kind from `args` (which stay where they are); return
        this call's outputs. FULL where the kind's mode is FULL; PIECEWISE where it is PIECEWISE or FULL
        failed. The replay serves every kind whose mode is the same. Outside `capture()` (a lazy capture)
        it is a phase of its own."""
        split_gm, kind = self.graph.split_module, self._kind_modes[uniform]
        self._attempted.add((batch, uniform))
        with self._capturing() if self.phase is Phase.SERVING else contextlib.nullcontext():
            if kind is CUDAGraphMode.FULL and self.full_reason is None:
                try:  # a lazy capture is a served call: it puts back every mutated input
                    graph, out = self.pool.capture(split_gm, args, self.graph.mutated_inputs
                                                   if self.config.lazy_capture
                                                   else self.graph.restored_inputs)
                except Exception as exc:  # noqa: BLE001 - a refused capture falls back, it never crashes
                    self._no_full(f"capture failed: {type(exc).__name__}: {exc}")
                    torch.cuda.synchronize()
                else:
                    full = FullGraph(batch, graph, out, self.graph.placeholder_names, args)
                    return self._keep(batch, kind, full, out)
            if not self._graph_pieces:
                return split_gm(*args)
            return self._keep(batch, self._kind_modes[uniform], *record_plan(
                split_gm, batch, args, self._graph_pieces, self.pool.capture_piece))

    def _keep(self, batch: int, kind: CUDAGraphMode, replay: FullGraph | ReplayPlan, out: Any) -> Any:
        """Keep `replay` for `batch` and every kind whose mode is `kind`; return `out`."""
        self._replays.update({(batch, k): replay for k, m in self._kind_modes.items() if m is kind})
        return out

    def reset(self) -> None:
        """Drop every graph and plan: the next capture phase (or, with `lazy_capture`, each size's next
        call) captures again, into a fresh pool; the old one is freed with its graphs. Earlier outputs
        become invalid."""
        self.pool.reset()
        for kept in (self._replays, self._attempted, self._warned):
            kept.clear()

    def estimate_pool(self, run_size: Callable[[int], Any], sizes: Iterable[int] | None = None,
                      samples: int = 6) -> dict[str, Any]:
        """The pool bytes a capture of `sizes` (default: every capture size) will take, before any capture:
        `samples` of them (the largest, the smallest and evenly spaced ones between, in `capture_order`)
        are captured into a pool of their own, whose `pool_bytes` is the estimate; then the sample's graphs
        and pool are freed (`torch.cuda.empty_cache()` returns its memory to the device). The pool grows
        with the kinds of blocks the sizes need, not with their number: each graph's blocks return to the
        pool when its capture ends and the next (smaller) size reuses them; a sample spanning the sizes
        meets those kinds. Call it in phase WAITING, before `capture`; `run_size` as for `capture`. Returns
        `{"pool_bytes", "sizes", "sampled_sizes", "largest_bytes" (the pool after the largest size alone),
        "seconds"}`; 0 bytes for a mode without graphs, or no sizes."""
        if self._replays:
            raise RuntimeError("estimate_pool() runs before capture(): this runtime already holds graphs. "
                               "Fix: estimate first, or call reset() to drop the graphs")
        sizes = capture_order(self._sizes if sizes is None else sizes)
        if unknown := [s for s in sizes if s not in self._sizes]:
            raise ValueError(f"sizes {unknown} are not in CompilationConfig.cudagraph_capture_sizes")
        if samples < 1:
            raise ValueError(f"samples={samples}: the estimate needs at least 1 sampled size (the largest)")
        report = dict(pool_bytes=0, sizes=len(sizes), sampled_sizes=[], largest_bytes=0, seconds=0.0)
        if not self._capture_kinds() or not sizes:
            return report
        step = (len(sizes) - 1) / max(samples - 1, 1)
        picked = sorted({sizes[round(k * step)] for k in range(min(samples, len(sizes)))}, reverse=True)
        phase, start, pools = self.phase, time.perf_counter(), []
        self.pool.reset()
        try:
            with self._capturing():
                for k, size in enumerate(picked):  # the pool after the largest size alone, and at the end
                    self._capture_kinds_of(run_size, size)
                    if k in (0, len(picked) - 1):
                        torch.cuda.synchronize()
                        pools.append(pool_bytes(self.pool.handle))
        finally:
            self.reset()
            gc.collect()  # the sample's graphs hold the pool; freed now, returned to the device below
            torch.cuda.empty_cache()
            self.phase = phase
        report.update(pool_bytes=pools[-1], sampled_sizes=picked, largest_bytes=pools[0],
                      seconds=time.perf_counter() - start)
        log.info("pieceworks capture estimate: %d sizes will take about %.1f MiB of graph pool (sampled %s "
                 "in %.2f s)", len(sizes), report["pool_bytes"] / 2**20, picked, report["seconds"])
        return report

    def _capture_kinds_of(self, run_size: Callable[[int], Any], size: int) -> None:
        """`run_size(size)` once per kind `_capture_kinds` names, each inside `uniform_decode(kind)`."""
        for uniform in self._capture_kinds():
            with uniform_decode(uniform):
                run_size(size)

    def capture(self, run_size: Callable[[int], Any], sizes: Iterable[int] | None = None) -> dict[str, Any]:
        """The capture phase: `run_size(n)` for every size in `sizes` (default: every capture size), in
        `capture_order`; each call at a size not yet attempted captures it. Then serving starts: no size is
        captured again (unless `lazy_capture`). `run_size(n)` must call the model with arguments that stay
        where they are for every later replay. gc is frozen for the phase. A graph holding collectives
        (`_c10d_functional` ops) first checks that every rank captures the same (`check_ranks_agree`).
        Returns the phase's numbers (sizes, seconds, MiB, graphs)."""
        sizes = capture_order(self._sizes if sizes is None else sizes)
        if any(str(n.target).startswith("_c10d_functional.") for p in self.graph.pieces
               for n in p.graph.graph.nodes):
            check_ranks_agree(self.mode, sizes, next(
                (v.device for v in self.graph.inputs if isinstance(v, torch.Tensor) and v.is_cuda), None))
        report = {"sizes": len(sizes), "seconds": 0.0, "free_delta_mib": 0.0, "reserved_delta_mib": 0.0,
                  "graphs": 0, "mode": self.mode.name}
        if not self._capture_kinds() or not sizes:
            log.info("pieceworks capture: nothing to capture (mode %s, %d sizes)", self.mode.name, len(sizes))
            self.phase = Phase.SERVING
            return report
        if unknown := [s for s in sizes if s not in self._sizes]:
            raise ValueError(f"sizes {unknown} are not in CompilationConfig.cudagraph_capture_sizes")
        torch.cuda.synchronize()
        free, reserved = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
        graphs, start = counters.num_cudagraph_captured, time.perf_counter()
        with self._capturing():
            for size in progress(sizes, "capture sizes"):
                self._capture_kinds_of(run_size, size)
        torch.cuda.synchronize()
        report.update(seconds=time.perf_counter() - start, graphs=counters.num_cudagraph_captured - graphs,
                      free_delta_mib=(free - torch.cuda.mem_get_info()[0]) / 2**20,
                      reserved_delta_mib=(torch.cuda.memory_reserved() - reserved) / 2**20)
        log.info("pieceworks capture: %d sizes (%d..%d), mode %s, %d graphs in %.2f s, %.1f MiB (device "
                 "free-memory delta), %.1f MiB (allocator reserved delta)", len(sizes), sizes[0], sizes[-1],
                 self.mode.name, report["graphs"], report["seconds"], report["free_delta_mib"],
                 report["reserved_delta_mib"])
        return report
