"""The two value helpers every layer shares: walking nested outputs, and repeating rows to a batch size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    """`value` with `fn` applied to every leaf; tuples, lists and dicts are walked (their exact types are kept)."""
    if type(value) in (tuple, list):
        return type(value)(tree_map(fn, v) for v in value)
    if type(value) is dict:
        return {k: tree_map(fn, v) for k, v in value.items()}
    return fn(value)


def tensors_in(value: Any, kind: type = torch.Tensor) -> list[Any]:
    """The tensors (or other leaves of type `kind`) in `value`, a leaf or a nested tuple, list or dict, in order."""
    found: list[Any] = []
    tree_map(lambda v: found.append(v) if isinstance(v, kind) else None, value)
    return found


def cycle_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """A new tensor of `n` rows: `t`'s rows repeated in order (row i is `t[i % len(t)]`); valid values, never
    uninitialised memory, so a padded row is always a legal input (a token id stays a valid index)."""
    return t.index_select(0, torch.arange(n, device=t.device) % t.shape[0])
