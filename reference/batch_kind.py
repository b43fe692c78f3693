"""What kind of batch a call serves, and which CUDA graphs its splitting ops allow (vLLM's batch descriptor
and attention backends' graph support).

A batch is *uniform decode* (every sequence contributes one new token: a decode step) or *mixed* (prefill
chunks, alone or beside decode tokens). A caller says which with `uniform_decode()` around the call (vLLM's
model runner sets the batch descriptor of its forward context); a call outside it is mixed, the kind every
graph mode serves correctly. Splitting ops that plan their launch on the host (an attention kernel whose grid
or kernel choice depends on host-side query lengths, as FlashAttention's varlen API and FlashInfer's plan do)
read `is_uniform_decode()` and declare, with `declare_graph_support`, what a CUDA graph around them may hold:
- `ALWAYS`: everything the op launches is fixed by the padded token count (lengths read from device buffers),
  so a FULL graph may serve any batch;
- `UNIFORM_DECODE`: a FULL graph may serve only uniform decode batches (its launch was planned for one token
  per sequence); mixed batches run the op eagerly (PIECEWISE) or without graphs;
- `NEVER`: the op cannot sit inside any graph: PIECEWISE (the op eager between graphs) or NONE.

An op nobody declared is `ALWAYS` (a FULL capture that fails still falls back, logged). Declarations are
process-wide, keyed by op name ("ns::op"), made before `pieceworks.compile` sees the op. Not thread-safe: one
call at a time, as the rest of the runtime.

The mode a compiled model gets (`effective_mode`) is the configured one lowered to what its splitting ops
declare (`supported_mode`), logged once.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import torch

from .config import CompilationConfig, CUDAGraphMode
from .counters import log
from .split import op_names

if TYPE_CHECKING:
    from .compiled import CompiledPieces


class GraphSupport(enum.IntEnum):
    """What a CUDA graph around a splitting op may hold (vLLM's `AttentionCGSupport`, uniform batches
    merged)."""

    NEVER, UNIFORM_DECODE, ALWAYS = range(3)


_declared: dict[str, GraphSupport] = {}
_uniform = [False]  # the current call's kind; a list so that the context manager below writes it in place


def declare_graph_support(op: str, support: GraphSupport | str) -> None:
    """Declare what a CUDA graph around splitting op `op` ("ns::op") may hold; see the module doc."""
    if isinstance(support, str):
        support = GraphSupport.__members__.get(support.upper(), support)
    if not isinstance(support, GraphSupport) or "::" not in op or "." in op.partition("::")[2]:
        expected = f"an op packet name 'ns::op' and one of {list(GraphSupport.__members__)}"
        raise ValueError(f"declare_graph_support({op!r}, {support!r}): expected {expected}")
    _declared[op] = support


def graph_support(ops: set[str] | frozenset[str]) -> tuple[GraphSupport, str | None]:
    """The least support declared among `ops` (names "ns::op"), and the op that declares it (None where
    none of them declared any: `ALWAYS`)."""
    return min(((_declared[op], op) for op in ops if op in _declared), default=(GraphSupport.ALWAYS, None))


def is_uniform_decode() -> bool:
    """Whether the call under way is a uniform decode batch (inside `uniform_decode()`)."""
    return _uniform[0]


class uniform_decode:
    """Calls inside are uniform decode batches when `flag` is true (the default), mixed otherwise; the
    previous kind is restored on exit. Costs two list writes."""

    __slots__ = ("_flag", "_previous")

    def __init__(self, flag: bool = True) -> None:
        self._flag = bool(flag)

    def __enter__(self) -> None:
        self._previous, _uniform[0] = _uniform[0], self._flag

    def __exit__(self, *exc: Any) -> None:
        _uniform[0] = self._previous


def effective_mode(config: CompilationConfig, compiled: CompiledPieces) -> CUDAGraphMode:
    """The mode a graph gets: `config.cudagraph_mode`, except NONE without CUDA (warned once), FULL (or
    PIECEWISE's one piece, captured per size as a FULL graph would be) where no splitting op split the
    graph, and lowered to what the splitting ops' declared graph support allows (batch_kind.py; logged
    once)."""
    mode = config.cudagraph_mode
    if mode is CUDAGraphMode.NONE:
        return mode
    if not any(isinstance(v, torch.Tensor) and v.is_cuda for v in compiled.inputs):  # (implied without CUDA)
        where = "the graph's inputs are not on CUDA" if torch.cuda.is_available() else "CUDA is not available"
        fix = "running without CUDA graphs (set cudagraph_mode=NONE to silence this)"
        log.warning("pieceworks: cudagraph_mode=%s but %s: %s", mode.name, where, fix)
        return CUDAGraphMode.NONE
    splitting = [p.fx_graph for p in compiled.pieces if p.is_splitting_graph]
    if mode.has_piecewise and not splitting:  # vLLM's behaviour
        message = "pieceworks: cudagraph_mode=%s and no splitting op in the graph (splitting_ops=%s): %s"
        how = "its one piece is captured per size, as a FULL graph would be"
        log.info(message, mode.name, config.splitting_ops, "FULL covers it" if mode.has_full else how)
        return CUDAGraphMode.FULL if mode.has_full else mode
    ops = {name for fx in splitting for node in fx.graph.nodes for name in op_names(node.target)}
    support, op = graph_support(ops)
    lowered = supported_mode(mode, support)
    if lowered is not mode:
        scope = "mixed batches" if support is GraphSupport.UNIFORM_DECODE else "any batch"
        declared = f"splitting op {op} declares graph support {support.name}"
        message = "pieceworks: cudagraph_mode=%s lowered to %s: %s (a full graph may not hold it for %s)"
        log.warning(message, mode.name, lowered.name, declared, scope)
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
