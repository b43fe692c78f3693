"""Helpers of the project's own suites (not part of the harness users build on).

- `dynamo_graph`: the graph Dynamo hands a backend, for tests of splitting and compiling in isolation.
- Call signatures for the tests of pieceworks' argument checks (`InputError`): `signatures()` draws one,
  `signature_args` makes its arguments, `SignatureModule` takes any of them, `mismatches()` draws one way a
  call can differ from it and `apply_mismatch` applies that.
- `docs_adapter`: the CPU adapter docs/conformance.md shows, as written there.
- `conformance_command`: the conformance suite's command line as a user types it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx
import torch.nn as nn
from hypothesis import strategies as st


def docs_adapter() -> str:
    """The python block after "A padded runner on a CPU" in docs/conformance.md."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "conformance.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index("A padded runner on a CPU") :], re.S)
    assert block, "docs/conformance.md: no python block after 'A padded runner on a CPU'"
    return block.group(1)


def dynamo_graph(model: Callable[..., Any], args: Sequence[Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """Trace `model(*args)` with Dynamo (dim 0 of tensor arguments dynamic); return the graph and its inputs.

    The inputs are the real tensors and ints Dynamo passes the backend (parameters included), in placeholder
    order, so `gm(*inputs)` runs the graph. The model runs once as part of tracing.
    """
    captured: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        captured["gm"], captured["inputs"] = gm, list(example_inputs)
        return gm.forward

    traced_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    for a in traced_args:
        if isinstance(a, torch.Tensor):
            torch._dynamo.mark_dynamic(a, 0)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(*traced_args)
    torch._dynamo.reset()
    return captured["gm"], captured["inputs"]


# ---- call signatures, for argument checks ------------------------------------------------------------------
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool)
_values = st.one_of(
    st.integers(-3, 3),
    st.floats(-2, 2, allow_nan=False, width=32),
    st.booleans(),
    st.sampled_from(["mean", "sum"]),
    st.none(),
)


def signatures(max_args: int = 4) -> st.SearchStrategy[tuple]:
    """A call signature: a tuple of ("tensor", dtype name, trailing sizes) and ("value", v); at least one
    tensor."""
    tensor = st.tuples(
        st.just("tensor"),
        st.sampled_from([str(d).removeprefix("torch.") for d in _DTYPES]),
        st.lists(st.integers(1, 3), max_size=2).map(tuple),
    )
    value = st.tuples(st.just("value"), _values)
    return (
        st.lists(st.one_of(tensor, value), min_size=1, max_size=max_args)
        .filter(lambda sig: any(spec[0] == "tensor" for spec in sig))
        .map(tuple)
    )


def signature_args(signature: tuple, batch: int, seed: int = 0) -> list[Any]:
    """Arguments of `signature` at batch size `batch` (dim 0 of every tensor), values from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    args = []
    for spec in signature:
        if spec[0] == "value":
            args.append(spec[1])
        else:
            data = torch.randn(batch, *spec[2], generator=gen) * 3
            args.append(data > 0 if spec[1] == "bool" else data.to(getattr(torch, spec[1])))
    return args


class SignatureModule(nn.Module):
    """Takes any `signatures()` call: the row sums of every tensor, scaled by the numeric values. Output
    [B]."""

    def forward(self, *args: Any) -> torch.Tensor:
        total = None
        for a in args:
            if isinstance(a, torch.Tensor):
                rows = a.to(torch.float32).reshape(a.shape[0], -1).sum(-1)
                total = rows if total is None else total + rows
        for a in args:
            if isinstance(a, (int, float)) and not isinstance(a, bool):
                total = total * (1 + a)
            elif a is True:
                total = total.neg()
        return total


def mismatches(signature: tuple) -> st.SearchStrategy[tuple]:
    """One way a call can differ from `signature` other than its batch size: (kind, argument index, detail).

    kinds: "trailing" (a trailing size), "rank" (one more or one fewer dimension), "dtype", "device" (meta),
    "count" (one argument fewer or more), "value" (a plain value changed), "kind" (a tensor where a value was,
    or the reverse), "batch" (one tensor's dim 0 differs from the others').
    """
    tensors = [i for i, spec in enumerate(signature) if spec[0] == "tensor"]
    values = [i for i, spec in enumerate(signature) if spec[0] == "value"]
    options = [
        st.tuples(st.just("dtype"), st.sampled_from(tensors), st.sampled_from(_DTYPES)),
        st.tuples(st.just("device"), st.sampled_from(tensors), st.just("meta")),
        st.tuples(st.just("rank"), st.sampled_from(tensors), st.booleans()),
        st.tuples(st.just("count"), st.just(len(signature)), st.booleans()),
        st.tuples(st.just("kind"), st.integers(0, len(signature) - 1), st.just(None)),
    ]
    with_trailing = [i for i in tensors if signature[i][2]]
    if with_trailing:
        options.append(st.tuples(st.just("trailing"), st.sampled_from(with_trailing), st.integers(1, 2)))
    if values:
        options.append(st.tuples(st.just("value"), st.sampled_from(values), _values))
    if len(tensors) > 1:
        options.append(st.tuples(st.just("batch"), st.sampled_from(tensors[1:]), st.integers(1, 2)))
    return st.one_of(options)


def apply_mismatch(args: list[Any], mismatch: tuple) -> list[Any] | None:
    """`args` changed by `mismatch`; None when the draw changes nothing (same dtype, same value)."""
    kind, i, detail = mismatch
    args = list(args)
    if kind == "count":
        return args[:-1] if detail and len(args) > 1 else args + [args[0]] if detail else args + [1]
    a = args[i] if i < len(args) else None
    if kind == "dtype":
        if a.dtype == detail:
            return None
        args[i] = a.to(detail)
    elif kind == "device":
        args[i] = a.to("meta")
    elif kind == "rank":
        args[i] = a.unsqueeze(-1) if detail or a.dim() == 1 else a.sum(-1)
    elif kind == "trailing":
        args[i] = torch.cat([a] * (detail + 1), dim=-1)
    elif kind == "value":
        # the same value, or an equal one of another type (1 vs 1.0 vs True): a case of its own
        if detail == a:
            return None
        args[i] = detail
    elif kind == "kind":
        batch = next(t.shape[0] for t in args if isinstance(t, torch.Tensor))
        args[i] = 1 if isinstance(a, torch.Tensor) else torch.ones(batch)
    elif kind == "batch":
        args[i] = torch.cat([a] * (detail + 1), dim=0)
    return args


def conformance_command(*args: str) -> list[str]:
    """The conformance suite run as a user types it (the installed suite, pytest's cache off), with `args`."""
    suite = [
        "-p",
        "pieceworks.conformance.plugin",
        "--pyargs",
        "pieceworks.conformance",
        "-p",
        "no:cacheprovider",
    ]
    return [sys.executable, "-m", "pytest", *suite, *args]
