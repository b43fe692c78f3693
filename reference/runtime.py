"""The runtime of one compiled graph: the single owner of capture and replay.

A `Runtime` is what `Backend` returns for a Dynamo graph. It owns the stitching module and its compiled pieces, the
capture pool and stream (`CapturePool`), the phase, the static input buffers and call binding of
`pieceworks.compile` (`start_serving`), and the per-size choice: `replays[n]` is the FULL graph or the PIECEWISE
`ReplayPlan` captured for padded batch size n; a size without one runs the stitching module without graphs.

Phases (`Phase`): COMPILING (from construction until `capture()`, or until `start_serving` with `lazy_capture`:
calls run without graphs and capture nothing), CAPTURING (inside `capture()` or one lazy capture: calls at a capture
size not yet attempted capture it), SERVING (a size without a graph follows `on_missing_graph`, or is captured on
first sight with `lazy_capture`). Only this class changes its phase.

Two entries: `runtime(*flat_args)` is Dynamo's (the raw backend, and `pieceworks.compile`'s fallback): arguments
are the caller's, so every replay checks the addresses of the inputs its graphs read. `serve(args, batch)` is
`pieceworks.compile`'s: it copies the call into static buffers, pads, calls the graph with parameters bound once
(no Dynamo frame), copies in-place writes back to the caller's tensors and cuts the outputs back to the batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import logging
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.fx

from ._compat import example_value, symbol_name
from .binding import Binder, bind
from .capturability import input_provenance, mutated_inputs, uncapturable_reason
from .config import CompilationConfig, CUDAGraphMode
from .counters import counters
from .cudagraph import AddressCheck, CapturePool, check_addresses, non_owning_alias
from .dispatch import padded_size
from .padding import StaticInputs, batched_outputs, unpad
from .piece import BatchLocator, CompiledPiece
from .plan import GraphPiece, ReplayPlan, record_plan
from .split import SplitItem
from .values import tree_map

__all__ = ["Runtime", "Phase", "PieceSpec", "FullGraph", "CUDAGraphMissingError"]

log = logging.getLogger("pieceworks")


class CUDAGraphMissingError(RuntimeError):
    """A batch size that should have a CUDA graph has none, and `on_missing_graph="raise"`."""


class Phase(enum.Enum):
    COMPILING = "compiling"
    CAPTURING = "capturing"
    SERVING = "serving"


@dataclasses.dataclass
class PieceSpec:
    item: SplitItem
    compiled: CompiledPiece
    example_args: tuple  # FakeTensors/SymInts of the trace


class FullGraph:
    """The FULL graph of one batch size: one replay over the whole stitching module."""

    def __init__(self, batch: int, graph: Any, outputs: Any, cheap_checks: list[AddressCheck],
                 all_checks: list[AddressCheck]) -> None:
        self.batch = batch
        self.graph = graph
        self.outputs = tree_map(non_owning_alias, outputs)
        self.cheap_checks = cheap_checks
        self.all_checks = all_checks

    def run(self, args: Sequence[Any], checks: Sequence[AddressCheck]) -> Any:
        if checks:
            check_addresses(args, checks, self.batch)
        self.graph.replay()
        return self.outputs


@contextlib.contextmanager
def _gc_frozen() -> Iterator[None]:
    """gc collected once, then frozen and disabled: no collection during capture can unload a module a graph uses,
    and no per-piece gc.collect slows the phase down."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


class Runtime:
    """Capture and replay of one compiled graph; see the module doc. Not thread-safe: one call at a time."""

    def __init__(
        self, split_gm: torch.fx.GraphModule, specs: Sequence[PieceSpec], items: Sequence[SplitItem],
        locate_batch: BatchLocator, example_inputs: Sequence[Any], mutated: Sequence[int], config: CompilationConfig,
        *, for_compile: bool = False, cache_dir: str | None = None, build_seconds: dict[str, float] | None = None,
    ) -> None:
        """`example_inputs`: what Dynamo handed the backend; `mutated`: indices of the graph inputs it writes to in
        place. `for_compile`: owned by `pieceworks.compile`, which calls `start_serving` after its tracing call;
        otherwise (a raw torch.compile backend) `lazy_capture` is armed at once. `build_seconds`: where building it
        took its time (`backend.build_runtime`), kept for reading."""
        self.split_gm = split_gm
        self.items = list(items)
        self.pieces = {spec.item.submod_name: spec.compiled for spec in specs}
        self.locate_batch = locate_batch
        self.config = config
        self.cache_dir = cache_dir
        self.build_seconds = dict(build_seconds or {})
        self.placeholders = [n for n in split_gm.graph.nodes if n.op == "placeholder"]
        self.mode = self._effective_mode(config.cudagraph_mode, example_inputs)
        self.phase = Phase.COMPILING
        self.pool = CapturePool(config.cudagraph_num_warmups)
        self.replays: dict[int, FullGraph | ReplayPlan] = {}  # the per-size choice
        self.capture_order: list[int] = []  # sizes in the order their graphs were captured
        self.mutated_inputs = sorted(mutated)  # graph inputs some piece writes to in place
        self.static: StaticInputs | None = None
        # kept until start_serving has bound them (pieceworks.compile); a raw backend never binds
        self._example_inputs: list[Any] | None = list(example_inputs) if for_compile else None
        self._traced_output: Any = None
        self.output_batched: Any = None  # the output leaves `serve` cuts back to the batch (padding.batched_outputs)
        self.binder: Binder | None = None  # how `serve` calls the graph directly; None: through Dynamo
        self._fallback: Callable[..., Any] | None = None
        self._mutated_args: list[int] = []
        self._flat_by_size: dict[int, list[Any]] = {}
        self._attempted: set[int] = set()
        self._warned: set[int] = set()
        self._capture_sizes = list(config.cudagraph_capture_sizes)
        self._max_capture_size = max(self._capture_sizes, default=0)
        debug = config.debug_replay_checks
        self._check_caller = "all_checks" if debug else "cheap_checks"
        self._check_static = "all_checks" if debug else None

        for spec in specs:
            delattr(split_gm, spec.item.submod_name)  # a plain callable may not shadow a registered submodule
            setattr(split_gm, spec.item.submod_name, spec.compiled)
        self.graph_pieces = self._graph_pieces(specs) if self.mode.has_piecewise else {}
        self.full_reason = self._full_reason(specs) if self.mode.has_full else "mode has no FULL graphs"
        if not for_compile and config.lazy_capture:
            self.phase = Phase.SERVING

    # ---- construction ---------------------------------------------------------------------------------------
    def _effective_mode(self, mode: CUDAGraphMode, example_inputs: Sequence[Any]) -> CUDAGraphMode:
        if mode is CUDAGraphMode.NONE:
            return mode
        on_cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for v in example_inputs)
        if not torch.cuda.is_available() or not on_cuda:
            where = "CUDA is not available" if not torch.cuda.is_available() else "the graph's inputs are not on CUDA"
            log.warning(
                "pieceworks: cudagraph_mode=%s but %s: running without CUDA graphs (set cudagraph_mode=NONE to "
                "silence this)", mode.name, where,
            )
            return CUDAGraphMode.NONE
        if mode.has_piecewise and not any(i.is_splitting_graph for i in self.items):
            # vLLM's behaviour: the graph is one piece, captured per size as PIECEWISE would (a FULL graph, in effect)
            log.info(
                "pieceworks: cudagraph_mode=%s and no splitting op in the graph (splitting_ops=%s): %s", mode.name,
                self.config.splitting_ops,
                "FULL covers it" if mode.has_full else "its one piece is captured per size, as a FULL graph would be",
            )
            return CUDAGraphMode.FULL if mode.has_full else mode
        return mode

    def _graph_pieces(self, specs: Sequence[PieceSpec]) -> dict[str, GraphPiece]:
        """The compiled pieces PIECEWISE captures; the others run eagerly in the plans, logged once with why."""
        splitting = {i.submod_name for i in self.items if i.is_splitting_graph}
        found = {}
        for spec in specs:
            name = spec.item.submod_name
            provenance = input_provenance(self.split_gm, name, splitting)
            moving = {i for i, kind in enumerate(provenance) if kind == "split"}
            reason = uncapturable_reason(spec.item.graph, spec.example_args, moving)
            if reason is not None:
                counters.num_cudagraph_uncapturable += 1
                log.warning("pieceworks: piece %s runs without a CUDA graph: %s", name, reason)
                continue
            piece = spec.compiled
            found[name] = GraphPiece(
                lambda args, piece=piece: piece.runnable_for(piece.locate_batch(args)),
                sorted(mutated_inputs(spec.item.graph)),
                [n.name for n in spec.item.graph.graph.nodes if n.op == "placeholder"],
                f"piece {name} (graph {spec.item.graph_id})",
            )
        return found

    def _full_reason(self, specs: Sequence[PieceSpec]) -> str | None:
        by_item = {id(s.item): s for s in specs}
        for item in self.items:
            if item.is_splitting_graph:  # the same host-sync and device checks; no CUDA tensors is fine here
                values = [example_value(n) for n in item.graph.graph.nodes if n.op == "placeholder"]
                why = uncapturable_reason(item.graph, values, set())
                why = None if why == "no CUDA tensors" else why
            else:
                why = uncapturable_reason(item.graph, by_item[id(item)].example_args, set())
            if why is not None:
                counters.num_cudagraph_uncapturable += 1
                log.warning("pieceworks: no FULL CUDA graph: piece %s: %s", item.submod_name, why)
                return f"piece {item.submod_name}: {why}"
        return None

    # ---- pieceworks.compile's entry -------------------------------------------------------------------------
    def start_serving(self, model: Any, trace_args: Sequence[Any], trace_output: Any,
                      fallback: Callable[..., Any]) -> None:
        """Called once by `pieceworks.compile` after its tracing call: bind call arguments to graph inputs, make
        the static buffers, and (with `lazy_capture`) start serving. `fallback` calls the model through Dynamo,
        used when the binding cannot be proven (logged once with why)."""
        example_inputs, self._example_inputs = self._example_inputs, None
        ids = {id(a): k for k, a in enumerate(trace_args) if isinstance(a, torch.Tensor)}
        self._mutated_args = [ids[id(example_inputs[i])] for i in self.mutated_inputs if id(example_inputs[i]) in ids]
        found = bind(model, self.placeholders, example_inputs, trace_args, self.locate_batch.symbols,
                     trace_output, self._traced_output)
        self.output_batched = self._batched_outputs(trace_args, trace_output)
        self._traced_output = None
        if isinstance(found, str):
            log.info("pieceworks: calls go through Dynamo (%s)", found)
            self._fallback = fallback
        else:
            self.binder = found
        if self.mode is not CUDAGraphMode.NONE and self._capture_sizes:
            self.static = StaticInputs(trace_args, self._max_capture_size)
            if self.config.lazy_capture:
                self.phase = Phase.SERVING

    def _batched_outputs(self, trace_args: Sequence[Any], trace_output: Any) -> Any:
        """Which leaves of the model's output have the batch as dim 0 (`padding.batched_outputs`): a graph output
        whose trace value's dim 0 is the batch symbol, or a tensor argument returned as it is; nothing else (a
        weight of n rows is not cut at padded size n)."""
        flat = self._traced_output if isinstance(self._traced_output, (tuple, list)) else ()
        graph_batched = [self._is_batch_sized(v) for v in self._output_examples()]
        index = {id(t): k for k, t in enumerate(flat) if isinstance(t, torch.Tensor)}
        args = {id(a) for a in trace_args if isinstance(a, torch.Tensor)}

        def is_batched(leaf: Any) -> bool:
            if not isinstance(leaf, torch.Tensor):
                return False
            k = index.get(id(leaf))
            return id(leaf) in args if k is None else k < len(graph_batched) and graph_batched[k]

        return batched_outputs(trace_output, is_batched)

    def _is_batch_sized(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() > 0 \
            and symbol_name(value.shape[0]) in self.locate_batch.symbols

    def _output_examples(self) -> list[Any]:
        """The trace's value (FakeTensor) of each graph output, read from the output nodes of the pieces that make
        them (the stitching module's own output nodes carry none)."""
        graphs = {item.submod_name: item.graph for item in self.items}

        def piece_output(name: str) -> Any:
            return next(n for n in graphs[name].graph.nodes if n.op == "output").args[0]

        def example(node: Any) -> Any:
            if not isinstance(node, torch.fx.Node):
                return None
            if node.op == "call_module":  # a piece with one output returns it as it is
                node = piece_output(node.target)
            elif node.op == "call_function" and node.target is operator.getitem \
                    and getattr(node.args[0], "op", None) == "call_module":
                node = piece_output(node.args[0].target)[node.args[1]]
            return example_value(node) if isinstance(node, torch.fx.Node) else None

        output = next(n for n in self.split_gm.graph.nodes if n.op == "output").args[0]
        return [example(node) for node in (output if isinstance(output, (tuple, list)) else (output,))]

    def serve(self, args: Sequence[Any], batch: int) -> Any:
        """One call of `pieceworks.compile`'s model with checked `args` of batch `batch`."""
        static = self.static
        if static is not None and self.phase is not Phase.COMPILING:
            n = padded_size(self._capture_sizes, batch)
            if n is not None:
                out = self._call_static(static.load(args, batch, n), n)
                for i in self._mutated_args:
                    args[i].copy_(static.buffers[i][:batch])
                return unpad(out, batch, n, self.output_batched)
        if self.binder is None:
            return self._fallback(*args)
        return self.binder.outputs(self.run(self.binder.inputs(args, batch), batch, static=False))

    def _call_static(self, static_args: list[Any], n: int) -> Any:
        binder = self.binder
        if binder is None:
            return self._fallback(*static_args)
        flat = self._flat_by_size.get(n)
        if flat is None:  # static views, parameters by object, the size: the same objects on every call
            flat = self._flat_by_size[n] = binder.inputs(static_args, n)
        return binder.outputs(self.run(flat, n, static=True))

    # ---- Dynamo's entry, and the per-size choice ------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        out = self.run(args, self.locate_batch(args), static=False)
        if self._example_inputs is not None:  # the tracing call: start_serving learns the output structure
            self._traced_output = out
        return out

    def run(self, args: Sequence[Any], batch: int | None, static: bool) -> Any:
        """Replay the graph captured for `batch`, capture it, or run without graphs. `static`: the tensor inputs
        are where they were at capture (static buffers), so only debug mode checks addresses."""
        replay = self.replays.get(batch)
        if replay is not None:
            which = self._check_static if static else self._check_caller
            return replay.run(args, getattr(replay, which) if which else ())
        if self.phase is not Phase.COMPILING and batch is not None and batch <= self._max_capture_size \
                and self.mode is not CUDAGraphMode.NONE and batch not in self._attempted:
            if batch in self._capture_sizes and (self.phase is Phase.CAPTURING or self.config.lazy_capture):
                return self._capture_size(batch, args)
            self._missing(batch)
        return self.split_gm(*args)

    def _missing(self, batch: int) -> None:
        if self.phase is not Phase.SERVING:
            return
        if self.config.on_missing_graph == "raise":
            raise CUDAGraphMissingError(
                f"batch size {batch} has no CUDA graph (captured: {sorted(self.replays)}). Fix: pad batches to a "
                f"captured size (pieceworks.compile does), capture this size, or set on_missing_graph='eager'"
            )
        if batch not in self._warned:
            self._warned.add(batch)
            log.warning("pieceworks: batch size %d has no CUDA graph; running it without one", batch)

    # ---- capture --------------------------------------------------------------------------------------------
    def _capture_size(self, batch: int, args: Sequence[Any]) -> Any:
        """Capture the graphs of one batch size from `args` (which stay where they are); return this call's
        outputs. FULL first where wanted; PIECEWISE where FULL is not (or failed)."""
        self._attempted.add(batch)
        lazy = self.phase is Phase.SERVING
        self.phase = Phase.CAPTURING
        try:
            with _gc_frozen() if lazy else contextlib.nullcontext():
                if self.full_reason is None:
                    try:
                        graph, out = self.pool.capture(self.split_gm, args, self.mutated_inputs)
                    except Exception as exc:  # noqa: BLE001 - a refused capture falls back, it never crashes
                        self.full_reason = f"capture failed: {type(exc).__name__}: {exc}"
                        counters.num_cudagraph_uncapturable += 1
                        log.warning("pieceworks: no FULL CUDA graph (%s)", self.full_reason)
                        torch.cuda.synchronize()
                    else:
                        self.replays[batch] = self._full_graph(batch, graph, out, args)
                        self.capture_order.append(batch)
                        return out
                if not self.graph_pieces:
                    return self.split_gm(*args)
                plan, out = record_plan(self.split_gm, batch, args, self.graph_pieces, self.pool.capture)
                self.replays[batch] = plan
                self.capture_order.append(batch)
                return out
        finally:
            self.phase = Phase.SERVING if lazy else Phase.CAPTURING

    def reset(self) -> None:
        """Drop every graph and plan: the next capture phase (or, with `lazy_capture`, each size's next call)
        captures again, into a fresh pool; the old one is freed with its graphs. Earlier outputs become invalid."""
        if self.pool.handle is not None:
            torch.cuda.synchronize()
            self.pool.handle = torch.cuda.graph_pool_handle()  # same stream and warm-up MemPool (cuBLAS workspaces)
        for kept in (self.replays, self.capture_order, self._attempted, self._warned):
            kept.clear()

    def _full_graph(self, batch: int, graph: Any, out: Any, args: Sequence[Any]) -> FullGraph:
        every, cheap = [], []
        for i, (node, a) in enumerate(zip(self.placeholders, args)):
            if isinstance(a, torch.Tensor):
                check = (i, a.data_ptr(), "full graph", i, node.name)
                every.append(check)
                if not isinstance(a, torch.nn.Parameter):
                    cheap.append(check)
        return FullGraph(batch, graph, out, cheap, every)

    def capture(self, sizes: Iterable[int] | None = None, run_size: Callable[[int], Any] | None = None
                ) -> dict[str, Any]:
        """The capture phase: `run_size(n)` for every size in `sizes`, largest first (default: every capture size;
        `run_size` default: a call through `pieceworks.compile`'s static buffers); each call at a size not yet
        attempted captures it. Then serving starts: no size is captured again (unless `lazy_capture`).
        `run_size(n)` must call the model with arguments that stay where they are for every later replay. gc is
        collected and frozen once for the phase. Returns the phase's numbers (sizes, seconds, MiB, graphs)."""
        if run_size is None:
            static = self.static
            sizes = [] if static is None else (self._capture_sizes if sizes is None else sizes)
            run_size = lambda n: self._call_static(static.views(n), n)  # noqa: E731
        sizes = sorted(set(sizes), reverse=True)
        report = {"sizes": len(sizes), "seconds": 0.0, "free_delta_mib": 0.0, "reserved_delta_mib": 0.0,
                  "graphs": 0, "mode": self.mode.name}
        if self.mode is CUDAGraphMode.NONE or not sizes:
            log.info("pieceworks capture: nothing to capture (mode %s, %d sizes)", self.mode.name, len(sizes))
            self.phase = Phase.SERVING
            return report
        unknown = [s for s in sizes if s not in self._capture_sizes]
        if unknown:
            raise ValueError(f"sizes {unknown} are not in CompilationConfig.cudagraph_capture_sizes")
        torch.cuda.synchronize()
        free_before, reserved_before = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
        graphs_before = counters.num_cudagraph_captured
        start = time.perf_counter()
        self.phase = Phase.CAPTURING
        try:
            with _gc_frozen():
                for size in sizes:
                    run_size(size)
        finally:
            self.phase = Phase.SERVING
        torch.cuda.synchronize()
        report.update(
            seconds=time.perf_counter() - start,
            free_delta_mib=(free_before - torch.cuda.mem_get_info()[0]) / 2**20,
            reserved_delta_mib=(torch.cuda.memory_reserved() - reserved_before) / 2**20,
            graphs=counters.num_cudagraph_captured - graphs_before,
        )
        log.info(
            "pieceworks capture: %d sizes (%d..%d), mode %s, %d graphs in %.2f s, %.1f MiB (device free-memory "
            "delta), %.1f MiB (allocator reserved delta)", len(sizes), sizes[0], sizes[-1], self.mode.name,
            report["graphs"], report["seconds"], report["free_delta_mib"], report["reserved_delta_mib"],
        )
        return report
