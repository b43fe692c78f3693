"""Calling the compiled graph without Dynamo: call arguments to graph inputs, graph outputs to the model's output.

Dynamo hands a backend `example_inputs`: the real values of the graph's placeholders in the tracing call (the
call's tensors, the model's parameters and buffers, and the batch size as a SymInt). `bind` proves, from that one
call, how to build them for any later call:
- a placeholder whose example is (by identity) a tensor argument of the tracing call reads that argument;
- a placeholder whose example value is a batch-size symbol gets the call's batch size;
- a placeholder whose example is a parameter or buffer of the model is bound to that object once, so in-place
  updates stay visible. Replacing one (setattr, `load_state_dict(assign=True)`, a new submodule) or reallocating
  it (`.to()`, `.cuda()`, `.half()`) is seen by a `StateWatch` (registration hooks and a wrapper of the modules'
  `_apply`: nothing per call) and refused at the next call: the graphs still read the old memory;
and the model's output is the graph's outputs arranged as in the tracing call: each output tensor found by identity
among the graph's outputs, `None` kept, inside tuples, lists and dicts.

Anything else (a tensor the model reads from a global or a plain attribute, an output Dynamo built outside the
graph, a namedtuple or dataclass output, a non-tensor output) makes `bind` return why not, and the caller keeps
calling through Dynamo. Python side effects of `forward` (attribute writes, prints) happen in the tracing call only:
after it, the graph is the model.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ._compat import after_apply, example_value, symbol_name
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


class StateReplacedError(RuntimeError):
    """A parameter or buffer of a compiled model was replaced or reallocated after compiling."""


_WATCHES: set[StateWatch] = set()  # the live watches; the process-wide registration hooks below call each


def _registered(module: torch.nn.Module, name: str, value: Any) -> None:
    """A registration hook: `value` is about to become `module.name` (any module of the process). Not traced: in a
    forward Dynamo traces (a buffer assigned), it would guard on the live watches, which come and go with models."""
    for watch in [] if torch.compiler.is_compiling() else list(_WATCHES):
        watch._check(module, [(name, value)], "replaced")


@functools.cache
def _register_hooks_once() -> None:
    """One hook per kind for the whole process, never removed: Dynamo guards on torch's dicts of global hooks, and a
    hook removed while another model was being traced (a compiled model collected) broke that trace's guards."""
    for register in (torch.nn.modules.module.register_module_parameter_registration_hook,
                     torch.nn.modules.module.register_module_buffer_registration_hook,
                     torch.nn.modules.module.register_module_module_registration_hook):
        register(_registered)


class StateWatch:
    """`replaced`: None, or the message naming the first parameter, buffer or submodule of `model` replaced, or
    parameter or buffer reallocated, since the watch began. The process-wide registration hooks (while `owner` lives)
    and a wrapper of each submodule's `_apply` update it when that happens; reading it is all a call costs."""

    def __init__(self, model: torch.nn.Module, owner: object) -> None:
        self.replaced: str | None = None
        # Per (module id, attribute name): the full name, the object there (kept alive, so that the ids stay theirs)
        # and, for a tensor, where its memory lives.
        self._watched: dict[tuple[int, str], tuple[str, Any, tuple | None]] = {}
        for prefix, module in model.named_modules():
            for name, value in _attributes(module):
                self._watched[id(module), name] = (f"{prefix}.{name}" if prefix else name, value, _place(value))
            after_apply(module, self._applied)
        _register_hooks_once()
        _WATCHES.add(self)
        weakref.finalize(owner, _WATCHES.discard, self)

    def _applied(self, module: torch.nn.Module) -> None:
        """After `module._apply` (`.to()` and the like; a deep copy of a watched module reports here too)."""
        self._check(module, _attributes(module), "reallocated (.to(), .cuda(), .half() or the like)")

    def _check(self, module: torch.nn.Module, attributes: Sequence[tuple[str, Any]], how: str) -> None:
        """Flag the first of `module`'s watched `attributes` that is not the object watched there, or not where it
        was. An attribute not watched (another module's, a deep copy's) is never read: it may be a fake tensor."""
        for name, value in attributes:
            full, watched, place = self._watched.get((id(module), name), (None, None, None))
            if full is not None and self.replaced is None and (watched is not value or _place(value) != place):
                self.replaced = (
                    f"{full} of the compiled model was {how} after its first call; its compiled graphs still read "
                    "the old tensor. Fix: load new values in place (model.load_state_dict(state) without "
                    "assign=True, or `with torch.no_grad(): param.copy_(new)`), or compile the model again with "
                    "pieceworks.compile")


def _attributes(module: torch.nn.Module) -> tuple[tuple[str, Any], ...]:
    """A module's own parameters, buffers (each under every name it has) and submodules."""
    return (*module.named_parameters(recurse=False, remove_duplicate=False),
            *module.named_buffers(recurse=False, remove_duplicate=False), *module.named_children())


def _place(value: Any) -> tuple | None:
    return (value.data_ptr(), value.dtype, value.device) if isinstance(value, torch.Tensor) else None
