"""Getting the graph Dynamo hands a backend, for tests of splitting and compiling in isolation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

__all__ = ["dynamo_graph"]


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
