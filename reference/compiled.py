"""One Dynamo FX graph compiled piecewise: split it, analyse and compile every piece, stitch them back.

`compile_pieces` does it all before the first result is returned, and returns an immutable `CompiledPieces`:
the stitching module with the compiled pieces installed, and the `Piece` records. Structurally identical
pieces share one compiled artifact (a 12-layer ToyLlama has 13 compiled pieces but 3 distinct ones). No batch
size seen later triggers a compile. Its two steps are public: `split_pieces` splits and analyses (a
`CompiledPieces` whose pieces are not compiled yet), and `compile_pieces` also takes what it returned, leaving
it as it was, so that a caller may keep the split (the serving record pickles it: a warm start then neither
splits nor analyses). Callers: the torch.compile door (backend.py) and the model layer (pieceworks.model),
each handing the result to a `Runtime`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import torch.fx

from ._compat import example_value, fake_mode_of, op_identity
from .cache import CompileCache
from .compiler import PieceCompiler
from .config import CompilationConfig
from .counters import counters, log
from .key import UnkeyableConfigError, cache_factors, cache_key, describe_change, key_change
from .piece import BatchPosition, Piece, batch_position, mutated_inputs, traced_args
from .progress import progress
from .split import absent_splitting_ops, batch_symbols, check_splitting_ops, is_splitting_op, split_graph

_INDUCTOR_CHANGED = "the global Inductor configuration (torch._inductor.config) changed"


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledPieces:
    """One Dynamo FX graph, compiled piecewise (from `split_pieces`: split only, its pieces without code);
    read-only.

    `stitching_module`: the FX module calling the pieces in order, compiled pieces installed (calling it runs
    the model without CUDA graphs); `pieces`: every piece in run order, splitting ones included; `inputs`: the
    graph inputs' trace values; `batch_symbols` / `batch`: the batch size's symbols, and where it sits among
    the inputs; `mutated_inputs`: graph inputs some piece writes in place; `restored_inputs`: those a compiled
    piece writes, put back after a FULL capture's warm-ups (a splitting op's writes are not: the warm-ups
    repeat them, as vLLM's dummy runs do; a lazy capture, which serves a call, puts back every mutated input);
    `output_values`: the trace value (FakeTensor) of each graph output; `build_seconds`: where the backend
    call went (`split`: splitting and analysing, as the split's own say, else 0; `pieces`: serving every
    piece its code, of which `load` went to reading and loading artifacts and `compile` to Inductor;
    `backend`: both); `cache_dir`: the cache folder used, if any.
    """

    stitching_module: torch.fx.GraphModule
    pieces: tuple[Piece, ...]
    inputs: tuple
    batch_symbols: frozenset[str]
    batch: BatchPosition | None
    mutated_inputs: tuple[int, ...]
    restored_inputs: tuple[int, ...]
    output_values: tuple
    build_seconds: Mapping[str, float]
    cache_dir: str | None


def open_cache(split: CompiledPieces, config: CompilationConfig) -> CompileCache | None:
    """The compile cache for the graph `split` (`split_pieces`) holds, or None: cache off
    (`config.cache_active()`), its folder unusable, or an Inductor configuration that cannot be keyed (each
    logged once with the reason)."""
    if not config.cache_active():
        return None
    try:
        fingerprints = [p.fingerprint for p in split.pieces]
        factors = cache_factors(split.stitching_module, list(split.inputs), fingerprints, config)
    except UnkeyableConfigError as exc:
        log.warning("pieceworks: compiling without the compile cache: %s", exc)
        return None
    cache = CompileCache.open(config.resolved_cache_dir(), key := cache_key(factors), factors)
    if cache is None:
        return None
    log.info("pieceworks compile cache: %s%s", cache.directory, "" if cache.writable else " (read-only)")
    if not os.path.exists(cache.index_path):  # a new key: why, against the newest key of this graph
        change = key_change(cache.root, key, factors, lambda found: found.get("graph") == factors["graph"])
        if change is not None:  # the Inductor factor is a digest: what changed inside it is not known
            what = _INDUCTOR_CHANGED if change[0] == "inductor" else describe_change(change)
            why = "its compile-cache key changed since its newest entries were stored"
            log.info("pieceworks: compiling this graph again: %s: %s", why, what)
    return cache


def split_pieces(gm: torch.fx.GraphModule, config: CompilationConfig) -> CompiledPieces:
    """Split `gm` (a Dynamo graph) and analyse its pieces, compiling none: the stitching module calls the
    traced pieces, `build_seconds` holds "split". `gm` is changed in place (split.py)."""
    start, fakes = time.perf_counter(), list(traced_args(gm))
    if fake_mode_of(fakes) is None:
        raise RuntimeError("pieceworks needs a Dynamo graph (placeholders carry FakeTensor example values)")
    check_splitting_ops(config.splitting_ops)
    if absent := absent_splitting_ops(gm, config.splitting_ops):
        names = {op[0] for node in gm.graph.nodes if (op := op_identity(node.target)) is not None}  # "ns::op"
        called = sorted(n for n in names if not n.startswith(("aten::", "prims::"))) or "no custom op"
        unused = "registered but never called in the traced graph, so they split nothing"
        log.warning("pieceworks: splitting ops %s are %s (the graph calls %s)", absent, unused, called)
    written = tuple(sorted(mutated_inputs(gm)))
    restored = tuple(sorted(mutated_inputs(gm, lambda node: is_splitting_op(node, config.splitting_ops))))
    split_gm, pieces = split_graph(gm, config.splitting_ops)
    compiled = sum(not p.is_splitting_graph for p in pieces)
    counters.num_piecewise_graphs_seen += len(pieces)
    counters.num_piecewise_capturable_graphs_seen += compiled
    output = gm.graph.output_node().args[0]  # the stitching module returns the same nodes, split among pieces
    flat = output if isinstance(output, (tuple, list)) else (output,)
    outputs = tuple(example_value(n) if isinstance(n, torch.fx.Node) else None for n in flat)
    seconds, symbols = {"split": time.perf_counter() - start}, batch_symbols(gm)
    log.info("pieceworks split: %d pieces, %d compiled, in %.3f s", len(pieces), compiled, seconds["split"])
    found = (tuple(pieces), tuple(fakes), symbols, batch_position(fakes, symbols), written, restored, outputs)
    return CompiledPieces(split_gm, *found, seconds, None)


def compile_pieces(graph: torch.fx.GraphModule | CompiledPieces, config: CompilationConfig) -> CompiledPieces:
    """Compile every piece of `graph`, a Dynamo graph (split first) or what `split_pieces` returned (left
    as it was but for its pieces' code, generated again); see the module doc."""
    split = graph if isinstance(graph, CompiledPieces) else split_pieces(graph, config)
    start, compiled = time.perf_counter(), [p for p in split.pieces if not p.is_splitting_graph]
    counters.num_graphs_seen += 1
    # A stitching module of its own, over a copy of the split's graph. Made first: making it generates the
    # code of every piece's GraphModule too (`recompile` of its submodules), which an unpickled split has
    # none of and which a piece that runs as traced is served.
    fx_graph = torch.fx.Graph()
    fx_graph.output(fx_graph.graph_copy(split.stitching_module.graph, {}))
    stitching = torch.fx.GraphModule(split.stitching_module, fx_graph)
    compiler = PieceCompiler(config, open_cache(split, config))
    done = {p.submod_name: compiler.compile(p) for p in progress(compiled, "compile pieces")}
    for piece in done.values():  # a plain callable may not shadow a registered submodule
        delattr(stitching, piece.submod_name)
        setattr(stitching, piece.submod_name, piece)
    seconds = {"split": 0.0, **split.build_seconds, **compiler.seconds, "pieces": time.perf_counter() - start}
    message = "pieceworks compile (%s): %d pieces, %d distinct targets compiled, %d loaded from cache, "
    message += "%d served by an identical piece, in %.3f s (%.3f s loading)"
    counts = (compiler.compiled, compiler.loaded, compiler.shared, seconds["pieces"], seconds["load"])
    log.info(message, config.compiler, len(compiled), *counts)
    seconds["backend"] = seconds["split"] + seconds["pieces"]
    directory = None if compiler.cache is None else compiler.cache.directory
    found: dict[str, Any] = {"stitching_module": stitching, "cache_dir": directory, "build_seconds": seconds}
    return dataclasses.replace(split, pieces=tuple(done.get(p.submod_name, p) for p in split.pieces), **found)
