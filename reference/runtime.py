"""Capture and replay of one compiled model: per padded size and batch kind, a FULL CUDA graph, a PIECEWISE
replay plan, or no CUDA graph.

A `Runtime` is built complete over a `CompiledPieces` (compiled.py) and owns, alone, everything that changes
while serving: the capture pool (`CapturePool`, which owns its handle), the phase and the replays
(`replay_for(padded_size, uniform)`: the `FullReplay` or PIECEWISE `ReplayPlan` (plan.py) of a padded size). A
size without one runs the stitching module without CUDA graphs. Nothing outside this class writes its state,
and it never calls its caller: whatever it captures, it captures from the inputs it is handed.

Batch kinds (batch_kind.py): a call is uniform decode or mixed, and the caller says which (`uniform`, read
once at the caller's door). The mode gives each kind its own (`mode_for(uniform)`: FULL, PIECEWISE or NONE),
so a size may hold two replays, a FULL graph for uniform decode and a PIECEWISE plan for mixed batches
(FULL_AND_PIECEWISE), or one shared by both kinds. The mode is first lowered to what the splitting ops declare
(`effective_mode`).

Phases (`Phase`): WAITING (from construction until a capture phase: calls run without CUDA graphs), CAPTURING
(inside `capture_phase()`: a call at a planned size and kind captures it), SERVING (a size without a replay
follows `on_missing_graph`, or, with `lazy_capture`, is captured on first sight; a runtime with
`lazy_capture` starts here).

`run(args, padded_size, uniform, static)` is the one way in; `args` are the stitching module's flat inputs.
`static=True`: the caller guarantees that tensor inputs sit where they sat at capture (static buffers:
`pieceworks.compile`), so replays check no address (`debug_replay_checks` checks all of them, parameters
included); `static=False`: the caller's own tensors (the torch.compile door), so every replay checks the
addresses of the caller-owned inputs its CUDA graphs read and raises `ReplayAddressError` rather than read
stale memory.

Memory and ordering: every CUDA graph goes into one pool, sizes largest first, so smaller sizes reuse the
larger ones' blocks; replay outputs alias pool memory and are valid until the next replay. Not thread-safe:
one call at a time.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, cast

import torch

from .batch_kind import effective_mode
from .compiled import CompiledPieces
from .config import CompilationConfig, CUDAGraphMode
from .counters import counters, log
from .cudagraph import CapturePool, check_ranks_agree, pool_bytes
from .piece import Piece
from .plan import FullReplay, ReplayPlan, record_plan

NONE = CUDAGraphMode.NONE


class CUDAGraphMissingError(RuntimeError):
    """A batch size that should have a CUDA graph has none, and `on_missing_graph="raise"`."""


Phase = enum.Enum("Phase", "WAITING CAPTURING SERVING")  # see the module doc


class CapturePhase(NamedTuple):
    """One capture phase (`Runtime.capture_phase`, `Runtime.estimate_phase`): `plan`, the (padded size,
    uniform) pairs for the caller to run, in order, each once; `report`, the phase's numbers, complete once
    the phase has ended."""

    plan: list[tuple[int, bool]]
    report: dict[str, Any]


class Runtime:
    """Capture and replay of one `CompiledPieces`; see the module doc.

    Public view (read it; only this object writes it): `compiled`, `config`, `mode` (`effective_mode`),
    `pool`, `phase`, `full_reason` (why there are no FULL graphs, or None where there are),
    `mode_for(uniform)`, `captured_sizes`, `replay_for(padded_size, uniform)` and `capture_order(sizes)`."""

    def __init__(self, compiled: CompiledPieces, config: CompilationConfig) -> None:
        self.compiled, self.config = compiled, config
        self.pool = CapturePool(config.cudagraph_num_warmups)
        self.mode = effective_mode(config, compiled)
        self.phase = Phase.SERVING if config.lazy_capture else Phase.WAITING
        # per (padded size, uniform decode): its FULL replay or PIECEWISE plan, in capture order (sizes are
        # ints; None is in the key's type because `run` looks up unpadded calls too)
        self._replays: dict[tuple[int | None, bool], FullReplay | ReplayPlan] = {}
        self._attempted: set[tuple[int, bool]] = set()
        self._planned: set[tuple[int, bool]] = set()  # what the capture phase under way captures
        self._phase: CapturePhase | None = None
        self._modes = {True: self.mode.decode_mode, False: self.mode.mixed_mode}
        self._warned: set[int] = set()
        self._sizes = list(config.cudagraph_capture_sizes or ())  # never None: CompilationConfig fills it
        self._max_size = max(self._sizes, default=0)
        self._debug = config.debug_replay_checks
        self._capturable: dict[str, Piece] = {}  # the compiled pieces a PIECEWISE plan captures, by name
        for piece in (p for p in compiled.pieces if self.mode.has_piecewise and not p.is_splitting_graph):
            if (refusal := piece.piecewise_refusal) is None:
                self._capturable[piece.submod_name] = piece
            else:
                counters.num_cudagraph_uncapturable += 1
                log.warning("pieceworks: piece %s runs without a CUDA graph: %s", piece.submod_name, refusal)
        self.full_reason = None if self.mode.has_full else "mode has no FULL graphs"
        if self.mode.has_full and (why := [p for p in compiled.pieces if p.uncapturable]):
            self._no_full(f"piece {why[0].submod_name}: {why[0].uncapturable}")

    def _no_full(self, reason: str) -> None:
        """No FULL graphs, for `reason` (counted, logged): kinds meant for them get PIECEWISE plans instead
        (no CUDA graphs where no piece can have one)."""
        self.full_reason = reason
        counters.num_cudagraph_uncapturable += 1
        log.warning("pieceworks: no FULL CUDA graph: %s", reason)
        instead = CUDAGraphMode.PIECEWISE if self._capturable else NONE
        self._modes = {k: instead if m is CUDAGraphMode.FULL else m for k, m in self._modes.items()}

    def mode_for(self, uniform: bool) -> CUDAGraphMode:
        """What serves a batch of this kind (uniform decode or mixed): FULL, PIECEWISE or NONE (no graph)."""
        return self._modes[uniform]

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """The sizes with a replay (of either kind), in the order they were captured."""
        return cast("tuple[int, ...]", tuple(dict.fromkeys(size for size, _ in self._replays)))

    def replay_for(self, padded_size: int, uniform: bool) -> FullReplay | ReplayPlan | None:
        """The FULL replay or PIECEWISE plan that serves `padded_size` for batches of kind `uniform`, or
        None."""
        return self._replays.get((padded_size, uniform))

    # ---- calls --------------------------------------------------------------------------------------------
    def run(self, args: Sequence[Any], padded_size: int | None, uniform: bool, static: bool) -> Any:
        """Replay what was captured for `padded_size` and kind `uniform`, capture it (in a capture phase, or
        lazily), or run without CUDA graphs; see the module doc."""
        key = (padded_size, uniform)
        if (replay := self._replays.get(key)) is not None:
            checks = replay.all_checks if self._debug else () if static else replay.cheap_checks
            return replay.run(args, checks)
        if padded_size is not None and key not in self._attempted and self._modes[uniform] is not NONE:
            if key in self._planned or self.config.lazy_capture and padded_size in self._sizes:
                return self._capture(padded_size, uniform, args)
            if self.phase is Phase.SERVING and padded_size <= self._max_size:
                self._missing(padded_size)
        return self.compiled.stitching_module(*args)

    def _missing(self, padded_size: int) -> None:
        """A size that could have a CUDA graph and has none: `on_missing_graph` says whether it raises or
        runs without one (warned once per size)."""
        if self.config.on_missing_graph == "raise":
            raise CUDAGraphMissingError(
                f"batch size {padded_size} has no CUDA graph (captured: {sorted(self._replays)}). Fix: pad "
                f"batches to a captured size (pieceworks.compile does), capture this size, or set "
                f"on_missing_graph='eager'"
            )
        if padded_size not in self._warned:
            self._warned.add(padded_size)
            log.warning("pieceworks: batch size %d has no CUDA graph; running it without one", padded_size)

    # ---- capture ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _capturing(self, phase: CapturePhase | None = None) -> Iterator[None]:
        """Phase CAPTURING (with `phase`: its plan armed and its seconds counted), then SERVING. gc is frozen
        and disabled for the phase: no collection during capture can unload a module a CUDA graph uses, and
        none slows the phase down. Nothing is collected first (a full collection of a process that holds a
        compiler costs ~0.2 s): what is garbage now is collected after the phase."""
        self.phase, start = Phase.CAPTURING, time.perf_counter()
        if phase is not None:
            self._planned, self._phase = set(phase.plan), phase
        enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            yield
            if phase is not None:
                torch.cuda.synchronize()
        finally:
            gc.unfreeze()
            if enabled:
                gc.enable()
            self.phase, self._planned, self._phase = Phase.SERVING, set(), None
            if phase is not None:
                phase.report["seconds"] = time.perf_counter() - start

    def _capture(self, padded_size: int, uniform: bool, args: Sequence[Any]) -> Any:
        """Capture the replay of one padded size and kind from `args` (which stay where they are); return
        this call's outputs. FULL where the kind's mode is FULL; PIECEWISE where it is PIECEWISE or FULL
        failed. The replay serves every kind whose mode is the same. Outside a capture phase (a lazy
        capture) it is a phase of its own."""
        stitching, compiled, mode = self.compiled.stitching_module, self.compiled, self._modes[uniform]
        self._attempted.add((padded_size, uniform))
        with self._capturing() if self.phase is Phase.SERVING else contextlib.nullcontext():
            if mode is CUDAGraphMode.FULL and self.full_reason is None:
                # a lazy capture is a served call: it puts back every mutated input
                restored = compiled.mutated_inputs if self.config.lazy_capture else compiled.restored_inputs
                try:
                    cuda_graph, out = self.pool.capture(stitching, args, restored, self.pool.num_warmups)
                except Exception as exc:  # noqa: BLE001 - a refused capture falls back, it never crashes
                    self._no_full(f"capture failed: {type(exc).__name__}: {exc}")
                else:
                    full = FullReplay(padded_size, cuda_graph, out, stitching, args)
                    return self._keep(padded_size, mode, full, out)
            if not self._capturable:
                return stitching(*args)
            plan, out = record_plan(stitching, padded_size, args, self._capturable, self.pool.capture_piece)
            return self._keep(padded_size, self._modes[uniform], plan, out)

    def _keep(self, padded_size: int, mode: CUDAGraphMode, replay: FullReplay | ReplayPlan, out: Any) -> Any:
        """Keep `replay` for `padded_size` and every kind whose mode is `mode`; return `out`."""
        self._replays.update({(padded_size, k): replay for k, m in self._modes.items() if m is mode})
        if self._phase is not None and padded_size == self._phase.plan[0][0]:
            torch.cuda.synchronize()  # the pool after the largest size alone
            self._phase.report["largest_bytes"] = pool_bytes(self.pool.handle)
        return out

    def reset(self) -> None:
        """Drop every CUDA graph and plan: the next capture phase (or, with `lazy_capture`, each size's next
        call) captures again, into a fresh pool; the old one is freed with its graphs. Earlier outputs
        become invalid."""
        self.pool.reset()
        for kept in (self._replays, self._attempted, self._warned):
            kept.clear()

    @contextlib.contextmanager
    def capture_phase(self, sizes: Iterable[int] | None = None) -> Iterator[CapturePhase]:
        """A capture phase: yields its `CapturePhase`, whose `plan` the caller runs, each (padded size,
        uniform) once, with inputs that stay where they are for every later replay (`run(args, padded_size,
        uniform, static)`); each such run captures its size and kind. Sizes (default: every capture size) go
        largest first. Then serving starts: no size is captured again (unless `lazy_capture`). A graph holding
        collectives (`_c10d_functional` ops) first checks that every rank captures the same
        (`check_ranks_agree`). Its report: sizes, seconds, MiB, CUDA graphs, mode, `largest_bytes` (the pool
        after the largest size alone)."""
        order = self.capture_order(sizes)
        nodes = (node for piece in self.compiled.pieces for node in piece.fx_graph.graph.nodes)
        if any(str(node.target).startswith("_c10d_functional.") for node in nodes):
            cuda = [v.device for v in self.compiled.inputs if isinstance(v, torch.Tensor) and v.is_cuda]
            check_ranks_agree(self.mode, order, cuda[0] if cuda else None)
        phase = CapturePhase(self._plan(order), {"sizes": len(order), "seconds": 0.0, "largest_bytes": 0})
        phase.report.update(free_delta_mib=0.0, reserved_delta_mib=0.0, graphs=0, mode=self.mode.name)
        if not phase.plan:
            log.info("pieceworks capture: nothing to capture (mode %s, %d sizes)", self.mode.name, len(order))
            self.phase = Phase.SERVING
            yield phase
            return
        torch.cuda.synchronize()
        free, reserved = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
        graphs = counters.num_cudagraph_captured
        with self._capturing(phase):
            yield phase
        phase.report["graphs"] = counters.num_cudagraph_captured - graphs
        phase.report["free_delta_mib"] = (free - torch.cuda.mem_get_info()[0]) / 2**20
        phase.report["reserved_delta_mib"] = (torch.cuda.memory_reserved() - reserved) / 2**20
        numbers = [phase.report[k] for k in ("graphs", "seconds", "free_delta_mib", "reserved_delta_mib")]
        message = "pieceworks capture: %d sizes (%d..%d), mode %s, %d CUDA graphs in %.2f s, "
        message += "%.1f MiB (device free-memory delta), %.1f MiB (allocator reserved delta)"
        log.info(message, len(order), order[0], order[-1], self.mode.name, *numbers)

    @contextlib.contextmanager
    def estimate_phase(self, sizes: Iterable[int] | None = None, samples: int = 6) -> Iterator[CapturePhase]:
        """The pool bytes a capture of `sizes` (default: every capture size) will take, before any capture:
        a `capture_phase` of `samples` of the sizes (the largest, the smallest and evenly spaced ones
        between) into a pool of their own, whose `pool_bytes` is the estimate; then the sample's CUDA graphs
        and pool are freed (`torch.cuda.empty_cache()` returns its memory to the device) and the runtime is
        back in the phase it was in. The pool grows with the kinds of blocks the sizes need, not with their
        number: each graph's blocks return to the pool when its capture ends and the next (smaller) size
        reuses them; a sample spanning the sizes meets those kinds. Run it before capturing. Its report: the
        sample's capture report, with `pool_bytes`, `sizes` (how many the estimate is for) and
        `sampled_sizes`; 0 bytes for a mode without CUDA graphs, or no sizes."""
        if self._replays:
            raise RuntimeError(
                "estimate_capture() runs before capture(): this runtime already holds CUDA graphs. "
                "Fix: estimate first, or call reset() to drop them"
            )
        if samples < 1:
            raise ValueError(f"samples={samples}: the estimate needs at least 1 sampled size (the largest)")
        order, before = self.capture_order(sizes), self.phase
        step = (len(order) - 1) / max(samples - 1, 1)
        picked = sorted({order[round(k * step)] for k in range(min(samples, len(order)))}, reverse=True)
        self.pool.reset()
        try:
            with self.capture_phase(picked) as phase:
                yield phase
            report = phase.report
            report.update(pool_bytes=pool_bytes(self.pool.handle), sizes=len(order))
            report["sampled_sizes"] = picked if phase.plan else []
        finally:
            self.reset()
            gc.collect()  # the sample's CUDA graphs hold the pool; freed now, returned to the device below
            torch.cuda.empty_cache()
            self.phase = before
        estimate = (len(order), report["pool_bytes"] / 2**20, report["sampled_sizes"], report["seconds"])
        message = "pieceworks capture estimate: %d sizes, about %.1f MiB of pool (sampled %s in %.2f s)"
        log.info(message, *estimate)

    def capture_order(self, sizes: Iterable[int] | None) -> list[int]:
        """`sizes` (default: every capture size) in capture order: largest first, so that smaller ones reuse
        the pool blocks the larger ones leave; ValueError naming any other size."""
        order = sorted(set(self._sizes if sizes is None else sizes), reverse=True)
        if unknown := [s for s in order if s not in self._sizes]:
            raise ValueError(f"sizes {unknown} are not in CompilationConfig.cudagraph_capture_sizes")
        return order

    def _plan(self, sizes: list[int]) -> list[tuple[int, bool]]:
        """(padded size, uniform) for each size and each kind a capture phase captures, in order: one capture
        per size where both kinds share a mode (under the mixed kind: a replay both may use; nothing where
        that mode is NONE), else each kind with graphs, uniform decode (FULL) first."""
        kinds = [k for k in (True, False) if self._modes[k] is not NONE]
        kinds = kinds[-1:] if self._modes[True] is self._modes[False] else kinds
        return [(size, uniform) for size in sizes for uniform in kinds]
