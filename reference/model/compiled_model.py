"""`pieceworks.compile(model, config)`: trace once, compile everything, serve every batch size without
compiling.

Contracts of the returned `CompiledModel`:
- it is called as the model is, with positional and keyword arguments: the first call's form is the compiled
  one, and every call is put in its order (binding.Arguments: a call of the same form costs one list, another
  form is bound by `forward`'s signature once per form; a parameter the first call left out must keep its
  default);
- dim 0 of every tensor argument is the batch dimension, the only dynamic one; all tensor arguments share it;
- the first call traces the model with Dynamo once (with a batch of at least 2, so that Dynamo's 0/1
  specialisation cannot bake in the size) and compiles every piece for every compile range and size before it
  returns; no later call traces or compiles, batch 1 included. The model runs once per call, the first
  included: a first call of batch >= 2 (contiguous tensors) is traced with its own arguments and returns the
  tracing run's result; a first call of batch 1 is traced on a 2-row copy, and whatever that run wrote in
  place besides the copy (the graph's mutated inputs: buffers, a KV cache, parameters) is put back before the
  call runs. That costs one temporary copy of exactly the state the graph writes in place, at that one call;
- after the first call no call enters Dynamo: the compiled graph is called directly, its inputs bound once and
  its output rebuilt in the model's containers (tuples, dicts, dataclasses, a `ModelOutput`; see binding.py;
  where the binding cannot be proven, one WARNING says why and the fix, and calls go through Dynamo with its
  guards dropped). Python side effects of `forward` happen in the first call only;
- Dynamo's guards are dropped (`guard_filter_fn`), so pieceworks checks arguments itself on every call: the
  same count, dtypes, devices, ranks and non-batch sizes as the first call, and non-tensor arguments of the
  same type and value (which the trace baked in: `2.0` where the trace saw `2`, or `1` for `True`, raises). A
  mismatch raises `InputError` naming the argument (its position or keyword). Any memory layout is served:
  pieces are compiled for contiguous tensors, so a non-contiguous argument (transposed, sliced) is copied into
  the static buffers or, without graphs, into a contiguous copy (written back where the model writes it in
  place);
- with CUDA graphs (`capture()` called, or `lazy_capture`) for the call's kind of batch
  (`pieceworks.uniform_decode()` marks uniform decode calls; the mode says which kinds have graphs), a batch
  of b rows is copied into static buffers, padded to the smallest captured size n >= b, run, and its outputs
  cut back to b rows (exactly the outputs whose dim 0 the trace shows is the batch, in tuples, lists, dicts
  and namedtuples). Outputs then alias graph memory and are valid until the next call (vLLM's contract): clone
  what you keep. Batches above the largest captured size run without graphs. Arguments the model writes to in
  place are copied back after the call;
- parameters and buffers are read where they live: in-place updates (`load_state_dict(state)`, `copy_`) are
  served; replacing or reallocating one after the first call raises `StateReplacedError` naming it and the fix
  at the next call. Any other change to the model's state the trace read (an attribute set or deleted, a
  forward hook registered or removed) makes the next call trace and compile the model again, logged once at
  WARNING, never serve the old trace; a global module forward hook raises `GlobalHookError` (watch.py says
  what is watched and how: nothing is checked per call but one flag and one count);
- inference only: calls run under `torch.no_grad()`; a call with grad on and an argument that requires grad
  raises `InputError` (its output could carry no gradient).

State and the data's path. `CompiledModel` owns the serving state of `pieceworks.compile`, built once, in one
place (`_serve_with`), right after the tracing call or from the serving record: the `Runtime` (capture and
replay), the `Binder` (binding.py: call arguments to the stitching module's inputs), the static input buffers
(`StaticInputs`) and which outputs to cut back. A call: `__call__` puts keyword arguments, or a call of
another form than the first, in the first call's order (arguments.py), checks them (`check_arguments`), reads
the batch kind once (`is_uniform_decode()`), asks `route`'s rule for the padded size, copies the arguments
into the static buffers (`StaticInputs.load`), binds them to the stitching module's flat inputs (memoised per
size), and calls `Runtime.run(flat, padded_size, uniform, static=True)`, which replays the `ReplayPlan` or
`FullReplay` of that size; then in-place writes are copied back and the outputs cut to the batch (`unpad`).
`capture()` runs a capture phase the same way: the runtime hands it the plan of sizes and kinds, and each is
one such run on the static buffers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import torch

from .. import core
from ..core import CUDAGraphMode, Phase, is_uniform_decode, log, padded_size, unpad  # bound once: per call
from . import _compat, arguments, record
from .arguments import Arguments, batch_of, check_arguments, contiguous, refuse_grad, signature
from .binding import Binder, bind
from .watch import StateReplacedError, StateWatch, refuse_global_hooks

Replay = core.FullReplay | core.ReplayPlan  # what replays one padded size and batch kind (`route`)


def _calling_weakly(method: Callable[..., Any]) -> Callable[..., Any]:
    """The bound `method`, called through a weak reference to its object. Dynamo keeps backends in a
    process-wide table until `torch._dynamo.reset()`, and may keep a compiled function in the traced
    function's module after that (it does for graphs holding collectives); neither may keep the
    CompiledModel, its pieces and its CUDA graphs alive once the caller drops it."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        if (bound := ref()) is None:
            raise ReferenceError("pieceworks: this CompiledModel was freed. Fix: keep a reference to it")
        return bound(*args, **kwargs)

    call.__name__ = call.__qualname__ = method.__name__  # what Dynamo's messages call the backend
    return call


def _own_entry_point(model: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A function calling `model` whose code object belongs to this CompiledModel alone, and which tells
    Dynamo that every tensor argument has the same dim 0.

    Dynamo caches compiled code on the code object of the frame it compiles. With guards dropped, two
    CompiledModels sharing a code object (two instances of one class) would share compiled code; a code
    object of our own keeps each one's cache entry separate.
    """

    def call_model(*args: Any, **kwargs: Any) -> Any:
        # One batch symbol for all inputs: tell Dynamo what the contract says (dim 0 is shared), so that
        # pieces never carry two unrelated batch symbols that only happen to be equal.
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for a in tensors[1:]:
            torch._check(a.shape[0] == tensors[0].shape[0])
        return model(*args, **kwargs)

    call_model.__code__, call_model.__name__ = call_model.__code__.replace(co_name=name), name
    return call_model


@dataclasses.dataclass
class Trace:
    """What a tracing call leaves for `CompiledModel._start_serving`, filled by Dynamo's callbacks as they
    come: the guard filter's `guards`; the backend's `split` (`core.split_pieces`), the traced `code`
    objects, its `example_inputs` and, tracing on copies, `saved` (what the run will write in place besides
    them, to put back); the tracing run's `graph_output`. `copies`: ids of the copies traced on; None where
    the call's own tensors were traced."""

    copies: set[int] | None = None
    guards: list[Any] | None = None
    split: Any = None  # a core.CompiledPieces
    code: list[Any] | None = None
    example_inputs: list[Any] = dataclasses.field(default_factory=list)
    batch_guards: list[Any] = dataclasses.field(default_factory=list)
    saved: list[tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=list)
    graph_output: Any = None


class CompiledModel:
    """What `pieceworks.compile` returns. Call it like the model. Not thread-safe: one caller at a time, but
    for first calls (one traces and compiles; the others wait for it, then are served).

    Public view for tools (read it; only this object writes it): `runtime` (the `Runtime`, None before the
    first call; `runtime.compiled` is the `CompiledPieces` with its pieces and build seconds), `binder` (the
    `Binder`: how calls reach the stitching module without Dynamo, call arguments to its inputs and its
    outputs to the model's output; None where that could not be proven and calls go through Dynamo),
    `static_inputs` (the `StaticInputs` calls are copied into; None without CUDA graphs), `batched_outputs`
    (which output leaves are cut back to the batch: `batched_outputs`), `graph_inputs(padded_size)` (what a
    replay of that size reads) and `route(batch, uniform)` (how a call is served).
    """

    _entry_points = 0  # made in this process: each has a name of its own

    def __init__(self, model: Callable[..., Any], config: core.CompilationConfig | None = None) -> None:
        got = "a model it already compiled (call it as it is)" if callable(model) else type(model).__name__
        if not callable(model) or isinstance(model, CompiledModel):
            raise TypeError(f"pieceworks.compile needs a callable (an nn.Module), got {got}")
        # a frozen copy of `config` (itself frozen too, see CompilationConfig); TypeError for another type
        self.model, self.config = model, core.own_config(config)
        self._dynamo_fn = self._entry()
        self._compiled: core.CompiledPieces | None = None  # set by the backend call, once
        self._traced = Trace()  # the tracing call's facts, until `_start_serving` reads them
        self.runtime: core.Runtime | None = None
        self.binder: Binder | None = None
        self.static_inputs: core.StaticInputs | None = None
        self.batched_outputs: Any = False
        self._signatures: list[tuple] = []
        self._arguments: Arguments | None = None  # the first call's form: positional, then keyword arguments
        self._positional = -1  # the positional arguments of a first call without keywords (else -1)
        self._mutated_args: list[int] = []
        self._flat_by_size: dict[int, list[Any]] = {}
        self._state_watch: StateWatch | None = None
        self._batch_rule: arguments.BatchRule | None = None  # where forward branched on the batch size
        self._uniform = False  # the kind of the call under way, for calls through Dynamo
        self._first_call_lock = threading.Lock()  # one thread traces; the others wait, then are served
        core.counters.num_models_seen += 1

    def _entry(self) -> Callable[..., Any]:
        """A Dynamo entry point of this model's own that traces it once (its first call, or the first after
        a change to the model's state) with guards dropped; the guards' entries go to `_traced` (the
        serving record checks what they read outside the model)."""
        CompiledModel._entry_points += 1
        entry = _own_entry_point(self.model, f"pieceworks_model_{CompiledModel._entry_points}")
        backend = _calling_weakly(self._backend)
        options: dict[str, Any] = {"guard_filter_fn": _calling_weakly(self._drop_guards)}
        return torch.compile(entry, backend=backend, fullgraph=True, dynamic=False, options=options)

    def _drop_guards(self, entries: Sequence[Any]) -> list[bool]:
        self._traced.guards = list(entries)
        return [False] * len(entries)

    def graph_inputs(self, size: int) -> list[Any]:
        """The stitching module's flat inputs for a replay at padded size `size`: the static buffers' views
        and the bound parameters, the same objects on every call. Raises where calls have no static buffers or
        go through Dynamo."""
        if self.static_inputs is None or self.binder is None:
            raise RuntimeError("no graph inputs: no static buffers, or calls go through Dynamo")
        if size not in self._flat_by_size:
            self._flat_by_size[size] = self.binder.inputs(self.static_inputs.views(size), size)
        return self._flat_by_size[size]

    # ---- the first call -----------------------------------------------------------------------------------
    def _first_call(self, args: Sequence[Any], uniform: bool) -> Any:
        """Serve from the model's serving record where the cache holds one (record.py: no trace); else
        trace and compile with tensors of batch >= 2 whose dim 0 is marked dynamic, and store the record;
        return this call's output.

        Batch >= 2 and contiguous tensors: traced with aliases of the call's own tensors (`detach()`: same
        memory, so the marks stay off the caller's tensors), and the tracing run is the call. Otherwise:
        traced on contiguous copies of 2 (or batch) rows, the model state that run wrote is restored, and
        the call runs."""
        refuse_global_hooks()
        batch, self._signatures = batch_of(args, self._arguments.labels), [signature(a) for a in args]
        keywords = [("keywords", self._arguments.names)] if self._arguments.names else []
        reuse = self.config.reuse_trace and self.config.cache_active()
        facts = record.model_facts(self.model, self._signatures + keywords, self.config) if reuse else None
        if facts is not None and self._start_from_record(args, facts):
            return self._serve(args, batch, uniform)
        own = batch >= 2 and all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor))
        trace_args = list(args)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                trace_args[i] = a.detach() if own else core.cycle_rows(a, max(batch, 2))
                torch._dynamo.mark_dynamic(trace_args[i], 0)
        self._traced = Trace(copies=None if own else {id(a) for a in trace_args})
        start = time.perf_counter()
        core.counters.num_dynamo_traces += 1
        try:
            # Data-dependent ops (`.item()`, `nonzero`) stay in the one graph (see
            # _compat.data_dependent_tracing); their pieces then run without CUDA graphs.
            with _compat.data_dependent_tracing():
                output = self._arguments.call(self._dynamo_fn, trace_args)
        # Dynamo wraps an error of the backend; a config error is the user's: show it as it is
        except Exception as exc:
            if isinstance(inner := getattr(exc, "inner_exception", None) or exc.__cause__, core.ConfigError):
                raise inner from None
            raise
        seconds, rows = time.perf_counter() - start, max(batch, 2)
        log.info("pieceworks: traced and compiled in %.3f s (batch %d)", seconds, rows)
        if self._compiled is None:
            raise RuntimeError("pieceworks: Dynamo compiled no graph for this model")
        for tensor, before in self._traced.saved:  # a run on copies: put back what else it wrote
            tensor.copy_(before)
        self._start_serving(trace_args, output, facts)
        return output if own else self._serve(args, batch, uniform)

    def _start_from_record(self, args: Sequence[Any], facts: dict[str, Any]) -> bool:
        """Serve from the serving record of `facts` (record.py: `model_facts`): rebuild the compiled graph
        from the record's split and the cache (pieces load; one the cache lost is compiled from the record's
        piece, as the traced path would) and the serving state from the record. False (a WARNING where a
        record was found but could not be used) when the call must trace."""
        if (found := record.load(self.config, record.key_of(facts), facts)) is None:
            return False
        # globals(): the entry point's module globals
        if (changed := record.changed_read(found.reads, self.model, globals())) is not None:
            log.info("pieceworks: %s: tracing the model instead of serving its serving record", changed)
            return False
        try:
            split, tracing = _compat.unpickle_graph(found.graph)
            with tracing:
                self._compiled = core.compile_pieces(split, self.config)
            self._serve_with(args, Binder.restore(found.binding, self.model), found)
        # a graph this torch cannot unpickle or compile, a state name the model lacks: nothing of it is kept,
        # and the call traces, as without a record
        except Exception as exc:  # noqa: BLE001
            self._forget()
            unused = "pieceworks: this model's serving record could not be used (%s: %s); tracing the model"
            log.warning(unused, type(exc).__name__, exc)
            return False
        served = "pieceworks: served from this model's serving record without tracing (%.3f s in the backend)"
        log.info(served, self._compiled.build_seconds["backend"])
        core.counters.num_traces_reused += 1
        return True

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        """The backend Dynamo calls, once. While tracing on copies (a first call of batch 1), it saves what
        the tracing run is about to write in place besides the copies, for `_first_call` to put back."""
        if self._compiled is not None:
            raise RuntimeError(
                "pieceworks: Dynamo asked to compile this model again after its first call (was "
                "torch._dynamo.reset() called?). Fix: create a new CompiledModel with pieceworks.compile"
            )
        # Dynamo's facts, read before compiling: a hit in Inductor's cache adds its artifact's guards
        code, guards = _compat.trace_facts()
        trace, split = self._traced, core.split_pieces(gm, self.config)
        self._compiled = core.compile_pieces(split, self.config)
        trace.split, trace.code, trace.example_inputs = split, code, list(example_inputs)
        trace.batch_guards = arguments.batch_guards(guards, self._compiled.batch_symbols)
        if trace.copies is not None:
            written = [example_inputs[i] for i in self._compiled.mutated_inputs]
            trace.saved = [(t, t.clone()) for t in written if id(t) not in trace.copies]
        return _calling_weakly(self._stitched_call)

    def _stitched_call(self, *flat: Any) -> Any:
        """What Dynamo's compiled code calls: the tracing run (its output recorded for the binding), then the
        runtime with the caller's arguments (the fallback, where the binding is not proven), of the kind
        `__call__` read."""
        if self.runtime is not None:
            batch = self._compiled.batch
            return self.runtime.run(flat, None if batch is None else batch.read(flat), self._uniform, False)
        self._traced.graph_output = cast(core.CompiledPieces, self._compiled).stitching_module(*flat)
        return self._traced.graph_output

    def _start_serving(self, trace_args: list[Any], output: Any, facts: dict[str, Any] | None) -> None:
        """Build the serving state from the tracing call: the binding of call arguments to graph inputs (or
        the Dynamo fallback, logged once with why), the outputs to cut back, the written arguments; then
        store the serving record of `facts` (`record.model_facts`), if any."""
        trace, self._traced = self._traced, Trace()
        graph, examples = cast(core.CompiledPieces, self._compiled), trace.example_inputs
        ids = {id(a): k for k, a in enumerate(trace_args) if isinstance(a, torch.Tensor)}
        mutated = [ids[id(examples[i])] for i in graph.mutated_inputs if id(examples[i]) in ids]
        found = bind(self.model, graph, examples, trace_args, output, trace.graph_output)
        if isinstance(found, str):
            alone = "its output rebuilt by Dynamo's code, not the compiled graph alone"
            log.warning("pieceworks: every call of this model goes through Dynamo, %s: %s", alone, found)
        binder = None if isinstance(found, str) else found
        # The output leaves cut back to the batch: graph outputs whose trace value's dim 0 is the batch
        # symbol, and tensor arguments returned as they are; nothing else (a weight of n rows is not cut at
        # padded size n). Leaves are told apart by identity, here, while the tracing call's tensors and
        # outputs are alive.
        flat = trace.graph_output if isinstance(trace.graph_output, (tuple, list)) else ()
        dims = [str(v.shape[0]) if torch.is_tensor(v) and v.ndim else None for v in graph.output_values]
        cut = {id(t) for t, dim in zip(flat, dims) if dim in graph.batch_symbols}
        cut |= set(ids) - {id(t) for t in flat}
        sources = [] if trace.guards is None else record.outside_sources(trace.guards, globals())
        batched = core.batched_outputs(output, lambda t: id(t) in cut)
        served = record.Record(b"", (), batched, mutated, {}, sources, trace.batch_guards)
        self._serve_with(trace_args, binder, served)
        # `trace.code`: None where this torch does not list the traced code
        if facts is None or binder is None or graph.cache_dir is None or trace.code is None:
            return
        try:
            # the record's split: what a warm start compiles, without splitting (no split seconds)
            graph_file = _compat.pickle_graph(dataclasses.replace(trace.split, build_seconds={}))
            binding, files = binder.describe(self.model), record.file_digests(trace.code)
            reads = record.outside_reads(trace.guards, self.model, globals())  # the entry point's globals
            stored = served._replace(graph=graph_file, binding=binding, files=files, reads=reads)
            record.save(self.config, record.key_of(facts), stored, facts)
        # no record: the next process traces, as it would without one
        except Exception as exc:  # noqa: BLE001
            log.info("pieceworks: no serving record for this model (%s: %s)", type(exc).__name__, exc)

    def _serve_with(self, args: Sequence, binder: Binder | None, served: record.Record) -> None:
        """The serving state over `self._compiled`, in one place, from the tracing call or the serving
        record (`served`: the tracing call's facts, or the record's): binding, outputs to cut, written
        arguments, the batch sizes the trace holds for (`BatchRule`), runtime, state watch (of the module
        globals the trace read) and, where graphs will be captured, static buffers shaped like `args`."""
        self.binder, self._mutated_args = binder, served.mutated_args
        self.batched_outputs = served.batched_outputs
        self._batch_rule = arguments.BatchRule(served.batch_guards) if served.batch_guards else None
        self.runtime = core.Runtime(cast(core.CompiledPieces, self._compiled), self.config)
        # the model, or the module of a bound method (`pieceworks.compile(model.forward)`)
        module = getattr(self.model, "__self__", self.model)
        if isinstance(module, torch.nn.Module):  # globals(): the entry point's module globals
            read = record.watched_reads([r[0] for r in served.reads], self.model, globals())
            self._state_watch = StateWatch(module, self, read)
        if self.runtime.mode is not CUDAGraphMode.NONE and self.config.cudagraph_capture_sizes:
            self.static_inputs = core.StaticInputs(args, max(self.config.cudagraph_capture_sizes))

    def _forget(self) -> None:
        """Drop the serving state (runtime with its graphs and pool, binding, static buffers, state watch)."""
        if self._state_watch is not None:
            self._state_watch.close()
        self._compiled = self.runtime = self.binder = self.static_inputs = self._state_watch = None
        self._batch_rule, self._flat_by_size = None, {}

    def _state_changed(self, watch: StateWatch) -> None:
        """What the state `watch` saw (watch.py): a replaced parameter raises, a global hook raises, another
        change drops the serving state so that the call traces the model as it is now, through a new entry
        point (the old one's code ignores its guards)."""
        if watch.replaced:
            raise StateReplacedError(watch.replaced)
        refuse_global_hooks()
        watch.handles = _compat.HookHandle.next_id
        if watch.changed:
            message = "pieceworks: %s after the first call: tracing and compiling the model again%s"
            dropped = " (its CUDA graphs are dropped: call capture() again)"
            log.warning(message, watch.changed, dropped if self.runtime.captured_sizes else "")
            self._forget()
            self._dynamo_fn = self._entry()

    # ---- calls --------------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Dynamo traces this call (a caller's torch.compile): run it outside that trace
        if torch.compiler.is_dynamo_compiling():
            return torch.compiler.disable(CompiledModel.__call__)(self, *args, **kwargs)
        # keywords, or not the form of a positional first call (or the first): put in the first call's order
        # (`arguments.Arguments`: positional, then keyword arguments; another form bound by `forward`'s
        # signature), a list where a tuple came in
        if kwargs or len(args) != self._positional:
            if self._arguments is None:  # the first call sets the order
                self._arguments = Arguments(self.model, args, kwargs)
                self._positional = -1 if kwargs else len(args)
            args = self._arguments.flat(args, kwargs)  # type: ignore[assignment]
        if torch.is_grad_enabled():
            refuse_grad(args, self._arguments.labels)
        with torch.no_grad():
            if (watch := self._state_watch) is not None and watch.stale():
                self._state_changed(watch)
            uniform = is_uniform_decode()  # the batch kind, read once, here
            if self.runtime is None:
                with self._first_call_lock:
                    if self.runtime is None:
                        return self._first_call(args, uniform)
            return self._serve(args, check_arguments(args, self._signatures, self._arguments.labels), uniform)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("pieceworks: a CompiledModel cannot be pickled. Fix: compile a copy of the model")

    def padded_size(self, batch: int, uniform: bool = False) -> int | None:
        """The captured size a call of `batch` rows of this kind (uniform decode or mixed) runs at, on the
        static buffers; None where it runs unpadded on its own tensors: no static buffers, no capture phase
        yet, no CUDA graphs for its kind, or a batch above the largest capture size."""
        if self.static_inputs is None or self.runtime.phase is Phase.WAITING:
            return None
        graphed = self.runtime.mode_for(uniform) is not CUDAGraphMode.NONE
        return padded_size(self.config.cudagraph_capture_sizes or (), batch) if graphed else None

    def route(self, batch: int, uniform: bool = False) -> tuple[int | None, Replay | None]:
        """How a call of `batch` rows of this kind is served: `(padded_size, replay)`, the captured size it
        runs at (`padded_size`) and the FULL replay or PIECEWISE plan it replays there (None: the stitching
        module runs without CUDA graphs, or this call captures it). The one rule `__call__` follows."""
        padded = self.padded_size(batch, uniform)
        return padded, None if padded is None else self.runtime.replay_for(padded, uniform)

    def _serve(self, args: Sequence[Any], batch: int, uniform: bool) -> Any:
        """One call with checked `args` of batch `batch` and kind `uniform`; see the module doc."""
        padded = self.padded_size(batch, uniform)
        if self._batch_rule is not None:
            self._batch_rule.check(batch, padded)
        if padded is not None:
            self.static_inputs.load(args, batch)
            out = self._run(padded, uniform)
            self.static_inputs.copy_back(args, batch, self._mutated_args)
            return unpad(out, batch, padded, self.batched_outputs)
        out = self._run(batch, uniform, dense := contiguous(args))
        for i in [i for i in self._mutated_args if dense[i] is not args[i]]:  # written to a contiguous copy
            args[i].copy_(dense[i])
        return out

    def _run(self, size: int, uniform: bool, args: Sequence[Any] | None = None) -> Any:
        """The model on `args` of batch `size` (contiguous; run without CUDA graphs) or, without `args`, on
        the static buffers at padded size `size` (replayed, captured or run without CUDA graphs). Through
        Dynamo where no binding was proven."""
        # forward runs again: the attributes it writes are its own, not the user's changes
        if self.binder is None:
            self._uniform = uniform
            args = self.static_inputs.views(size) if args is None else args
            with self._state_watch or contextlib.nullcontext():  # `with watch:` pauses it
                return self._arguments.call(self._dynamo_fn, args)
        flat = self.graph_inputs(size) if args is None else self.binder.inputs(args, size)
        return self.binder.outputs(self.runtime.run(flat, size, uniform, static=args is None))

    def estimate_capture(self, sizes: Iterable[int] | None = None, samples: int = 6) -> dict[str, Any]:
        """The CUDA graph pool bytes `capture(sizes)` will take, measured before it on a sample of the sizes
        whose CUDA graphs are then freed (`Runtime.estimate_phase` says how): what an engine subtracts before
        sizing its KV cache. Call after the first call and before `capture()`. Without CUDA or CUDA graphs
        the estimate is 0."""
        return self._phase("estimate_capture", sizes, samples)

    def capture(self, sizes: Iterable[int] | None = None) -> dict[str, Any]:
        """The capture phase: every `cudagraph_capture_sizes` entry (or those in `sizes`), largest first, into
        one pool; then closed.

        Call after the first call (which traces and compiles). Without CUDA, or with mode NONE, it logs that
        it captures nothing and returns. Returns the phase's numbers: sizes, seconds, MiB, CUDA graphs.
        """
        return self._phase("capture", sizes)

    def _phase(self, name: str, sizes: Iterable[int] | None, samples: int | None = None) -> dict[str, Any]:
        """The capture phase of method `name` (`capture`: `Runtime.capture_phase`; `estimate_capture`, of
        `samples` sizes: `Runtime.estimate_phase`), after the first call: its plan run on the static buffers,
        one padded size and kind at a time (no sizes without static buffers)."""
        if (runtime := self.runtime) is None:
            raise RuntimeError(f"pieceworks: call the model once before {name}(): the first call compiles it")
        sizes = [] if self.static_inputs is None else sizes
        context = runtime.capture_phase(sizes) if samples is None else runtime.estimate_phase(sizes, samples)
        with torch.no_grad(), context as phase:
            for size, uniform in core.progress(phase.plan, "capture sizes"):
                self._run(size, uniform)
        return phase.report


def compile(model: Callable, config: core.CompilationConfig | None = None) -> CompiledModel:  # noqa: A001
    """Compile `model` piecewise with `config` (default `CompilationConfig()`); see `CompiledModel`."""
    return CompiledModel(model, config)
