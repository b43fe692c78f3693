"""`pieceworks.compile(model, config)`: trace once, compile everything, serve every batch size without compiling.

Contracts of the returned `CompiledModel`:
- dim 0 of every tensor argument is the batch dimension, the only dynamic one; all tensor arguments share it;
- the first call traces the model with Dynamo once (with a batch of at least 2, so that Dynamo's 0/1
  specialisation cannot bake in the size) and compiles every piece for every compile range and size before it
  returns; no later call traces or compiles, batch 1 included. The model runs once per call, the first included:
  a first call of batch >= 2 (contiguous tensors) is traced with its own arguments and returns the tracing run's
  result; a first call of batch 1 is traced on a 2-row copy, and whatever that run wrote in place besides the copy
  (the graph's mutated inputs: buffers, a KV cache, parameters) is put back before the call runs. That costs one
  temporary copy of exactly the state the graph writes in place, at that one call;
- after the first call no call enters Dynamo: the compiled graph is called directly, its inputs bound once (see
  binding.py; where the binding cannot be proven, logged once, calls go through Dynamo with its guards dropped).
  Python side effects of `forward` happen in the first call only;
- Dynamo's guards are dropped (`guard_filter_fn`), so pieceworks checks arguments itself on every call: the same
  count, dtypes, devices, ranks and non-batch sizes as the first call, and non-tensor arguments of the same type
  and value (which the trace baked in: `2.0` where the trace saw `2`, or `1` for `True`, raises). A mismatch
  raises `InputError` naming the argument;
- with CUDA graphs (`capture()` called, or `lazy_capture`), a batch of b rows is copied into static buffers,
  padded to the smallest captured size n >= b, run, and its outputs cut back to b rows (exactly the outputs whose
  dim 0 the trace shows is the batch, in tuples, lists, dicts and namedtuples). Outputs then alias graph
  memory and are valid until the next call (vLLM's contract): clone what you keep. Batches above the largest
  captured size run without graphs. Arguments the model writes to in place are copied back after the call;
- inference only: calls run under `torch.no_grad()`.

`CompiledModel` checks arguments and calls its `Runtime` (runtime.py), which owns everything else.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import _compat
from .backend import Backend
from .config import CompilationConfig, ConfigError
from .counters import counters
from .runtime import Runtime
from .values import cycle_rows

__all__ = ["CompiledModel", "InputError", "compile"]

log = logging.getLogger("pieceworks")


class InputError(ValueError):
    """A call's arguments do not fit what the model was compiled for."""


def _drop_all_guards(guard_entries: list[Any]) -> list[bool]:
    return [False] * len(guard_entries)


def _own_entry_point(model: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A function calling `model` whose code object belongs to this CompiledModel alone, and which tells Dynamo
    that every tensor argument has the same dim 0.

    Dynamo caches compiled code on the code object of the frame it compiles. With guards dropped, two
    CompiledModels sharing a code object (two instances of one class) would share compiled code; a code
    object of our own keeps each one's cache entry separate.
    """

    def call_model(*args: Any) -> Any:
        # One batch symbol for all inputs: tell Dynamo what the contract says (dim 0 is shared), so that pieces
        # never carry two unrelated batch symbols that only happen to be equal.
        first = None
        for a in args:
            if isinstance(a, torch.Tensor):
                if first is None:
                    first = a
                else:
                    torch._check(a.shape[0] == first.shape[0])
        return model(*args)

    code = call_model.__code__.replace(co_name=name)
    return types.FunctionType(code, call_model.__globals__, name, None, call_model.__closure__)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device})"
    return f"{value!r} ({type(value).__name__})"


class CompiledModel:
    """What `pieceworks.compile` returns. Call it like the model. Not thread-safe: one caller at a time."""

    _count = 0

    def __init__(self, model: Callable[..., Any], config: CompilationConfig | None = None) -> None:
        if not callable(model):
            raise TypeError(f"pieceworks.compile needs a callable model (an nn.Module), got {type(model).__name__}")
        self.model = model
        if config is not None and not isinstance(config, CompilationConfig):
            raise TypeError(f"pieceworks.compile needs a pieceworks.CompilationConfig, got {type(config).__name__}")
        self.backend = Backend(config, for_compile=True)
        self.config = self.backend.config  # a frozen copy: `config` itself is frozen too (see CompilationConfig)
        CompiledModel._count += 1
        entry = _own_entry_point(model, f"pieceworks_model_{CompiledModel._count}")
        self._dynamo_fn = torch.compile(
            entry, backend=self._compile_graph, fullgraph=True, dynamic=False,
            options={"guard_filter_fn": _drop_all_guards},
        )
        self._signature: list[Any] | None = None
        self._keep_args: set[int] | None = None  # while tracing on copies: ids of the copies (not saved)
        self._saved_state: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tensor, value before the tracing run)
        self.runtime: Runtime | None = None  # once the first call has traced and compiled the model
        counters.num_models_seen += 1

    # ---- argument checks ------------------------------------------------------------------------------------
    @staticmethod
    def _batch_of(args: tuple) -> int:
        sizes = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.dim() == 0:
                    raise InputError(
                        f"argument {i} is a 0-d tensor (shape ()): pieceworks treats dim 0 of every tensor argument "
                        f"as the batch dimension. Fix: pass it with a batch dimension, e.g. x.expand(batch) or x[None]"
                    )
                sizes[i] = a.shape[0]
        if not sizes:
            raise InputError("pieceworks needs at least one tensor argument with a batch dimension (dim 0)")
        if len(set(sizes.values())) > 1:
            raise InputError(
                f"tensor arguments disagree on the batch size (dim 0): {sizes}. Fix: every tensor argument must "
                f"have the same dim 0"
            )
        batch = next(iter(sizes.values()))
        if batch < 1:
            raise InputError(f"batch size {batch}: pieceworks serves batches of at least 1")
        return batch

    @staticmethod
    def _signature_of(args: tuple) -> list[Any]:
        return [CompiledModel._signature_entry(a) for a in args]

    @staticmethod
    def _signature_entry(a: Any) -> tuple:
        """What a later call must repeat: a tensor's dtype, device, rank and trailing sizes; a value's type and value
        (`2 == 2.0 == True` in Python, but the trace baked in the type too)."""
        if isinstance(a, torch.Tensor):
            return (a.dtype, a.device, a.dim(), tuple(a.shape[1:]))
        return ("value", type(a), a)

    def _check(self, args: tuple) -> int:
        batch = self._batch_of(args)
        signature = self._signature
        if len(args) != len(signature):
            raise InputError(f"compiled for {len(signature)} arguments, called with {len(args)}")
        for i, a in enumerate(args):
            want = signature[i]
            got = self._signature_entry(a)
            if got != want:
                if want[0] == "value":
                    expected = f"the value {want[2]!r} ({want[1].__name__})"
                else:
                    expected = f"dtype={want[0]}, device={want[1]}, rank {want[2]}, trailing shape {want[3]}"
                raise InputError(
                    f"argument {i} is {_describe(a)}, but the model was compiled for {expected}. "
                    f"Fix: pass arguments like the first call's, or compile another CompiledModel"
                )
        return batch

    # ---- calls ----------------------------------------------------------------------------------------------
    def _compile_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Runtime:
        """The backend Dynamo calls: `self.backend`'s runtime. While tracing on copies (a first call of batch 1), it
        saves what the tracing run is about to write in place besides the copies, for `_first_call` to put back."""
        runtime = self.backend(gm, example_inputs)
        if self._keep_args is not None:
            written = (example_inputs[i] for i in runtime.mutated_inputs)
            self._saved_state = [(t, t.clone()) for t in written
                                 if isinstance(t, torch.Tensor) and id(t) not in self._keep_args]
        return runtime

    def _first_call(self, args: tuple) -> Any:
        """Trace and compile with tensors of batch >= 2 whose dim 0 is marked dynamic; return this call's output.

        Batch >= 2 and contiguous tensors: traced with aliases of the call's own tensors (`detach()`: same memory,
        so the marks stay off the caller's tensors), and the tracing run is the call. Otherwise: traced on
        contiguous copies of 2 (or batch) rows, the model state that run wrote is restored, and the call runs."""
        batch = self._batch_of(args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        own = batch >= 2 and all(a.is_contiguous() for a in tensors)
        trace_args = []
        for a in args:
            if isinstance(a, torch.Tensor):
                a = a.detach() if own else cycle_rows(a, max(batch, 2))
                torch._dynamo.mark_dynamic(a, 0)
            trace_args.append(a)
        self._keep_args = None if own else {id(a) for a in trace_args}
        start = time.perf_counter()
        counters.num_dynamo_traces += 1
        try:
            # Data-dependent ops (`.item()`, `nonzero`) stay in the one graph (see _compat.data_dependent_tracing);
            # their pieces then run without CUDA graphs.
            with _compat.data_dependent_tracing():
                output = self._dynamo_fn(*trace_args)
        except _compat.BackendCompilerFailed as exc:  # a config error is the user's: show it as it is
            inner = getattr(exc, "inner_exception", None) or exc.__cause__
            if isinstance(inner, ConfigError):
                raise inner from None
            raise
        finally:
            self._keep_args = None
        saved, self._saved_state = self._saved_state, []
        log.info("pieceworks: traced and compiled in %.3f s (batch %d)", time.perf_counter() - start, max(batch, 2))
        if len(self.backend.runtimes) != 1:
            raise RuntimeError(f"expected one Dynamo graph, got {len(self.backend.runtimes)}")
        runtime = self.backend.runtimes[0]
        runtime.start_serving(self.model, trace_args, output, self._dynamo_fn)
        self._signature = self._signature_of(args)
        self.runtime = runtime
        if own:
            return output
        for tensor, before in saved:
            tensor.copy_(before)
        return runtime.serve(args, self._check(args))

    def __call__(self, *args: Any) -> Any:
        with torch.no_grad():
            if self.runtime is None:
                return self._first_call(args)
            return self.runtime.serve(args, self._check(args))

    def capture(self, sizes: Iterable[int] | None = None) -> dict[str, Any]:
        """The capture phase: every `cudagraph_capture_sizes` entry (or those in `sizes`), largest first, into one
        pool; then closed.

        Call after the first call (which traces and compiles). Without CUDA, or with mode NONE, it logs that it
        captures nothing and returns. Returns the phase's numbers: sizes, seconds, MiB, graphs.
        """
        if self.runtime is None:
            raise RuntimeError("call the model once before capture(): the first call traces and compiles it")
        with torch.no_grad():
            return self.runtime.capture(sizes)


def compile(model: Callable[..., Any], config: CompilationConfig | None = None) -> CompiledModel:  # noqa: A001
    """Compile `model` piecewise with `config` (default `CompilationConfig()`); see `CompiledModel`."""
    return CompiledModel(model, config)
