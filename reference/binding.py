"""Calling the compiled graph without Dynamo: call arguments to graph inputs, graph outputs to the model's output.

Dynamo hands a backend `example_inputs`: the real values of the graph's placeholders in the tracing call (the
call's tensors, the model's parameters and buffers, and the batch size as a SymInt). `bind` proves, from that one
call, how to build them for any later call:
- a placeholder whose example is (by identity) a tensor argument of the tracing call reads that argument;
- a placeholder whose example value is a batch-size symbol gets the call's batch size;
- a placeholder whose example is a parameter or buffer of the model is bound to that object once, so in-place
  updates stay visible. Replacing one (setattr, `load_state_dict(assign=True)`, a new submodule) or reallocating
  it (`.to()`, `.cuda()`, `.half()`) is seen by the model's `StateWatch` (watch.py: nothing per call) and refused at
  the next call: the graphs still read the old memory;
and the model's output is the graph's outputs arranged as in the tracing call: each output tensor found by identity
among the graph's outputs, `None` kept, inside tuples, lists and dicts.

Anything else (a tensor the model reads from a global or a plain attribute, an output Dynamo built outside the
graph, a namedtuple or dataclass output, a non-tensor output) makes `bind` return why not, and the caller keeps
calling through Dynamo. Python side effects of `forward` (attribute writes, prints) happen in the tracing call only:
after it, the graph is the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ._compat import example_value, symbol_name
from .values import tree_map

_ARG, _BATCH, _BOUND = 0, 1, 2


class Binder:
    """`inputs(args, batch)`: the graph's flat inputs for a call; `outputs(flat)`: the model's output.

    `sources`: per graph input, `(_ARG, call argument index)`, `(_BATCH, None)` or `(_BOUND, the tensor)`;
    `template`: the model's output with each tensor replaced by its graph output index (`None` stays `None`)."""

    def __init__(self, sources: list[tuple[int, Any]], template: Any) -> None:
        self.sources = sources
        self.template = template

    def inputs(self, args: Sequence[Any], batch: int) -> list[Any]:
        return [args[v] if kind == _ARG else (batch if kind == _BATCH else v) for kind, v in self.sources]

    def outputs(self, flat: Sequence[Any]) -> Any:
        if type(self.template) is int:
            return flat[self.template]
        return tree_map(lambda k: None if k is None else flat[k], self.template)

    def describe(self, model: Any) -> tuple[list[tuple[int, Any]], Any]:
        """`(sources, template)` in plain values, bound tensors named by their parameter or buffer name in `model`:
        what `restore` needs to bind the same graph to a model of the same structure in another process."""
        names = {id(t): name for name, t in _state(model)}
        return [(kind, names[id(v)] if kind == _BOUND else v) for kind, v in self.sources], self.template

    @classmethod
    def restore(cls, description: tuple[list[tuple[int, Any]], Any], model: Any) -> Binder:
        """The `Binder` that `describe` described, bound to `model`'s parameters and buffers (`KeyError` naming a
        missing one)."""
        sources, template = description
        state = dict(_state(model))
        return cls([(kind, state[v] if kind == _BOUND else v) for kind, v in sources], template)


def _state(model: Any) -> list[tuple[str, torch.Tensor]]:
    """`model`'s parameters and buffers by name, shared tensors under each of their names."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]


def bind(model: Any, placeholders: Sequence[torch.fx.Node], example_inputs: Sequence[Any], call_args: Sequence[Any],
         batch_symbols: set[str], call_output: Any, graph_output: Any) -> Binder | str:
    """A `Binder` for the graph traced from `model(*call_args)` (see the module doc), or why it cannot be proven."""
    if len(placeholders) != len(example_inputs):
        return f"{len(placeholders)} graph inputs but {len(example_inputs)} example inputs"
    by_id = {id(a): k for k, a in enumerate(call_args) if isinstance(a, torch.Tensor)}
    state = {id(t) for t in (*model.parameters(), *model.buffers())} if isinstance(model, torch.nn.Module) else set()
    sources: list[tuple[int, Any]] = []
    for node, example in zip(placeholders, example_inputs):
        if isinstance(example, torch.Tensor) and id(example) in by_id:
            sources.append((_ARG, by_id[id(example)]))
        elif symbol_name(example_value(node)) in batch_symbols:
            sources.append((_BATCH, None))
        elif isinstance(example, torch.Tensor) and id(example) in state:
            sources.append((_BOUND, example))
        else:
            return (f"graph input {node.name} is neither a call argument, a parameter or buffer of the model, nor the "
                    f"batch size")
    if not isinstance(graph_output, (tuple, list)):
        return "the graph did not return a tuple"
    index = {id(t): k for k, t in enumerate(graph_output) if isinstance(t, torch.Tensor)}
    problems = []

    def leaf(value: Any) -> int | None:
        if value is not None and id(value) not in index:  # `index` holds tensors only
            problems.append(type(value).__name__)
        return index.get(id(value))

    template = tree_map(leaf, call_output)
    if problems:
        return f"the model's output holds values that are not graph outputs ({', '.join(problems)})"
    return Binder(sources, template)
