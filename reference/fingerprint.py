"""Stable digests of graphs and of the software that compiles them.

A fingerprint names what determines compiled code and nothing that varies per run: node names, file paths,
process ids and times never enter it. Two pieces with the same fingerprint compute the same function of their
positional inputs, so one compiled artifact serves both. Equal inputs give equal digests in any process.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from typing import Any

import torch
import torch.fx

from ._compat import op_identity

__all__ = ["graph_fingerprint", "environment_factors", "digest"]


def digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def describe_value(value: Any) -> str:
    """Metadata of an example value (shape, strides, dtype, device), with symbolic sizes as their expressions."""
    if isinstance(value, torch.Tensor):
        return f"T({tuple(map(str, value.shape))},{tuple(map(str, value.stride()))},{value.dtype},{value.device.type})"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"S({value})"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(describe_value(v) for v in value) + ")"
    return type(value).__name__


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target if node.op == "call_method" else ""
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    if op_identity(target) is not None:
        return str(target)
    return f"{module}.{name}"


def _tensor_digest(t: torch.Tensor) -> str:
    raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    try:
        data = raw.numpy().tobytes()
    except RuntimeError:  # torch without NumPy: slower, same bytes
        data = bytes(raw.tolist())
    return hashlib.sha256(data).hexdigest()


def graph_fingerprint(gm: torch.fx.GraphModule, example_args: list[Any] | None = None) -> str:
    """Digest of `gm`'s structure: ops, wiring, constants, attribute contents and input metadata.

    Node names are replaced by positions, so the same layer at two depths gives the same fingerprint.
    `example_args` (the values the piece is compiled for) add their metadata; placeholders' `example_value`
    is used where they are not given.
    """
    index = {node: i for i, node in enumerate(gm.graph.nodes)}

    def arg(a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            return f"%{index[a]}"
        if isinstance(a, (list, tuple)):
            return ("[" if isinstance(a, list) else "(") + ",".join(arg(x) for x in a) + ")"
        if isinstance(a, dict):
            return "{" + ",".join(f"{k}:{arg(v)}" for k, v in sorted(a.items(), key=lambda kv: str(kv[0]))) + "}"
        if isinstance(a, torch.Tensor):
            return f"tensor:{_tensor_digest(a)}"
        return repr(a)

    lines = []
    placeholder_index = 0
    for node in gm.graph.nodes:
        meta = node.meta.get("example_value")
        if node.op == "placeholder":
            if example_args is not None and placeholder_index < len(example_args):
                meta = example_args[placeholder_index]
            placeholder_index += 1
        extra = ""
        if node.op == "get_attr":
            value = gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
            extra = _tensor_digest(value) if isinstance(value, torch.Tensor) else type(value).__name__
        lines.append(
            f"{node.op}|{_target_name(node)}|{arg(node.args)}|{arg(node.kwargs)}|{describe_value(meta)}|{extra}"
        )
    return digest(*lines)


@functools.cache
def environment_factors() -> str:
    """Everything outside the graph and config that changes compiled code: torch build, Triton, Python, device."""
    parts = [
        f"torch={torch.__version__}",
        f"git={getattr(torch.version, 'git_version', '')}",
        f"cuda={torch.version.cuda}",
        f"hip={getattr(torch.version, 'hip', None)}",
        f"python={platform.python_version()}",
        f"machine={platform.machine()}",
    ]
    try:
        import triton

        parts.append(f"triton={triton.__version__}")
    except Exception:  # noqa: BLE001 - Triton is optional on CPU builds
        parts.append("triton=none")
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        parts.append(f"gpu={torch.cuda.get_device_name(index)}|sm={torch.cuda.get_device_capability(index)}")
    return ";".join(parts)
