"""Every private torch API the model layer uses, in one place, each feature-detected for torch 2.11-2.15 (the
core's own are `pieceworks.core.torch_compat`, whose `require` finds them here too).

What is private, and what the versions differ in (checked against the 2.11, 2.13 and 2.15 sources):
- Dynamo's `torch._dynamo.config.patch(capture_scalar_outputs=, capture_dynamic_output_shape_ops=)`: both
  flags in 2.11-2.15 (newer Dynamo implies them under fullgraph=True; setting them keeps every version alike);
- for a warm start without tracing (record.py): the code objects Dynamo traced, `TracingContext.traced_code`,
  and its shape guards, `TracingContext.fake_mode.shape_env.guards` (2.11-2.15); Dynamo's configuration
  (`save_config_portable`) and nn.Module's global forward hooks, for its key;
  `torch.fx._graph_pickler.GraphPickler` (`dumps`, `loads(data, fake_mode)`, `Options(ops_filter=,
  node_metadata_key_filter=)`), which pickles a Dynamo graph, or its split, with its FakeTensor and SymInt
  metadata; torch's own sympy functions pickle by
  `_torch_unpickler`, and a fake mode is not pickled (the loader supplies a fresh one); the graph is rebuilt
  under `torch._guards.tracing(TracingContext(fake_mode))`, as a backend call would be. Where any of this is
  missing or fails, the record is not written and warm starts trace as before;
- `nn.Module._apply(fn)`, through which `.to()`, `.cuda()`, `.half()` reallocate parameters and buffers (no
  public hook sees it): the watched class of watch.py overrides it (2.11-2.15);
  `torch.utils.hooks.RemovableHandle.next_id`, the count of hook handles torch has handed out (every hook
  registration moves it; 2.11-2.15), `torch._C._len_torch_function_stack()`, how many torch function modes
  are active (`torch.device(...)` as a context and `torch.set_default_device` each add one; 2.11-2.15), and
  nn.Module's global forward hooks, for `StateWatch`.

A missing feature raises `TorchCompatError` once, at first use (`HookHandle`,
`modes`: at import), naming the feature, the torch version and the fix; nothing here patches torch.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from ..core import torch_compat

require = torch_compat.require  # finds a module's features, or raises TorchCompatError naming what is missing

# Checked at import: a call reads `HookHandle.next_id` (hooks handed out so far), so it must not cost a
# lookup.
HookHandle = require("torch.utils.hooks", "RemovableHandle.next_id").RemovableHandle
# Checked at import, read per call: how many torch function modes are active (a default device is one)
modes = require("torch._C", "_len_torch_function_stack")._len_torch_function_stack


def data_dependent_tracing() -> Any:
    """A context in which Dynamo keeps data-dependent ops (`.item()`, `nonzero`) in its graph instead of
    breaking."""
    config = require("torch._dynamo.config", "capture_dynamic_output_shape_ops")
    return config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)


def trace_facts() -> tuple[list[Any] | None, list[Any]]:
    """Of the graph being compiled (call inside a backend): the code objects Dynamo traced, None where this
    torch does not list them; and its shape guards (sympy expressions such as `s0 <= 8`), [] where this torch
    gives none."""
    context = torch._guards.TracingContext.try_get()
    codes, fake_mode = getattr(context, "traced_code", None), getattr(context, "fake_mode", None)
    guards = [guard.expr for guard in getattr(getattr(fake_mode, "shape_env", None), "guards", ())]
    return None if codes is None else list(codes), guards


def dynamo_config() -> dict[str, Any]:
    """Dynamo's configuration as `save_config_portable()` gives it: what can change a trace."""
    return require("torch._dynamo.config", "save_config_portable").save_config_portable()


def global_module_hooks() -> bool:
    """Whether forward hooks are registered for every module (`register_module_forward_hook` and its
    pre-hook)."""
    module = torch.nn.modules.module
    return any(getattr(module, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks"))


def pickle_graph(graph: Any) -> bytes:
    """A Dynamo graph, or an object holding graphs split from one, with their FakeTensor/SymInt metadata as
    bytes (`unpickle_graph` reverses it); raises where this torch cannot pickle it. A placeholder's
    "grapharg", Dynamo's record of the traced example (real tensors: the weights), is left out, as Dynamo
    drops it from its own graph once compiled."""
    import sympy

    pickler = require("torch.fx._graph_pickler", "GraphPickler", "Options")
    fake_mode = require("torch._subclasses", "FakeTensorMode").FakeTensorMode
    graph_pickler: Any = pickler.GraphPickler  # typed Any: mypy takes no other variable as a base class

    class Pickler(graph_pickler):
        def reducer_override(self, obj: object) -> Any:
            if isinstance(obj, type) and issubclass(obj, sympy.Function) and hasattr(obj, "_torch_unpickler"):
                return obj._torch_unpickler, (cast(Any, obj)._torch_handler_name,)
            # a fake mode pickles as None: the loader supplies its own
            return (type(None), ()) if isinstance(obj, fake_mode) else super().reducer_override(obj)

    default = pickler.Options().node_metadata_key_filter or (lambda key: True)
    keys = lambda key: key != "grapharg" and default(key)  # noqa: E731
    return Pickler.dumps(graph, pickler.Options(ops_filter=None, node_metadata_key_filter=keys))


def unpickle_graph(data: bytes) -> tuple[Any, Any]:
    """`(graph, tracing)`: what `pickle_graph` wrote, its metadata in a fresh FakeTensorMode and shape
    environment; and the context a backend runs in (`torch._guards.tracing(TracingContext(fake_mode))`), in
    which to rebuild it outside Dynamo."""
    shape_env = require("torch.fx.experimental.symbolic_shapes", "ShapeEnv").ShapeEnv()
    fake_mode = require("torch._subclasses", "FakeTensorMode").FakeTensorMode(shape_env=shape_env)
    graph = require("torch.fx._graph_pickler", "GraphPickler").GraphPickler.loads(data, fake_mode)
    guards = require("torch._guards", "tracing", "TracingContext")
    return graph, guards.tracing(guards.TracingContext(fake_mode))
