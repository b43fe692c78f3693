"""Calling the stitching module without Dynamo: call arguments to its inputs, its outputs to the model's
output.

Dynamo hands a backend `example_inputs`: the real values of the graph's placeholders in the tracing call (the
call's tensors, the model's parameters and buffers, and the batch size as a SymInt). `bind` proves, from that
one call, how to build them for any later call:
- a placeholder whose example is (by identity) a tensor argument of the tracing call reads that argument;
- a placeholder whose example value is a batch-size symbol gets the call's batch size;
- a placeholder whose example is a parameter or buffer of the model is bound to that object once, so in-place
  updates stay visible. Replacing one (setattr, `load_state_dict(assign=True)`, a new submodule) or
  reallocating it (`.to()`, `.cuda()`, `.half()`) is seen by the model's `StateWatch` (watch.py: nothing per
  call) and refused at the next call: the graphs still read the old memory;
and the model's output is the graph's outputs arranged as in the tracing call: each output tensor found by
identity among the graph's outputs, `None` and plain constants (numbers, strings, dtypes: what the trace baked
in) kept, inside tuples, lists, dicts, namedtuples, mappings (a Hugging Face `ModelOutput`, whose unset fields
stay None) and dataclasses (`values.children`).

Anything else (a tensor the model reads from a global or a plain attribute, an output Dynamo built outside the
graph, an object such as a KV-cache object in the output) makes `bind` return why not and the fix, and the
caller keeps calling through Dynamo. Python side effects of `forward` (attribute writes, prints) happen in the
tracing call only: after it, the graph is the model.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import torch

from ..core import CompiledPieces, torch_compat, tree_map

# Where a graph input comes from (`Binder.sources`): a call argument, the batch size, or a tensor of the
# model's own (a parameter or buffer). Plain ints: compared per call, and what a serving record pickles.
_ARG, _BATCH, _BOUND = range(3)


class Binder:
    """`inputs(args, batch)`: the graph's flat inputs for a call; `outputs(flat)`: the model's output.

    `sources`: per graph input, `(_ARG, call argument index)`, `(_BATCH, None)` or `(_BOUND, the tensor)`;
    `template`: the model's output with each tensor replaced by its graph output index (`None` stays `None`, a
    constant is a `Constant`)."""

    def __init__(self, sources: list[tuple[int, Any]], template: Any) -> None:
        self.sources, self.template = sources, template

    def inputs(self, args: Sequence[Any], batch: int) -> list[Any]:
        return [args[v] if src == _ARG else (batch if src == _BATCH else v) for src, v in self.sources]

    def outputs(self, flat: Sequence[Any]) -> Any:
        if type(self.template) is int:
            return flat[self.template]
        return tree_map(lambda k: flat[k] if type(k) is int else getattr(k, "value", None), self.template)

    def describe(self, model: Any) -> tuple[list[tuple[int, Any]], Any]:
        """`(sources, template)` in plain values, bound tensors named by their parameter or buffer name in
        `model`: what `restore` needs to bind the same graph to a model of the same structure in another
        process."""
        names = {id(t): name for name, t in named_state(model)}
        return [(src, names[id(v)] if src == _BOUND else v) for src, v in self.sources], self.template

    @classmethod
    def restore(cls, description: tuple[list[tuple[int, Any]], Any], model: Any) -> Binder:
        """The `Binder` that `describe` described, bound to `model`'s parameters and buffers (`KeyError`
        naming a missing one)."""
        (sources, template), state = description, dict(named_state(model))
        return cls([(source, state[v] if source == _BOUND else v) for source, v in sources], template)


class Constant:
    """A constant leaf of the model's output (`bind`'s template), reproduced on every call."""

    def __init__(self, value: Any) -> None:
        self.value = value


CONSTANT_TYPES = (bool, int, float, str, bytes, torch.dtype, torch.device, enum.Enum)


def named_state(model: Any) -> list[tuple[str, torch.Tensor]]:
    """`model`'s parameters and buffers by name, shared tensors under each of their names."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]


def bind(
    model: Any, graph: CompiledPieces, examples: list[Any], args: list[Any], output: Any, graph_output: Any
) -> Binder | str:
    """A `Binder` for `graph`, traced from `model(*args)` with graph inputs `examples` (Dynamo's
    `example_inputs`), that returned `output` from the stitching module's `graph_output` (see the module
    doc); or why it cannot be proven."""
    placeholders = graph.stitching_module.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(examples):
        return f"{len(placeholders)} graph inputs but {len(examples)} example inputs"
    # the source of each tensor by identity: a parameter or buffer, or a call argument (which comes first)
    known: dict[int, tuple[int, Any]] = {id(t): (_BOUND, t) for _, t in named_state(model)}
    known |= {id(a): (_ARG, k) for k, a in enumerate(args) if isinstance(a, torch.Tensor)}
    sources: list[tuple[int, Any]] = []
    for node, example in zip(placeholders, examples):
        batch = torch_compat.symbol_name(torch_compat.example_value(node)) in graph.batch_symbols
        if not batch and id(example) not in known:
            return (
                f"graph input {node.name} is neither a call argument, a parameter or buffer of the "
                f"model, nor the batch size. Fix: make the tensor a parameter or buffer of the model "
                f"(register_buffer), or pass it as an argument"
            )
        sources.append((_BATCH, None) if batch else known[id(example)])
    if not isinstance(graph_output, (tuple, list)):
        return "the graph did not return a tuple"
    index = {id(t): k for k, t in enumerate(graph_output) if isinstance(t, torch.Tensor)}
    # A number in the output is the trace's constant unless the graph returns numbers (a size it computed)
    problems, baked = [], all(isinstance(t, torch.Tensor) for t in graph_output)

    def leaf(value: Any) -> Any:
        if baked and isinstance(value, CONSTANT_TYPES):
            return Constant(value)
        if value is not None and id(value) not in index:  # `index` holds tensors only
            problems.append(type(value).__name__)
        return index.get(id(value))

    template = tree_map(leaf, output)
    if problems:
        return (
            f"the model's output holds values that are not graph outputs ({', '.join(problems)}). Fix: "
            f"return tensors the model computes, None and constants, in tuples, lists, dicts, dataclasses or "
            f"mappings (a Hugging Face model: call it with use_cache=False, so it returns no cache object)"
        )
    return Binder(sources, template)
