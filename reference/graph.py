"""The stitched, compiled graph that Dynamo calls, and the per-batch choice of FULL, PIECEWISE or no graph.

Per call: find the batch size; replay the FULL graph if one was captured for it; else run the stitching module with
PIECEWISE replay switched on if the pieces were captured for it; else run the stitching module without graphs.
The choice costs one attribute read and two set lookups. Capture happens only in `capture()` (or, with
`lazy_capture`, on the first call of a capture size); see cudagraph.py for the memory and address contracts.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx

from .capturability import input_provenance, mutated_inputs, uncapturable_reason
from .config import CompilationConfig, CUDAGraphMode
from .counters import counters
from .cudagraph import CaptureState, CUDAGraphRunner
from .piece import BatchLocator, CompiledPiece
from .split import SplitItem

__all__ = ["PiecewiseGraph", "PieceSpec", "CUDAGraphMissingError"]

log = logging.getLogger("pieceworks")


class CUDAGraphMissingError(RuntimeError):
    """A batch size that should have a CUDA graph has none, and `on_missing_graph="raise"`."""


@dataclasses.dataclass
class PieceSpec:
    item: SplitItem
    compiled: CompiledPiece
    example_args: tuple  # FakeTensors/SymInts of the trace


def _on_cuda(values: Iterable[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


class PiecewiseGraph:
    """The callable a `Backend` returns for one Dynamo graph.

    `split_gm` is the stitching module. Each compiled submodule is replaced by its `CompiledPiece` (`pieces`), or,
    when PIECEWISE graphs are wanted on a CUDA graph, by a `CUDAGraphRunner` around it (`runners`). Splitting
    submodules run eagerly. `cache_dir` is the compile cache folder used, or None.
    """

    def __init__(
        self,
        split_gm: torch.fx.GraphModule,
        specs: Sequence[PieceSpec],
        items: Sequence[SplitItem],
        locate_batch: BatchLocator,
        example_inputs: Sequence[Any],
        config: CompilationConfig,
        cache_dir: str | None = None,
    ) -> None:
        self.split_gm = split_gm
        self.items = list(items)
        self.pieces = {spec.item.submod_name: spec.compiled for spec in specs}
        self.locate_batch = locate_batch
        self.config = config
        self.cache_dir = cache_dir
        self.state = CaptureState(debug_checks=config.debug_replay_checks)
        self.state.num_warmups = config.cudagraph_num_warmups
        self.mode = self._effective_mode(config.cudagraph_mode, example_inputs)
        self.runners: dict[str, CUDAGraphRunner] = {}
        self.full_runner: CUDAGraphRunner | None = None
        self.full_entries: dict = {}
        self.piecewise_sizes: set[int] = set()
        self.attempted_sizes: set[int] = set()
        self.capture_closed = False
        self.capture_order: list[int] = []  # batch sizes in the order their graphs were captured (observable)
        self.lazy_capture = config.lazy_capture
        self._capture_phase = False
        self._capture_sizes = set(config.cudagraph_capture_sizes)
        self._max_capture_size = max(config.cudagraph_capture_sizes, default=0)
        self._warned_sizes: set[int] = set()
        # ids of the trace's input tensors that the graph writes to; pieceworks.compile copies them back
        self.mutated_input_ids: set[int] = set()

        splitting_names = {i.submod_name for i in self.items if i.is_splitting_graph}
        for spec in specs:
            name = spec.item.submod_name
            installed: Callable[..., Any] = spec.compiled
            if self.mode.has_piecewise:
                installed = self.runners[name] = self._piece_runner(spec, splitting_names)
            delattr(split_gm, name)  # a plain callable attribute may not shadow a registered submodule
            setattr(split_gm, name, installed)
        if self.mode.has_full:
            self.full_runner = self._full_runner(specs, example_inputs)
            self.full_entries = self.full_runner.entries

    # ---- construction ---------------------------------------------------------------------------------------
    def _effective_mode(self, mode: CUDAGraphMode, example_inputs: Sequence[Any]) -> CUDAGraphMode:
        if mode is CUDAGraphMode.NONE:
            return mode
        if not torch.cuda.is_available() or not _on_cuda(example_inputs):
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

    def _piece_runner(self, spec: PieceSpec, splitting_names: set[str]) -> CUDAGraphRunner:
        name = spec.item.submod_name
        provenance = input_provenance(self.split_gm, name, splitting_names)
        moving = {i for i, kind in enumerate(provenance) if kind == "split"}
        reason = uncapturable_reason(spec.item.graph, spec.example_args, moving)
        if reason is not None:
            counters.num_cudagraph_uncapturable += 1
            log.warning("pieceworks: piece %s runs without a CUDA graph: %s", name, reason)
        placeholders = [n.name for n in spec.item.graph.graph.nodes if n.op == "placeholder"]
        checked = [i for i, kind in enumerate(provenance) if kind in ("input", "split")]
        return CUDAGraphRunner(
            spec.compiled, f"piece {name} (graph {spec.item.graph_id})", self.state,
            spec.compiled.locate_batch, checked, placeholders, uncapturable=reason,
            mutated_inputs=sorted(mutated_inputs(spec.item.graph)),
        )

    def _full_runner(self, specs: Sequence[PieceSpec], example_inputs: Sequence[Any]) -> CUDAGraphRunner:
        reason = None
        for item in self.items:
            if item.is_splitting_graph:
                why = _splitting_reason(item.graph)
            else:
                spec = next(s for s in specs if s.item is item)
                why = uncapturable_reason(item.graph, spec.example_args, set())
            if why is not None:
                reason = f"piece {item.submod_name}: {why}"
                break
        if reason is not None:
            counters.num_cudagraph_uncapturable += 1
            log.warning("pieceworks: no FULL CUDA graph: %s", reason)
        placeholders = [n for n in self.split_gm.graph.nodes if n.op == "placeholder"]
        checked = [
            i for i, n in enumerate(placeholders)
            if isinstance(n.meta.get("example_value"), torch.Tensor)
            and not isinstance(n.meta.get("example_value"), torch.nn.Parameter)
        ]
        written = set()
        for spec in specs:  # which stitching-graph inputs some piece writes to
            call = next(n for n in self.split_gm.graph.nodes if n.op == "call_module" and n.target == spec.item.submod_name)
            for i in mutated_inputs(spec.item.graph):
                if isinstance(call.args[i], torch.fx.Node) and call.args[i].op == "placeholder":
                    written.add(placeholders.index(call.args[i]))
        return CUDAGraphRunner(
            self.split_gm, "full graph", self.state, self.locate_batch, checked,
            [n.name for n in placeholders], uncapturable=reason, mutated_inputs=sorted(written),
        )

    # ---- calls ----------------------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        batch = self.locate_batch(args)
        entry = self.full_entries.get(batch)
        if entry is not None:
            return self.full_runner.replay(entry, args)
        if batch in self.piecewise_sizes:
            self.state.piecewise_active = True
            try:
                return self.split_gm(*args)
            finally:
                self.state.piecewise_active = False
        if self.mode is not CUDAGraphMode.NONE and batch is not None and batch <= self._max_capture_size:
            if batch not in self.attempted_sizes:
                if batch in self._capture_sizes and (self._capture_phase or self.lazy_capture):
                    return self.capture_size(batch, args)
                self._missing(batch)
        return self.split_gm(*args)

    def _missing(self, batch: int) -> None:
        if not self.capture_closed:
            return
        if self.config.on_missing_graph == "raise":
            raise CUDAGraphMissingError(
                f"batch size {batch} has no CUDA graph (captured: {sorted(self.attempted_sizes)}). Fix: pad batches "
                f"to a captured size (pieceworks.compile does), capture this size, or set on_missing_graph='eager'"
            )
        if batch not in self._warned_sizes:
            self._warned_sizes.add(batch)
            log.warning("pieceworks: batch size %d has no CUDA graph; running it without one", batch)

    # ---- capture --------------------------------------------------------------------------------------------
    def capture_size(self, batch: int, args: Sequence[Any]) -> Any:
        """Capture the graphs for one batch size from `args` (static buffers); return that call's outputs."""
        self.attempted_sizes.add(batch)
        self.capture_order.append(batch)
        state = self.state
        frozen = _GCFrozen()
        state.capturing = True
        try:
            full = self.full_runner
            if full is not None and full.uncapturable is None:
                try:
                    return full.capture(args)
                except Exception as exc:  # noqa: BLE001 - a refused capture falls back, it never crashes
                    full.uncapturable = f"capture failed: {type(exc).__name__}: {exc}"
                    counters.num_cudagraph_uncapturable += 1
                    log.warning("pieceworks: no FULL CUDA graph (%s)", full.uncapturable)
                    torch.cuda.synchronize()
            if not self.mode.has_piecewise or not self.runners:
                return self.split_gm(*args)
            state.piecewise_active = True
            try:
                out = self.split_gm(*args)
            finally:
                state.piecewise_active = False
            if any(batch in r.entries for r in self.runners.values()):
                self.piecewise_sizes.add(batch)
            return out
        finally:
            state.capturing = False
            frozen.release()

    def capture(self, sizes: Iterable[int], run_size: Callable[[int], Any]) -> dict[str, Any]:
        """The capture phase: `run_size(n)` for every size, largest first; each call of this graph at a size not
        yet captured captures it. Then capture closes. `run_size(n)` must call the model with arguments that stay
        where they are for every later replay (static buffers). gc is collected and frozen once for the phase.
        Returns the phase's numbers (sizes, seconds, MiB, graphs).
        """
        sizes = sorted(set(sizes), reverse=True)
        report = {"sizes": len(sizes), "seconds": 0.0, "free_delta_mib": 0.0, "reserved_delta_mib": 0.0,
                  "graphs": 0, "mode": self.mode.name}
        if self.mode is CUDAGraphMode.NONE or not sizes:
            log.info("pieceworks capture: nothing to capture (mode %s, %d sizes)", self.mode.name, len(sizes))
            self.capture_closed = True
            return report
        unknown = [s for s in sizes if s not in self._capture_sizes]
        if unknown:
            raise ValueError(f"sizes {unknown} are not in CompilationConfig.cudagraph_capture_sizes")
        torch.cuda.synchronize()
        free_before, reserved_before = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
        graphs_before = counters.num_cudagraph_captured
        start = time.perf_counter()
        self._capture_phase = True
        try:
            with _GCFrozen():
                for size in sizes:
                    run_size(size)
        finally:
            self._capture_phase = False
        torch.cuda.synchronize()
        report.update(
            seconds=time.perf_counter() - start,
            free_delta_mib=(free_before - torch.cuda.mem_get_info()[0]) / 2**20,
            reserved_delta_mib=(torch.cuda.memory_reserved() - reserved_before) / 2**20,
            graphs=counters.num_cudagraph_captured - graphs_before,
        )
        self.capture_closed = True
        log.info(
            "pieceworks capture: %d sizes (%d..%d), mode %s, %d graphs in %.2f s, %.1f MiB (device free-memory "
            "delta), %.1f MiB (allocator reserved delta)", len(sizes), sizes[0], sizes[-1], self.mode.name,
            report["graphs"], report["seconds"], report["free_delta_mib"], report["reserved_delta_mib"],
        )
        return report

    def reset(self) -> None:
        """Drop every captured graph; the pool's memory is freed once nothing references it."""
        for runner in [*self.runners.values(), *([self.full_runner] if self.full_runner else [])]:
            runner.reset()
        self.piecewise_sizes.clear()
        self.attempted_sizes.clear()
        self.capture_order.clear()


def _splitting_reason(gm: torch.fx.GraphModule) -> str | None:
    """Whether a splitting piece can live inside a FULL graph: the same host-sync and device checks."""
    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    reason = uncapturable_reason(gm, values, set())
    return None if reason == "no CUDA tensors" else reason


class _GCFrozen:
    """gc collected once, then frozen and disabled until `release()` (nesting-safe): no collection during capture
    can unload a module a graph uses, and no per-piece gc.collect slows the phase down."""

    depth = 0

    def __init__(self) -> None:
        _GCFrozen.depth += 1
        self.outermost = _GCFrozen.depth == 1
        self.was_enabled = gc.isenabled()
        self.released = False
        if self.outermost:
            gc.collect()
            gc.freeze()
            gc.disable()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        _GCFrozen.depth -= 1
        if self.outermost:
            if self.was_enabled:
                gc.enable()
            gc.unfreeze()

    def __enter__(self) -> _GCFrozen:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
