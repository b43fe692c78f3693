"""The value helpers every layer shares: walking nested outputs, and repeating rows to a batch size."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

_LEAVES = frozenset({int, float, bool, str, type(None), torch.Tensor, torch.nn.Parameter})


def children(value: Any) -> tuple[list[Any], Callable[[list[Any]], Any]] | None:
    """The items of an output container and a function building one like it (its exact type) from new
    items; None for a leaf. Containers: tuples, lists and dicts, namedtuples, other mappings (a Hugging
    Face `ModelOutput`: the fields that are set, so those left unset stay None), and dataclasses (every
    field; rebuilt as a copy whose fields are set, not through `__init__`)."""
    cls = type(value)
    if cls is tuple or cls is list:
        return list(value), cls
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return list(value), lambda items: cls(*items)
    if isinstance(value, Mapping):
        keys = list(value)
        if cls is dict or not dataclasses.is_dataclass(value):
            return [value[k] for k in keys], lambda items: cls(zip(keys, items))
        return [value[k] for k in keys], lambda items: cls(**dict(zip(keys, items)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [field.name for field in dataclasses.fields(value)]

        def rebuild(items: list[Any]) -> Any:
            new = copy.copy(value)
            for name, item in zip(names, items):
                object.__setattr__(new, name, item)
            return new

        return [getattr(value, name) for name in names], rebuild
    return None


def tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    """`value` with `fn` applied to every leaf; the containers of `children` are walked and keep their
    types."""
    cls = type(value)
    if cls is tuple or cls is list:
        return cls(tree_map(fn, v) for v in value)
    if cls is dict:
        return {k: tree_map(fn, v) for k, v in value.items()}
    if cls in _LEAVES or (found := children(value)) is None:
        return fn(value)
    items, rebuild = found
    return rebuild([tree_map(fn, v) for v in items])


def tensors_in(value: Any, leaf_type: type | tuple[type, ...] = torch.Tensor) -> list[Any]:
    """The tensors (or other leaves of type `leaf_type`) in `value`, a leaf or a nested container, in
    order."""
    found: list[Any] = []
    tree_map(lambda v: found.append(v) if isinstance(v, leaf_type) else None, value)
    return found


def cycle_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """A new tensor of `n` rows: `t`'s rows repeated in order (row i is `t[i % len(t)]`); valid values, never
    uninitialised memory, so a padded row is always a legal input (a token id stays a valid index)."""
    return t.index_select(0, torch.arange(n, device=t.device) % t.shape[0])
