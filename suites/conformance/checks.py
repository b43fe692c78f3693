"""Comparisons the properties share: outputs against eager, structure first, with dtype-appropriate
tolerances.

An implementation's output is judged against eager's output for the same inputs: the same structure (tuple,
list and dict types, keys, lengths), every tensor with eager's shape and dtype (so a padded implementation
cuts back exactly the tensors whose dim 0 is the batch in eager's output, and no other), values within
`tolerances`.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

import torch

__all__ = ["assert_same", "clone", "main_tensor", "tolerances", "is_clear_error"]


class Tolerances(TypedDict):
    rtol: float
    atol: float


def tolerances(dtype: torch.dtype) -> Tolerances:
    """rtol/atol for comparing an implementation with eager in `dtype` (compiled kernels fuse and reorder)."""
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float64:
        return {"rtol": 1e-7, "atol": 1e-7}
    return {"rtol": 1e-4, "atol": 1e-4}


def clone(value: Any) -> Any:
    """A deep copy of an output structure's tensors (outputs are valid only until the next call)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(clone(v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, clone(v)) for k, v in value.items())
    return value


def main_tensor(value: Any) -> torch.Tensor:
    """The first tensor of an output structure (depth first, dicts in order)."""
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value
    return next(main_tensor(v) for v in items)


def assert_same(got: Any, expected: Any, where: str = "output") -> None:
    """`got` has `expected`'s structure (types, keys, lengths), every tensor its shape and dtype, and its
    values within `tolerances` (NaN equal to NaN: poisoned rows of the reference stay NaN)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: a {type(got).__name__}, eager gives a tensor"
        assert got.shape == expected.shape, (
            f"{where}: shape {tuple(got.shape)}, eager's {tuple(expected.shape)}"
        )
        assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype}, eager's {expected.dtype}"
        try:
            torch.testing.assert_close(got, expected, equal_nan=True, **tolerances(expected.dtype))
        except AssertionError as exc:
            raise AssertionError(f"{where}: {_differing(got, expected)}\n{exc}") from None
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), (
            f"{where}: keys {list(got)}, eager's {list(expected)}"
        )
        for k in expected:
            assert_same(got[k], expected[k], f"{where}[{k!r}]")
    elif isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected), (
            f"{where}: {type(got).__name__} of {len(got)}, eager gives {type(expected).__name__} of "
            f"{len(expected)}"
        )
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{where}[{i}]")
    else:
        assert got == expected, f"{where}: {got!r}, eager gives {expected!r}"


def _differing(got: torch.Tensor, expected: torch.Tensor) -> str:
    """Which rows (dim 0) of `got` differ from `expected`'s (same shape), and by how much at most."""
    close = torch.isclose(got, expected, equal_nan=True, **tolerances(expected.dtype))
    if got.dim() == 0:
        return f"{got.item()!r}, eager's {expected.item()!r}"
    rows = (~close).reshape(close.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
    diff = (got.double() - expected.double()).abs()[~close]
    largest = diff.max().item() if diff.numel() else 0.0
    shown = f"{rows[:8]}" + (f" and {len(rows) - 8} more" if len(rows) > 8 else "")
    return f"rows {shown} of {got.shape[0]} differ from eager's (largest difference {largest:.3g})"


_CLEAR = re.compile(r"input|address|argument|moved", re.IGNORECASE)


def is_clear_error(exc: BaseException) -> bool:
    """An error a caller can act on: it says which input or address is at fault."""
    return bool(_CLEAR.search(str(exc)))
