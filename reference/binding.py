"""Calling the compiled graph without Dynamo: call arguments to graph inputs, graph outputs to the model's
output.

`Arguments` puts a call's positional and keyword arguments in one order, the one the compiled model serves:
the first call's positional arguments, then its keyword arguments sorted by name. A later call of the same
form (as many positional arguments, the same keywords, in any order) costs one list; a call of another form is
bound by the model's `forward` signature once per form (`model(ids)` after `model(input_ids=ids)`): a
parameter the first call left to its default must be passed with that default's value (type and value, as any
non-tensor argument), since the trace baked it in.

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
import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ._compat import example_value, symbol_name
from .values import tree_map


class Source(enum.IntEnum):
    """Where a graph input comes from (`Binder.sources`): a call argument, the batch size, or a tensor of
    the model's own (a parameter or buffer)."""

    ARG, BATCH, BOUND = range(3)


class Place(enum.IntEnum):
    """Where a call holds a parameter's value (`Arguments`): a position, a keyword, or the default."""

    POSITIONAL, KEYWORD, DEFAULT = range(3)


# the call path's names, as plain ints (compared per call; what a serving record pickles)
_ARG, _BATCH, _BOUND = map(int, Source)
_POSITIONAL, _KEYWORD, _DEFAULT = map(int, Place)


class InputError(ValueError):
    """A call's arguments do not fit what the model was compiled for."""


_FIX = "Fix: pass arguments like the first call's, or compile another CompiledModel"


class Arguments:
    """The first call's form (`count` positional arguments, then keyword arguments `names`, sorted);
    `labels` name each place for messages (its position or keyword). `flat(args, kwargs)`: a call's
    arguments in that order (an `InputError` naming an argument that does not fit), and `split(flat)` the
    call again."""

    def __init__(self, fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.fn, self.count, self.names, self.keys = fn, len(args), tuple(sorted(kwargs)), set(kwargs)
        self.labels = [*map(str, range(len(args))), *self.names]
        self._forms: dict[tuple, tuple[list, list]] = {}

    def flat(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        if len(args) == self.count and kwargs.keys() == self.keys:
            return [*args, *map(kwargs.__getitem__, self.names)]
        form = (len(args), tuple(sorted(kwargs)))
        if form not in self._forms:
            self._forms[form] = self.plan(*form)
        sources, extras = self._forms[form]
        for kind, where, default, label in extras:
            value = args[where] if kind == _POSITIONAL else kwargs[where]
            if value is not default and (type(value) is not type(default) or isinstance(value, torch.Tensor)
                                         or value != default):
                raise InputError(f"argument {label} is {value!r:.80}, but the model was compiled with its "
                                 f"default {default!r}: the first call left it out. {_FIX}")
        return [args[w] if k == _POSITIONAL else (kwargs[w] if k == _KEYWORD else w) for k, w in sources]

    def split(self, flat: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
        return list(flat[:self.count]), dict(zip(self.names, flat[self.count:]))

    def plan(self, count: int, names: tuple[str, ...]) -> tuple[list, list]:
        """Per place of the first call's form, where a call of form (`count`, `names`) has its value (or the
        parameter's default); and the call's arguments the first call left to defaults."""
        signature = inspect.signature(self.fn)
        called = f"compiled for {_form(self.count, self.names)}, called with {_form(count, names)}"
        first = _bound(signature, self.count, self.names, called)  # where the first call had each value
        now = _bound(signature, count, names, called)
        default = {key: signature.parameters[key].default if isinstance(key, str) else inspect.Parameter.empty
                   for key in {*first, *now}}
        for key in [k for k in first if k not in now] + [k for k in now if k not in first]:
            if default[key] is inspect.Parameter.empty:
                raise InputError(f"{called}: argument {_label(key)} "
                                 + ("is missing, but the first call passed it" if key in first
                                    else "was not passed in the first call") + f". {_FIX}")
        # the first call's places sort in its flat order: (_POSITIONAL, i) by i, then (_KEYWORD, name) by name
        return ([now.get(key, (_DEFAULT, default[key])) for key in sorted(first, key=first.get)],
                [(*now[key], default[key], _label(key)) for key in now if key not in first])


def _bound(signature: inspect.Signature, count: int, names: Sequence[str],
           called: str) -> dict[Any, tuple[int, Any]]:
    """Per parameter (a `*args` item by (name, index), a `**kwargs` entry by (name, key)), where a call of
    `count` positional arguments and keywords `names` has its value: (_POSITIONAL, index) or (_KEYWORD,
    name)."""
    try:
        bound = signature.bind(*[(_POSITIONAL, i) for i in range(count)], **{k: (_KEYWORD, k) for k in names})
    except TypeError as exc:
        raise InputError(f"{called}: {exc}: the model's forward{signature} does not take them. Fix: call the "
                         f"model with arguments its forward takes") from None
    found = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        items = enumerate(value) if kind is inspect.Parameter.VAR_POSITIONAL else (
            value.items() if kind is inspect.Parameter.VAR_KEYWORD else None)
        found.update({(name, k): v for k, v in items} if items is not None else {name: value})
    return found


def _form(count: int, names: Sequence[str]) -> str:
    return f"{count} arguments" + (f" and the keywords {', '.join(names)}" if names else "")


def _label(key: Any) -> str:
    return key if isinstance(key, str) else f"{key[0]}[{key[1]!r}]"


class Binder:
    """`inputs(args, batch)`: the graph's flat inputs for a call; `outputs(flat)`: the model's output.

    `sources`: per graph input, `(_ARG, call argument index)`, `(_BATCH, None)` or `(_BOUND, the tensor)`;
    `template`: the model's output with each tensor replaced by its graph output index (`None` stays `None`, a
    constant is a `Constant`)."""

    def __init__(self, sources: list[tuple[int, Any]], template: Any) -> None:
        self.sources, self.template = sources, template

    def inputs(self, args: Sequence[Any], batch: int) -> list[Any]:
        return [args[v] if kind == _ARG else (batch if kind == _BATCH else v) for kind, v in self.sources]

    def outputs(self, flat: Sequence[Any]) -> Any:
        if type(self.template) is int:
            return flat[self.template]
        return tree_map(lambda k: flat[k] if type(k) is int else (None if k is None else k.value),
                        self.template)

    def describe(self, model: Any) -> tuple[list[tuple[int, Any]], Any]:
        """`(sources, template)` in plain values, bound tensors named by their parameter or buffer name in
        `model`: what `restore` needs to bind the same graph to a model of the same structure in another
        process."""
        names = {id(t): name for name, t in _state(model)}
        return [(kind, names[id(v)] if kind == _BOUND else v) for kind, v in self.sources], self.template

    @classmethod
    def restore(cls, description: tuple[list[tuple[int, Any]], Any], model: Any) -> Binder:
        """The `Binder` that `describe` described, bound to `model`'s parameters and buffers (`KeyError`
        naming a missing one)."""
        sources, template = description
        state = dict(_state(model))
        return cls([(kind, state[v] if kind == _BOUND else v) for kind, v in sources], template)


class Constant:
    """A constant leaf of the model's output (`bind`'s template), reproduced on every call."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


CONSTANT_TYPES = (bool, int, float, str, bytes, torch.dtype, torch.device, enum.Enum)


def _state(model: Any) -> list[tuple[str, torch.Tensor]]:
    """`model`'s parameters and buffers by name, shared tensors under each of their names."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]


def bind(model: Any, placeholders: Sequence[torch.fx.Node], example_inputs: Sequence[Any],
         call_args: Sequence[Any], batch_symbols: set[str], call_output: Any,
         graph_output: Any) -> Binder | str:
    """A `Binder` for the graph traced from `model(*call_args)` (see the module doc), or why it cannot be
    proven."""
    if len(placeholders) != len(example_inputs):
        return f"{len(placeholders)} graph inputs but {len(example_inputs)} example inputs"
    by_id = {id(a): k for k, a in enumerate(call_args) if isinstance(a, torch.Tensor)}
    state = {id(t) for _, t in _state(model)}
    sources: list[tuple[int, Any]] = []
    for node, example in zip(placeholders, example_inputs):
        if isinstance(example, torch.Tensor) and id(example) in by_id:
            sources.append((_ARG, by_id[id(example)]))
        elif symbol_name(example_value(node)) in batch_symbols:
            sources.append((_BATCH, None))
        elif isinstance(example, torch.Tensor) and id(example) in state:
            sources.append((_BOUND, example))
        else:
            return (f"graph input {node.name} is neither a call argument, a parameter or buffer of the "
                    f"model, nor the batch size. Fix: make the tensor a parameter or buffer of the model "
                    f"(register_buffer), or pass it as an argument")
    if not isinstance(graph_output, (tuple, list)):
        return "the graph did not return a tuple"
    index = {id(t): k for k, t in enumerate(graph_output) if isinstance(t, torch.Tensor)}
    problems = []
    # A number in the output is the trace's constant unless the graph returns numbers (a size it computed)
    baked = all(isinstance(t, torch.Tensor) for t in graph_output)

    def leaf(value: Any) -> Any:
        if baked and isinstance(value, CONSTANT_TYPES):
            return Constant(value)
        if value is not None and id(value) not in index:  # `index` holds tensors only
            problems.append(type(value).__name__)
        return index.get(id(value))

    template = tree_map(leaf, call_output)
    if problems:
        return (f"the model's output holds values that are not graph outputs ({', '.join(problems)}). Fix: "
                f"return tensors the model computes, None and constants, in tuples, lists, dicts, "
                f"dataclasses or mappings (a Hugging Face model: call it with use_cache=False, so that no "
                f"cache object is returned)")
    return Binder(sources, template)
