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

from . import inductor
from .cache import CompileCache, cache_key
from .config import CompilationConfig
from .counters import counters
from .fingerprint import environment_factors, graph_fingerprint
from .graph import PiecewiseGraph, PieceSpec
from .piece import BatchLocator, CompiledPiece
from .capturability import mutated_inputs
from .split import SplitItem, split_graph

__all__ = ["Backend", "build_piecewise_graph", "cache_factors"]

log = logging.getLogger("pieceworks")

Target = int | tuple[int, int]


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


class _PieceCompiler:
    """Compiles (or loads) each distinct (piece fingerprint, target) once."""

    def __init__(self, config: CompilationConfig, cache: CompileCache | None) -> None:
        self.config = config
        self.cache = cache
        self.done: dict[tuple[str, Target], Callable[..., Any]] = {}
        self.compiled = self.loaded = self.shared = 0

    def get(self, item: SplitItem, fingerprint: str, target: Target, example_args: Sequence[Any]) -> Callable:
        key = (fingerprint, target)
        if key in self.done:
            self.shared += 1
            counters.num_shared_piece_compiles += 1
            return self.done[key]
        static = isinstance(target, int)
        name = (f"size:{target}" if static else f"range:{target[0]}-{target[1]}") + f"|{fingerprint}"
        fn = None
        if self.cache is not None:
            fn = self.cache.load(name, lambda path: inductor.load_artifact(path, item.graph))
            self.loaded += fn is not None
        if fn is None:
            fn = self._compile(item, name, static, example_args)
        self.done[key] = fn
        return fn

    def _compile(self, item: SplitItem, name: str, static: bool, example_args: Sequence[Any]) -> Callable:
        self.compiled += 1
        counters.num_backend_compilations += 1
        if self.config.compiler == "eager":
            counters.num_eager_compiles += 1
            return inductor.compile_eager(item.graph)
        counters.num_inductor_compiles += 1
        fn, artifact = inductor.compile_inductor(
            item.graph, list(example_args), static=static, inductor_config=self.config.inductor_compile_config
        )
        if self.cache is not None:
            self.cache.store(name, lambda path: inductor.save_artifact(artifact, path))
        return fn


def cache_factors(gm: torch.fx.GraphModule, fakes: Sequence[Any], config: CompilationConfig) -> dict[str, str]:
    """Everything that changes compiled code, as digests: the graph with its input metadata, the config's
    code-relevant fields, and the software and GPU (see fingerprint.py). Nothing that varies per run."""
    return {
        "environment": environment_factors(),
        "config": config.compute_hash(),
        "graph": graph_fingerprint(gm, fakes),
    }


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
        factors = cache_factors(gm, fakes, config)
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

    compiler = _PieceCompiler(config, cache)
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
