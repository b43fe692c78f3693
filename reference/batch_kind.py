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
"""

from __future__ import annotations

import enum
from typing import Any


class GraphSupport(enum.IntEnum):
    """What a CUDA graph around a splitting op may hold (vLLM's `AttentionCGSupport`, uniform batches
    merged)."""

    NEVER = 0
    UNIFORM_DECODE = 1
    ALWAYS = 2


_declared: dict[str, GraphSupport] = {}
_uniform = [False]  # the current call's kind; a list so that the context manager below writes it in place


def declare_graph_support(op: str, support: GraphSupport | str) -> None:
    """Declare what a CUDA graph around splitting op `op` ("ns::op") may hold; see the module doc."""
    if isinstance(support, str):
        support = GraphSupport.__members__.get(support.upper(), support)
    if not isinstance(support, GraphSupport) or "::" not in op or "." in op.partition("::")[2]:
        raise ValueError(f"declare_graph_support({op!r}, {support!r}): expected an op packet name 'ns::op' "
                         f"and one of {list(GraphSupport.__members__)}")
    _declared[op] = support


def graph_support(ops: set[str] | frozenset[str]) -> tuple[GraphSupport, str | None]:
    """The least support declared among `ops` (names "ns::op"), and the op that sets it (None: all
    `ALWAYS`)."""
    least = min(((_declared[op], op) for op in ops if op in _declared), default=(GraphSupport.ALWAYS, None))
    return least if least[0] is not GraphSupport.ALWAYS else (GraphSupport.ALWAYS, None)


def is_uniform_decode() -> bool:
    """Whether the call under way is a uniform decode batch (inside `uniform_decode()`)."""
    return _uniform[0]


class uniform_decode:  # noqa: N801 - used as a function: `with pieceworks.uniform_decode():`
    """Calls inside are uniform decode batches when `flag` is true (the default), mixed otherwise; the
    previous kind is restored on exit. Costs two list writes."""

    __slots__ = ("_flag", "_previous")

    def __init__(self, flag: bool = True) -> None:
        self._flag = bool(flag)

    def __enter__(self) -> None:
        self._previous, _uniform[0] = _uniform[0], self._flag

    def __exit__(self, *exc: Any) -> None:
        _uniform[0] = self._previous
