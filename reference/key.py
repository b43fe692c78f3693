"""The compile cache's key, every factor of it, in one place.

A key names what determines compiled code and nothing that varies per run: node names, file paths, process ids
and times never enter it. Equal inputs give equal digests in any process.

- `cache_factors` / `cache_key`: the folder of one compiled graph: the graph (its stitching wiring and every
  piece's fingerprint), the config's code-relevant fields (`CompilationConfig.compute_hash`), the effective
  global Inductor/functorch configuration, and the software and GPU;
- `graph_fingerprint`: a graph's ops, wiring, constants, attribute contents and input metadata. Two pieces
  with the same fingerprint compute the same function of their positional inputs, so one artifact serves both;
- `entry`: a piece's entry inside the folder, and what the entry must say about the piece to be loaded for
  it;
- `software_factors`: the torch build, CUDA/HIP, Triton, Python, CPU architecture, GPU;
- `inductor_config_factors`: the effective global Inductor and functorch configuration;
- `key_change`: why a key is new, the first fact that differs from the newest key of the same graph (or
  model) stored beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import os
import platform
from collections.abc import Callable
from typing import Any

import torch

from ._compat import functorch_config, inductor_config, op_identity, require
from .cache import read_json_dict
from .counters import log


def digest(*parts: str) -> str:
    """SHA-256 of `parts`, each ended by a NUL byte (so that ("ab", "c") and ("a", "bc") differ)."""
    return hashlib.sha256(b"".join(part.encode() + b"\0" for part in parts)).hexdigest()


def describe_value(value: Any) -> str:
    """Metadata of an example value (shape, strides, dtype, device), with symbolic sizes as their
    expressions."""
    if isinstance(value, torch.Tensor):
        shape, strides = tuple(map(str, value.shape)), tuple(map(str, value.stride()))
        return f"T({shape},{strides},{value.dtype},{value.device.type})"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"S({value})"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(describe_value(v) for v in value) + ")"
    return type(value).__name__


def _node_target(node: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    """What a node calls, or for `get_attr` what it reads (the attribute's contents, never its name)."""
    target = node.target
    if node.op == "get_attr":
        value = functools.reduce(getattr, str(target).split("."), gm)
        return _tensor_digest(value) if isinstance(value, torch.Tensor) else type(value).__name__
    if isinstance(target, str):
        return target if node.op == "call_method" else ""
    if op_identity(target) is not None:
        return str(target)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    return f"{getattr(target, '__module__', None) or ''}.{name}"


def _tensor_digest(t: torch.Tensor) -> str:
    raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    try:
        data = raw.numpy().tobytes()
    except RuntimeError:  # torch without NumPy: slower, same bytes
        data = bytes(raw.tolist())
    return hashlib.sha256(data).hexdigest()


def constant_text(value: Any) -> str:
    """A constant argument, as code sees it: `x * 2` and `x * 3` are different code, so they never share."""
    return repr(value)


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
            items = sorted(a.items(), key=lambda kv: str(kv[0]))
            return "{" + ",".join(f"{k}:{arg(v)}" for k, v in items) + "}"
        return f"tensor:{_tensor_digest(a)}" if isinstance(a, torch.Tensor) else constant_text(a)

    given, lines = iter(example_args or ()), []
    for n in gm.graph.nodes:
        value = n.meta.get("example_value")
        value = next(given, value) if n.op == "placeholder" else value  # a placeholder's given value, if any
        lines.append(f"{n.op}|{_node_target(n, gm)}|{arg(n.args)}|{arg(n.kwargs)}|{describe_value(value)}")
    return digest(*lines)


def software_factors() -> dict[str, str]:
    """The software and hardware that compiled code depends on, read afresh on every call: the torch build
    (version and git hash), CUDA/HIP, Triton, Python, the CPU architecture and the current GPU (name and
    compute capability). Equal in every process of one installation on one machine type."""
    version = torch.version
    factors = {"torch": torch.__version__, "git": str(version.git_version), "cuda": str(version.cuda)}
    factors |= {"hip": str(version.hip), "python": platform.python_version(), "machine": platform.machine()}
    factors |= {"triton": "none", "gpu": "none"}  # where there is none
    with contextlib.suppress(Exception):  # Triton is optional on CPU builds
        factors["triton"] = str(require("triton").__version__)
    if torch.cuda.is_available():  # the current device
        factors["gpu"] = f"{torch.cuda.get_device_name()}|sm={torch.cuda.get_device_capability()}"
    return factors


class UnkeyableConfigError(ValueError):
    """The global Inductor configuration holds a value whose effect on code cannot be digested (a custom
    graph pass without `uuid()`). Artifacts compiled under it cannot be cached safely. The message names
    the entry."""


# Inductor config entries that hold graph passes (callables). Inductor's own cache keys them by `uuid()` (see
# torch._inductor.custom_graph_pass.CustomGraphPass) and refuses to cache a pass without one; so do we.
_CUSTOM_PASSES = ["pre_grad_custom_pass", "joint_custom_pre_pass", "joint_custom_post_pass"]
_CUSTOM_PASSES += ["post_grad_custom_pre_pass", "post_grad_custom_post_pass", "_pre_fusion_custom_pass"]


def portable(value: Any, where: str, graph_pass: bool = False) -> Any:
    """A JSON-able stand-in for a config value that is the same in every process, or UnkeyableConfigError.
    `graph_pass`: the value is a custom graph pass (or None), keyed only by its `uuid()`."""
    if callable(getattr(value, "uuid", None)):
        return f"uuid:{value.uuid()}"
    if graph_pass and value is not None:
        fix = "torch._inductor.custom_graph_pass.CustomGraphPass so that its version can enter the cache key"
        raise UnkeyableConfigError(f"{where} is {value!r}, which has no uuid(); make it a {fix}")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [portable(v, where) for v in value]
        return items if isinstance(value, (list, tuple)) else sorted(items, key=repr)  # a set's order varies
    if isinstance(value, dict):
        return {str(k): portable(v, where) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: portable(getattr(value, f.name), where) for f in dataclasses.fields(value)}
    if callable(getattr(value, "to_dict", None)):  # a transformers config
        return portable(value.to_dict(), where)
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    why = "whose effect on compiled code cannot be digested"
    raise UnkeyableConfigError(f"{where} holds {type(value).__name__} {value!r}, {why}")


def inductor_config_factors() -> str:
    """Digest of the effective global Inductor and functorch (AOTAutograd) configuration.

    What Inductor itself keys its FX-graph cache on: each module's `save_config_portable()`, which leaves out
    what cannot change code (`trace.*` debug output, `cutlass_dir` paths, `compile_threads`,
    `worker_start_method`, the cache switches, private `_` entries), plus custom graph passes by their
    `uuid()`. Equal configurations give equal digests in any process; a custom pass without `uuid()` raises
    `UnkeyableConfigError` (the caller compiles without the cache).
    """
    inductor, doc = inductor_config(), {}
    for name, module in (("inductor", inductor), ("functorch", functorch_config())):
        for key, value in module.save_config_portable().items():
            doc[f"{name}.{key}"] = portable(value, f"torch._{name}.config.{key}")
    for key in _CUSTOM_PASSES:
        doc[f"inductor.{key}"] = portable(getattr(inductor, key, None), f"torch._inductor.config.{key}", True)
    return digest(json.dumps(doc, sort_keys=True, separators=(",", ":")))


def cache_factors(
    split_gm: torch.fx.GraphModule, fakes: list[Any], piece_fingerprints: list[str], config: Any
) -> dict[str, Any]:
    """Everything that changes compiled code: the graph (a digest of the stitching module's wiring with its
    input metadata, and each piece's fingerprint in run order), the config's code-relevant fields, the
    effective global Inductor/functorch configuration, and the software and GPU. Raises
    `UnkeyableConfigError` when the Inductor configuration holds something that cannot be digested."""
    graph = digest(graph_fingerprint(split_gm, fakes), *piece_fingerprints)
    inductor, environment = inductor_config_factors(), software_factors()
    return {"graph": graph, "config": config.hash_factors(), "inductor": inductor, "environment": environment}


def as_json(value: Any) -> Any:
    """`value` as a JSON file holds it (tuples as lists, other objects by `repr`), in its own order."""
    return json.loads(json.dumps(value, default=repr))


# Where two keys' facts first differ: its path, the old value, the new one (`first_change`).
Change = tuple[str, Any, Any]


def first_change(old: Any, new: Any, where: str = "") -> Change | None:
    """The first place where two keys' facts (JSON as stored) differ: (its path, e.g.
    "config.compile_sizes" or "modules.layers.0.attributes.eps", the old value, the new one), or None where
    they are equal."""
    same_length_lists = isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
    if isinstance(old, dict) and isinstance(new, dict):
        names = [*new, *(k for k in old if k not in new)]  # in the new facts' order
        parts = [(f"{where}.{name}" if where else str(name), old.get(name), new.get(name)) for name in names]
    elif same_length_lists and not all(isinstance(x, (int, float, type(None))) for x in old + new):
        parts = [(f"{where}[{k}]", a, b) for k, (a, b) in enumerate(zip(old, new))]
    else:  # a value, or a list of numbers (a shape, strides), compares whole
        return None if old == new else (where, old, new)
    return next(filter(None, (first_change(a, b, path) for path, a, b in parts)), None)


def describe_change(change: Change) -> str:
    """`first_change`'s finding in words: "<path> was <old>, is <new>" (values cut to 80 characters)."""
    short = [text if len(text := repr(v)) <= 80 else text[:77] + "..." for v in change[1:]]
    return f"{change[0]} was {short[0]}, is {short[1]}"


def key_change(root: str, key: str, factors: dict[str, Any], same: Callable[[dict], bool]) -> Change | None:
    """Why `factors` (`cache_factors`, or a serving record's) have a key folder of their own under `root`:
    the `first_change` from the factors of the newest other key folder there (the one used last) that holds
    entries (an index.json) and whose factors `same` accepts (the same graph, the same model class). None
    where there is no such folder, nothing differs, or the folders cannot be read (logged at DEBUG: an
    explanation never fails a call)."""
    try:
        found = []
        for name in os.listdir(root) if os.path.isdir(root) else ():
            folder = os.path.join(root, name)
            if name != key and os.path.exists(os.path.join(folder, "index.json")):
                if (stored := read_json_dict(os.path.join(folder, "factors.json"))) and same(stored):
                    with contextlib.suppress(OSError):
                        found.append((os.stat(folder).st_mtime, stored))
        return first_change(max(found, key=lambda f: f[0])[1], as_json(factors)) if found else None
    except Exception as exc:  # noqa: BLE001 - an explanation must never fail a compile or a call
        log.debug("pieceworks: no explanation of the new key %s (%s: %s)", key, type(exc).__name__, exc)
        return None


def cache_key(factors: dict[str, Any]) -> str:
    """The cache folder name for `factors` (`cache_factors`): equal factors, equal key, in any process (a
    value JSON does not hold by its `repr`)."""
    return digest(json.dumps(factors, sort_keys=True, separators=(",", ":"), default=repr))[:24]


def entry(fingerprint: str, target: int | tuple[int, int], example_args: list[Any]) -> tuple[str, dict]:
    """The cache entry of a piece with `fingerprint` compiled for `target` from `example_args`: its name
    (`size:4|<fingerprint>`, `range:1-8192|<fingerprint>`) and its claim, what the entry must say about
    the piece to be loaded for it (fingerprint, target, input metadata)."""
    target_name = f"size:{target}" if isinstance(target, int) else f"range:{target[0]}-{target[1]}"
    inputs = digest(*map(describe_value, example_args))
    return f"{target_name}|{fingerprint}", {"graph": fingerprint, "target": target_name, "inputs": inputs}
