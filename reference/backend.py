"""The torch.compile backend: split the Dynamo graph, compile every non-splitting piece, stitch them back.

Everything is compiled inside the backend call, before the first result is returned: one symbolic compile per
compile range and one static compile per compile size for every structurally distinct piece. Pieces with equal
fingerprints share one compiled artifact (a 12-layer ToyLlama has 13 compiled pieces but 3 distinct ones).
No batch size seen later triggers a compile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .cache import CompileCache, cache_key
from . import compiler as piece_compiler
from .compiler import PieceCompiler, Target
from .config import CompilationConfig
from .counters import counters
from .fingerprint import graph_fingerprint
from .graph import PiecewiseGraph, PieceSpec
from .piece import BatchLocator, CompiledPiece
from .capturability import mutated_inputs
from .split import SplitItem, split_graph

__all__ = ["Backend", "build_piecewise_graph"]

log = logging.getLogger("pieceworks")



class Backend:
    """A torch.compile backend: `torch.compile(model, backend=Backend(config), fullgraph=True)`.

    Each graph Dynamo hands over becomes a `PiecewiseGraph`, kept in `graphs` in arrival order. Dynamo's guards and
    dynamic-shape marking are the caller's business here; `pieceworks.compile` takes care of both.
    """

    def __init__(self, config: CompilationConfig | None = None, *, arm_lazy_capture: bool = True) -> None:
        self.config = config if config is not None else CompilationConfig()
        self.graphs: list[PiecewiseGraph] = []
        # False: graphs start with lazy capture off (pieceworks.compile arms it once its static buffers exist,
        # so that the tracing call, which runs on throw-away inputs, captures nothing).
        self.arm_lazy_capture = arm_lazy_capture
        self.frozen = False  # set by pieceworks.compile once its one graph exists: no request may compile

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> PiecewiseGraph:
        if self.frozen:
            raise RuntimeError(
                "pieceworks: Dynamo asked to compile this model again after its first call (was "
                "torch._dynamo.reset() called?). A CompiledModel never compiles while serving. Fix: create a new "
                "CompiledModel with pieceworks.compile"
            )
        graph = build_piecewise_graph(gm, example_inputs, self.config)
        graph.lazy_capture = self.config.lazy_capture and self.arm_lazy_capture
        self.graphs.append(graph)
        return graph


def _example_value(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


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


def _inputs_at_size(fakes: Sequence[Any], example_inputs: Sequence[Any], size: int) -> list[Any]:
    """Real top-level inputs of batch `size`: rows of the traced inputs repeated cyclically, SymInts set to size."""
    inputs = []
    for fake, real in zip(fakes, example_inputs):
        if isinstance(fake, torch.SymInt):
            inputs.append(size)
        elif isinstance(fake, torch.Tensor) and fake.dim() > 0 and isinstance(fake.shape[0], torch.SymInt):
            rows = torch.arange(size, device=real.device) % real.shape[0]
            inputs.append(real.index_select(0, rows))
        else:
            inputs.append(real)
    return inputs


def build_piecewise_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: CompilationConfig
) -> PiecewiseGraph:
    """Split `gm`, compile its pieces for every target, and return the stitched, dispatching callable."""
    counters.num_graphs_seen += 1
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [_example_value(n) for n in placeholders]
    batch_symbols = _batch_symbols(fakes)
    fake_mode = next((v.fake_mode for v in fakes if hasattr(v, "fake_mode")), None)
    if fake_mode is None:
        raise RuntimeError("pieceworks needs a graph traced by Dynamo (placeholders carry FakeTensor example values)")

    written = mutated_inputs(gm)
    cache = None
    if config.cache_active():
        factors = piece_compiler.cache_factors(gm, fakes, config)
        cache = CompileCache(config.resolved_cache_dir(), cache_key(factors), factors)
        log.info("pieceworks compile cache: %s", cache.directory)

    start = time.perf_counter()
    split_gm, items = split_graph(gm, config.splitting_ops)
    compiled_items = [item for item in items if not item.is_splitting_graph]
    counters.num_piecewise_graphs_seen += len(items)
    counters.num_piecewise_capturable_graphs_seen += len(compiled_items)
    log.info(
        "pieceworks split: %d pieces, %d compiled, in %.3f s", len(items), len(compiled_items),
        time.perf_counter() - start,
    )

    start = time.perf_counter()
    names = {item.submod_name for item in compiled_items}
    symbolic = _RecordPieceArgs(split_gm, names)
    with fake_mode:
        symbolic.run(*fakes)
    static_args = {}
    for size in config.compile_sizes:
        recorder = _RecordPieceArgs(split_gm, names)
        recorder.run(*_inputs_at_size(fakes, example_inputs, size))
        static_args[size] = recorder.args

    compiler = PieceCompiler(config, cache)
    specs = []
    for item in compiled_items:
        fake_args = symbolic.args[item.submod_name]
        fingerprint = graph_fingerprint(item.graph, list(fake_args))
        runnables: dict[Target, Callable] = {}
        for lo_hi in config.ranges():
            runnables[lo_hi] = compiler.get(item, fingerprint, lo_hi, fake_args)
        for size in config.compile_sizes:
            runnables[size] = compiler.get(item, fingerprint, size, static_args[size][item.submod_name])
        piece = CompiledPiece(
            item.submod_name, item.graph_id, BatchLocator(fake_args, batch_symbols), runnables,
            config.compile_sizes, config.ranges(),
        )
        specs.append(PieceSpec(item, piece, tuple(fake_args)))
    log.info(
        "pieceworks compile (%s): %d pieces, %d distinct targets compiled, %d loaded from cache, "
        "%d served by an identical piece, in %.3f s",
        config.compiler, len(compiled_items), compiler.compiled, compiler.loaded, compiler.shared,
        time.perf_counter() - start,
    )
    graph = PiecewiseGraph(
        split_gm, specs, items, BatchLocator(fakes, batch_symbols), fakes, config,
        cache_dir=cache.directory if cache is not None else None,
    )
    graph.mutated_input_ids = {id(example_inputs[i]) for i in written}
    return graph
