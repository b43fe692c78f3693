"""The torch.compile backend: split the Dynamo graph, compile every non-splitting piece, stitch them back.

Everything is compiled inside the backend call, before the first result is returned: one symbolic compile per
compile range and one static compile per compile size for every structurally distinct piece. Pieces with equal
fingerprints share one compiled artifact (a 12-layer ToyLlama has 13 compiled pieces but 3 distinct ones).
No batch size seen later triggers a compile.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from . import compiler as piece_compiler
from ._compat import example_value, fake_mode_of
from .cache import CompileCache, cache_key
from .capturability import data_dependent_sizes, mutated_inputs
from .compiler import PieceCompiler, Target
from .config import CompilationConfig
from .counters import counters
from .fingerprint import graph_fingerprint
from .dispatch import find_range
from .piece import BatchLocator, CompiledPiece
from .runtime import PieceSpec, Runtime
from .split import SplitItem, absent_splitting_ops, check_splitting_ops, op_names, split_graph
from .values import cycle_rows

__all__ = ["Backend", "build_runtime"]

log = logging.getLogger("pieceworks")


class Backend:
    """A torch.compile backend: `torch.compile(model, backend=Backend(config), fullgraph=True)`.

    Each graph Dynamo hands over becomes a `Runtime`, kept in `runtimes` in arrival order. Dynamo's guards and
    dynamic-shape marking are the caller's business here; `pieceworks.compile` takes care of both. `config` is
    frozen and copied: later edits raise, and never reach the compiled graphs.

    `for_compile=True` (what `pieceworks.compile` uses): exactly one graph, and a second request to compile (after
    `torch._dynamo.reset()`) is refused; lazy capture waits for `Runtime.start_serving`, so the tracing call, which
    runs on throw-away inputs, captures nothing.
    """

    def __init__(self, config: CompilationConfig | None = None, *, for_compile: bool = False) -> None:
        if config is not None and not isinstance(config, CompilationConfig):
            raise TypeError(f"pieceworks needs a pieceworks.CompilationConfig, got {type(config).__name__}")
        # A copy of our own, read-only; the caller's config is frozen too, so that editing it raises (config.py).
        self.config = copy.deepcopy(config.freeze()) if config is not None else CompilationConfig().freeze()
        self.runtimes: list[Runtime] = []
        self.for_compile = for_compile

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Runtime:
        if self.for_compile and self.runtimes:
            raise RuntimeError(
                "pieceworks: Dynamo asked to compile this model again after its first call (was "
                "torch._dynamo.reset() called?). A CompiledModel never compiles while serving. Fix: create a new "
                "CompiledModel with pieceworks.compile"
            )
        runtime = build_runtime(gm, example_inputs, self.config, for_compile=self.for_compile)
        self.runtimes.append(runtime)
        return runtime


def _custom_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The non-aten ops `gm` calls ("ns::op"), to show next to splitting ops that match nothing."""
    names = {min(op_names(n.target)) for n in gm.graph.nodes if n.op == "call_function" and op_names(n.target)}
    return sorted(n for n in names if not n.startswith(("aten::", "prims::")))


def _batch_symbols(fakes: Sequence[Any]) -> set[str]:
    symbols = set()
    for value in fakes:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and isinstance(value.shape[0], torch.SymInt):
            symbols.add(str(value.shape[0]))
    return symbols


class _RecordPieceArgs(torch.fx.Interpreter):
    """Runs the stitching module and records the arguments each named piece receives."""

    def __init__(self, module: torch.fx.GraphModule, names: set[str]) -> None:
        super().__init__(module)
        self.names = names
        self.args: dict[str, tuple] = {}

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target in self.names:
            self.args[target] = args
        return super().call_module(target, args, kwargs)


def _traced_args(item: SplitItem) -> tuple:
    """The FakeTensors/SymInts piece `item` received in Dynamo's trace: its placeholders' `example_value`s, which
    `split_module` copies from the traced nodes.

    Read, never recomputed: re-running the stitching module under the trace's fake mode would mint a fresh unbacked
    symbol for every data-dependent size (`.item()`, `nonzero`, a splitting op whose fake impl calls
    `new_dynamic_size()`) and leave it pending in the shared ShapeEnv, where the next `standalone_compile` fails
    with `PendingUnbackedSymbolNotFound`.
    """
    args = []
    for node in item.graph.graph.nodes:
        if node.op == "placeholder":
            value = example_value(node)
            if value is None:
                raise RuntimeError(
                    f"pieceworks: input {node.name} of piece {item.submod_name} has no example value; pieceworks "
                    f"needs a graph traced by Dynamo"
                )
            args.append(value)
    return tuple(args)


def _inputs_at_size(fakes: Sequence[Any], example_inputs: Sequence[Any], size: int) -> list[Any]:
    """Real top-level inputs of batch `size`: rows of the traced inputs repeated cyclically, SymInts set to size."""
    inputs = []
    for fake, real in zip(fakes, example_inputs):
        if isinstance(fake, torch.SymInt):
            inputs.append(size)
        elif isinstance(fake, torch.Tensor) and fake.dim() > 0 and isinstance(fake.shape[0], torch.SymInt):
            inputs.append(cycle_rows(real, size))
        else:
            inputs.append(real)
    return inputs


def build_runtime(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: CompilationConfig, *, for_compile: bool = False
) -> Runtime:
    """Split `gm`, compile its pieces for every target, and return the runtime that calls, captures and replays
    them. The runtime's `build_seconds` says where this call's time went: `split`, `compile` (compiling or loading
    every piece) and `backend` (this call up to the runtime's construction: the cache key and the rest included)."""
    build_start = time.perf_counter()
    counters.num_graphs_seen += 1
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [example_value(n) for n in placeholders]
    batch_symbols = _batch_symbols(fakes)
    fake_mode = fake_mode_of(fakes)
    if fake_mode is None:
        raise RuntimeError("pieceworks needs a graph traced by Dynamo (placeholders carry FakeTensor example values)")

    check_splitting_ops(config.splitting_ops)
    absent = absent_splitting_ops(gm, config.splitting_ops)
    if absent:
        log.warning(
            "pieceworks: splitting ops %s are registered but never called in the traced graph, so they split nothing "
            "(the graph calls %s)", absent, _custom_ops(gm) or "no custom op",
        )
    written = mutated_inputs(gm)
    cache = piece_compiler.open_cache(gm, fakes, config)  # None: off, unusable or unkeyable (logged)

    start = time.perf_counter()
    split_gm, items = split_graph(gm, config.splitting_ops)
    compiled_items = [item for item in items if not item.is_splitting_graph]
    counters.num_piecewise_graphs_seen += len(items)
    counters.num_piecewise_capturable_graphs_seen += len(compiled_items)
    seconds = {"split": time.perf_counter() - start}
    log.info("pieceworks split: %d pieces, %d compiled, in %.3f s", len(items), len(compiled_items), seconds["split"])

    start = time.perf_counter()
    names = {item.submod_name for item in compiled_items}
    static_args = {}
    for size in config.compile_sizes:
        recorder = _RecordPieceArgs(split_gm, names)
        recorder.run(*_inputs_at_size(fakes, example_inputs, size))
        static_args[size] = recorder.args

    compiler = PieceCompiler(config, cache)
    specs = []
    for item in compiled_items:
        fake_args = _traced_args(item)
        fingerprint = graph_fingerprint(item.graph, list(fake_args))
        runnables: dict[Target, Callable] = {}
        for lo_hi in config.ranges():
            runnables[lo_hi] = compiler.get(item, fingerprint, lo_hi, fake_args)
        symbols = data_dependent_sizes(item.graph) if config.compile_sizes else []
        if symbols:  # a static compile would bake in the sizes one call saw: the range code serves compile sizes
            log.info(
                "pieceworks: piece %s has data-dependent sizes (%s): compile_sizes %s are served by the code "
                "compiled for their ranges", item.submod_name, ", ".join(symbols), config.compile_sizes,
            )
        for size in config.compile_sizes:
            if symbols:
                runnables[size] = runnables[find_range(config.ranges(), size)]
            else:
                runnables[size] = compiler.get(item, fingerprint, size, static_args[size][item.submod_name])
        piece = CompiledPiece(
            item.submod_name, BatchLocator(fake_args, batch_symbols), runnables,
            config.compile_sizes, config.ranges(),
        )
        specs.append(PieceSpec(item, piece, tuple(fake_args)))
    seconds["compile"] = time.perf_counter() - start
    log.info(
        "pieceworks compile (%s): %d pieces, %d distinct targets compiled, %d loaded from cache, "
        "%d served by an identical piece, in %.3f s",
        config.compiler, len(compiled_items), compiler.compiled, compiler.loaded, compiler.shared, seconds["compile"],
    )
    seconds["backend"] = time.perf_counter() - build_start
    return Runtime(
        split_gm, specs, items, BatchLocator(fakes, batch_symbols), example_inputs, sorted(written), config,
        for_compile=for_compile, cache_dir=cache.directory if cache is not None else None, build_seconds=seconds,
    )
