"""Mutants of a compiled model's calls: dispatch and padding, argument checks, direct calls and their
bindings, the first call, replay plans, and cutting outputs back to the batch."""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import types
import weakref

import pytest
import torch

import pieceworks.model.arguments as arguments
import pieceworks.model.binding as binding
import pieceworks.model.compiled_model as api
import pieceworks.model.watch as watch
import pieceworks.padding as padding
import pieceworks.plan as plan
import pieceworks.values as values

from . import mutant

_PROPS = "suites/test_properties.py::"
_PROPS_GPU = "suites/test_properties_gpu.py::"
_RUNTIME = "suites/test_runtime.py::"
_FAULTS = "suites/test_user_faults.py::"
_STATE = "suites/test_model_state.py::"


@mutant(
    "the state watch reads no class's forward: Layer.forward replaced after the first call is served the old "
    "trace",
    cpu=_STATE + "test_a_model_class_whose_forward_is_replaced_after_the_first_call_is_served_by_a_new_trace",
)
def class_forward_unwatched(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(watch.StateWatch, "now", lambda self: watch.global_modes())


@mutant(
    "the trace's guards on the batch size are dropped: a batch on another branch is served the trace's",
    cpu=_FAULTS + "test_a_batch_on_another_branch_than_the_trace_is_refused_naming_the_branch",
)
def batch_branches_unchecked(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(arguments, "batch_guards", lambda guards, symbols: [])


@mutant(
    "compiling a compiled model compiles it again, inside Dynamo, instead of saying it is compiled",
    cpu=_FAULTS + "test_compiling_a_compiled_model_is_refused_saying_it_is_compiled",
)
def compiled_model_compiled_again(mp: pytest.MonkeyPatch) -> None:
    original = api.CompiledModel.__init__

    def init(self, model, config=None) -> None:
        # the check sees a callable that is no CompiledModel: the compiled model's own __call__
        original(self, model.__call__ if isinstance(model, api.CompiledModel) else model, config)

    mp.setattr(api.CompiledModel, "__init__", init)


@mutant(
    "route ignores the call's batch kind: the breakdown of a mixed call under FULL_DECODE_ONLY times the "
    "uniform decode call's FULL replay instead of the unpadded call that ran",
    gpu="suites/test_host_overhead.py::test_the_breakdown_records_each_call_as_full_decode_only_runs_it",
)
def route_ignores_the_batch_kind(mp: pytest.MonkeyPatch) -> None:
    original = api.CompiledModel.route
    mp.setattr(api.CompiledModel, "route", lambda self, batch, uniform=False: original(self, batch, True))


@mutant(
    "a submodule added to a watched module (ModuleList.append) is not seen: the old trace serves",
    cpu=_STATE + "test_a_change_after_the_first_call_is_served_by_a_new_trace_logged_once",
)
def added_submodule_unseen(mp: pytest.MonkeyPatch) -> None:
    original = watch.StateWatch.note

    def note(self, module, what, attribute=None) -> None:
        if what != "added":
            original(self, module, what, attribute)

    mp.setattr(watch.StateWatch, "note", note)


@mutant(
    "first calls from several threads are not serialised: each traces, over the others' trace",
    cpu=_FAULTS + "test_first_calls_from_several_threads_trace_once_and_each_gets_its_answer",
)
def first_calls_not_serialised(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(api, "threading", types.SimpleNamespace(Lock=contextlib.nullcontext))


@mutant(
    "the state watch reads no global modes: "
    "a call under autocast or another default dtype is served the first call's trace",
    cpu=_STATE + "test_global_modes_changed_after_the_first_call_are_traced_for_never_served_stale",
)
def global_modes_unwatched(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(watch, "global_modes", lambda: ())


@mutant(
    "padding picks the captured size below the batch (properties 5, 6)",
    cpu=_PROPS + "test_padding_picks_the_smallest_captured_size_at_least_the_batch",
    gpu=_PROPS_GPU + "test_replay_matches_eager_for_any_batch_sequence",
)
def pad_to_the_size_below(mp: pytest.MonkeyPatch) -> None:
    def padded(sizes, batch):
        i = bisect.bisect_right(sizes, batch)
        return sizes[i - 1] if i > 0 and sizes[i - 1] >= batch else (sizes[i] if i < len(sizes) else None)

    def wrong(sizes, batch):  # one size too far: correct only when the batch is exactly a captured size
        i = bisect.bisect_left(sizes, batch)
        return (
            sizes[i]
            if i < len(sizes) and sizes[i] == batch
            else (sizes[i - 1] if i > 0 else padded(sizes, batch))
        )

    for module in (padding, api):  # where it is defined and where CompiledModel calls it
        mp.setattr(module, "padded_size", wrong)


@mutant(
    "the last real row is not copied into the static buffer (property 6)",
    cpu="suites/test_dispatch.py::test_static_inputs_hold_each_call_in_place_and_keep_earlier_rows_as_padding",
    gpu=_PROPS_GPU + "test_toy_llama_replay_matches_eager_for_any_batch_sequence",
)
def static_copy_misses_last_row(mp: pytest.MonkeyPatch) -> None:
    original = padding.StaticInputs.load

    def load(self, args, batch):
        if batch > 1:  # the real rows but the last
            original(self, [a[: batch - 1] if hasattr(a, "shape") else a for a in args], batch - 1)

    mp.setattr(padding.StaticInputs, "load", load)


@mutant(
    "call-time argument checks ignore dtypes (property 10)",
    cpu=_PROPS + "test_any_argument_mismatch_is_an_input_error_naming_the_argument",
)
def arg_check_skips_dtype(mp: pytest.MonkeyPatch) -> None:
    original = arguments.signature
    # a tensor's dtype is never compared: any dtype passes as the first call's
    for module in (arguments, api):
        mp.setattr(
            module,
            "signature",
            lambda a: (None, *original(a)[1:]) if isinstance(a, torch.Tensor) else original(a),
        )


@mutant(
    "argument checks compare plain values with == only: 2 passes for 2.0",
    cpu=_PROPS + "test_a_plain_value_of_another_type_is_an_input_error",
)
def value_check_ignores_type(mp: pytest.MonkeyPatch) -> None:
    original = arguments.signature
    for module in (arguments, api):
        mp.setattr(
            module, "signature", lambda a: ("value", object, a) if original(a)[0] == "value" else original(a)
        )


@mutant(
    "non-contiguous arguments reach pieces compiled for contiguous ones",
    cpu=_FAULTS + "test_any_input_layout_is_served_right",
)
def layout_passed_through(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(api, "contiguous", list)


def _rebinding(mp: pytest.MonkeyPatch, change) -> None:
    """Direct calls' bindings with each source `(kind, value)` replaced by
    `change(kind, value, call_args)`."""
    original = binding.bind

    def bind(model, graph, examples, call_args, *rest):
        found = original(model, graph, examples, call_args, *rest)
        if isinstance(found, binding.Binder):
            found.sources = [change(kind, value, call_args) for kind, value in found.sources]
        return found

    mp.setattr(api, "bind", bind)


@mutant(
    "direct calls bind copies of the parameters",
    cpu=_RUNTIME + "test_parameter_data_swaps_are_seen_by_direct_calls",
)
def parameters_bound_by_value(mp: pytest.MonkeyPatch) -> None:
    _rebinding(mp, lambda kind, value, args: (kind, value.detach().clone()) if kind == 2 else (kind, value))


@mutant(
    "direct calls pass the tracing call's batch size for SymInt inputs",
    cpu=_RUNTIME + "test_symbolic_batch_inputs_get_each_calls_batch_size",
)
def batch_size_from_the_trace(mp: pytest.MonkeyPatch) -> None:
    def change(kind, value, args):
        return (2, next(a.shape[0] for a in args if hasattr(a, "shape"))) if kind == 1 else (kind, value)

    _rebinding(mp, change)


@mutant(
    "every call goes through Dynamo",
    cpu="suites/test_compile.py::test_after_the_first_call_no_call_enters_dynamo",
)
def always_through_dynamo(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(api, "bind", lambda *args: "mutant: never bound")


@mutant(
    "direct calls return the graph's flat outputs",
    cpu=_RUNTIME + "test_direct_calls_return_the_models_output_structure",
)
def outputs_flat(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(binding.Binder, "outputs", lambda self, flat: flat)


@mutant(
    "the first call runs the model twice: the tracing run, then the call",
    cpu=_PROPS + "test_first_call_writes_model_state_once",
)
def first_call_runs_twice(mp: pytest.MonkeyPatch) -> None:
    original = api.CompiledModel.__call__

    def call(self, *args):
        if self.runtime is None:
            original(self, *args)  # the tracing run, then the call again
        return original(self, *args)

    mp.setattr(api.CompiledModel, "__call__", call)


@mutant(
    "what the batch-1 tracing run on copies wrote into model state stays",
    cpu=_PROPS + "test_first_call_writes_model_state_once[1]",  # batch 1 traces on copies
)
def trace_writes_not_restored(mp: pytest.MonkeyPatch) -> None:
    original = api.core.compile_pieces
    # the graph's in-place writes are not known, so nothing is saved before a tracing run on copies,
    # nor put back

    def without_writes(gm, config):
        return dataclasses.replace(original(gm, config), mutated_inputs=())

    mp.setattr(api.core, "compile_pieces", without_writes)


@mutant(
    "a FULL capture puts back every input the graph writes, the splitting op's KV cache too (a copy of every "
    "layer's cache per captured size)",
    cpu="suites/test_modes_cpu.py::test_full_captures_put_back_what_compiled_pieces_write_not_what_splitting_"
    "ops_write",
    gpu="suites/test_writes_gpu.py::test_a_full_capture_copies_no_kv_cache",
)
def full_capture_restores_every_write(mp: pytest.MonkeyPatch) -> None:
    original = api.core.compile_pieces

    def compile_pieces(gm, config):
        graph = original(gm, config)
        return dataclasses.replace(graph, restored_inputs=graph.mutated_inputs)

    mp.setattr(api.core, "compile_pieces", compile_pieces)


@mutant(
    "a replaced parameter goes unnoticed: the graphs keep the old tensor",
    cpu=_FAULTS + "test_a_replaced_parameter_or_buffer_is_refused_naming_it_and_the_fix",
    gpu=_FAULTS + "test_a_replaced_parameter_or_buffer_is_refused_naming_it_and_the_fix",
)
def replaced_state_served(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(watch.StateWatch, "check", lambda self, module, attributes, how: None)


@mutant(
    "each compiled model registers global hooks of its own and removes them when it is collected",
    cpu=_FAULTS + "test_compiled_models_coming_and_going_leave_torchs_global_hooks_alone",
)
def global_hooks_per_model(mp: pytest.MonkeyPatch) -> None:
    original = watch.StateWatch.__init__

    def init(self, model, owner, reads=()) -> None:
        original(self, model, owner, reads)
        handle = torch.nn.modules.module.register_module_module_registration_hook(lambda *args: None)
        weakref.finalize(owner, handle.remove)

    mp.setattr(watch.StateWatch, "__init__", init)


@mutant(
    "Dynamo traces the watches' registration hook: a forward that assigns a buffer guards on the live "
    "watches",
    cpu=_FAULTS + "test_a_forward_that_assigns_a_buffer_compiles_while_compiled_models_come_and_go",
)
def registration_hook_traced(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        torch.compiler, "is_dynamo_compiling", lambda: False
    )  # what the hook asks to stay out of a trace


@mutant(
    "model.to() that reallocates the weights goes unnoticed",
    cpu=_FAULTS + "test_a_replaced_parameter_or_buffer_is_refused_naming_it_and_the_fix",
)
def reallocation_unseen(mp: pytest.MonkeyPatch) -> None:
    check = watch.StateWatch.check

    def unless_reallocated(self, module, attributes, how) -> None:
        if not how.startswith("reallocated"):
            check(self, module, attributes, how)

    mp.setattr(watch.StateWatch, "check", unless_reallocated)


@mutant(
    "a replay plan never copies a splitting op's fresh output to the captured address",
    cpu=_RUNTIME + "test_plan_replays_equal_eager_for_new_values_in_the_static_buffers[fresh_split_outputs]",
)
def plan_ignores_moved_inputs(mp: pytest.MonkeyPatch) -> None:
    original = plan.replay_step
    mp.setattr(plan, "replay_step", lambda cuda_graph, moved: original(cuda_graph, []))


@mutant(
    "a replay plan checks no caller-owned input address",
    cpu=_RUNTIME + "test_plan_checks_caller_inputs_that_moved_but_not_parameters",
)
def plan_checks_no_caller_inputs(mp: pytest.MonkeyPatch) -> None:
    original = plan.ReplayPlan.__init__

    def init(self, padded_size, steps, num_slots, output, cheap_checks, *rest):
        original(self, padded_size, steps, num_slots, output, [], *rest)

    mp.setattr(plan.ReplayPlan, "__init__", init)


@mutant(
    "outputs are cut wherever dim 0 equals the padded size, not where the trace has the batch",
    cpu=_PROPS + "test_padded_outputs_are_cut_back_exactly_where_the_trace_has_the_batch",
)
def unpad_cuts_every_n_rows(mp: pytest.MonkeyPatch) -> None:
    # no marks from the trace: every tensor whose dim 0 equals the padded size is cut, a [n] weight included
    mp.setattr(api.core, "batched_outputs", lambda output, is_batched: None)


@mutant(
    "padded outputs inside a namedtuple are not cut back",
    cpu=_PROPS + "test_padded_outputs_are_cut_back_exactly_where_the_trace_has_the_batch",
)
def unpad_skips_namedtuples(mp: pytest.MonkeyPatch) -> None:
    original = padding.container_items
    mp.setattr(
        padding, "container_items", lambda value: None if hasattr(value, "_fields") else original(value)
    )


@mutant(
    "Dynamo's table of backends keeps a dropped compiled model (its pieces and CUDA graphs) alive",
    cpu=_RUNTIME + "test_a_dropped_compiled_model_is_freed_with_its_runtime_and_pieces",
)
def backend_holds_the_model(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(api.weakref, "WeakMethod", lambda method: lambda: method)  # every weak call made strong


@mutant(
    "the compiled function Dynamo keeps for a graph holding collectives keeps the model alive",
    cpu="suites/test_tensor_parallel.py::test_a_dropped_compiled_shard_is_freed",
)
def compiled_function_holds_the_model(mp: pytest.MonkeyPatch) -> None:
    weak, seen = weakref.WeakMethod, set()

    # a model's first weak call is its backend (kept weak), the second its compiled function
    def method_ref(method):
        if id(method.__self__) in seen:
            return lambda: method
        seen.add(id(method.__self__))
        return weak(method)

    mp.setattr(api.weakref, "WeakMethod", method_ref)


@mutant(
    "attributes set and hooks registered or removed after the first call go unnoted: the old trace serves",
    cpu=f"{_STATE}test_a_change_after_the_first_call_is_served_by_a_new_trace_logged_once "
    f"{_STATE}test_a_hook_the_trace_ran_that_is_removed_is_served_by_a_new_trace "
    f"{_STATE}test_a_parametrization_after_the_first_call_is_served_by_a_new_trace",
)
def state_changes_unnoted(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(watch.StateWatch, "note", lambda self, module, what, attribute=None: None)


@mutant(
    "a global module forward hook is served: it runs on the compiled model's own graph modules too",
    cpu=_STATE + "test_global_module_forward_hooks_are_refused_naming_the_fix",
)
def global_hooks_served(mp: pytest.MonkeyPatch) -> None:
    for module in (api, watch):
        mp.setattr(module, "refuse_global_hooks", lambda: None)


@mutant(
    "a call with grad on and an argument that requires grad returns a detached output without a word",
    cpu=_STATE + "test_a_call_with_grad_on_and_an_input_that_requires_grad_is_refused_naming_the_fix",
)
def grad_inputs_served_detached(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(api, "refuse_grad", lambda args, labels=None: None)


_FORMS = "suites/test_call_forms.py::"


@mutant(
    "keyword arguments are taken in the call's order, not by name",
    cpu=_FORMS + "test_keyword_calls_are_served_in_any_form_without_dynamo",
)
def keywords_by_position(mp: pytest.MonkeyPatch) -> None:
    original = arguments.Arguments.flat
    mp.setattr(
        arguments.Arguments,
        "flat",
        lambda self, args, kwargs: (
            [*args, *kwargs.values()]
            if len(args) == self.count and kwargs.keys() == self.keys
            else original(self, args, kwargs)
        ),
    )


@mutant(
    "an argument the first call left to its default is served with any value",
    cpu=_FORMS
    + "test_a_keyword_call_that_does_not_fit_is_an_input_error_naming_the_argument "
    + _FORMS
    + "test_a_positional_first_call_serves_keyword_calls_and_checks_their_defaults",
)
def defaults_unchecked(mp: pytest.MonkeyPatch) -> None:
    original = arguments.Arguments.plan
    mp.setattr(arguments.Arguments, "plan", lambda self, count, names: (original(self, count, names)[0], []))


@mutant(
    "mappings (a ModelOutput), dataclasses and namedtuples in the output are leaves: calls go through Dynamo",
    cpu=_FORMS + "test_mapping_dataclass_and_namedtuple_outputs_are_served_by_the_graph_alone",
)
def output_containers_unwalked(mp: pytest.MonkeyPatch) -> None:
    original = values.children
    mp.setattr(
        values, "children", lambda value: original(value) if type(value) in (tuple, list, dict) else None
    )


@mutant(
    "constants in the output are not reproduced by the graph: such outputs go through Dynamo",
    cpu=_FORMS + "test_mapping_dataclass_and_namedtuple_outputs_are_served_by_the_graph_alone",
)
def output_constants_unserved(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(binding, "CONSTANT_TYPES", ())


@mutant(
    "padded outputs inside mappings and dataclasses are not cut back",
    cpu=_FORMS + "test_padded_rows_are_cut_in_every_container_where_the_trace_has_the_batch",
)
def unpad_skips_mappings_and_dataclasses(mp: pytest.MonkeyPatch) -> None:
    original = padding.container_items
    mp.setattr(
        padding,
        "container_items",
        lambda value: original(value) if isinstance(value, (tuple, list)) or type(value) is dict else None,
    )


@mutant(
    "calls that go through Dynamo are logged at INFO, not said at WARNING",
    cpu=_FORMS + "test_an_output_the_graph_cannot_produce_is_said_at_warning_once_with_the_fix",
)
def dynamo_calls_logged_quietly(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(api.log, "warning", api.log.info)


@mutant(
    "the registered backend also compiles the first call's batch size statically (a second compile per "
    "piece)",
    cpu="suites/test_compile.py::test_torch_compile_traces_once_for_every_batch_size_with_the_recipe",
)
def backend_compiles_the_traced_size(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.backend  # what `backend="pieceworks"` builds (backend.registered_backend)

    original = pieceworks.backend.Backend

    class Backend(original):
        def __call__(self, gm, example_inputs):
            batch = min(int(a.shape[0]) for a in example_inputs if isinstance(a, torch.Tensor) and a.dim())
            self.config = dataclasses.replace(self.config, compile_sizes=[batch]).freeze()
            return original.__call__(self, gm, example_inputs)

    mp.setattr(pieceworks.backend, "Backend", Backend)


@mutant(
    "a parameter set to None (no registration hook fires) is not seen: the old bias is served",
    cpu=_STATE + "test_a_change_after_the_first_call_is_served_by_a_new_trace_logged_once[bias=None]",
)
def none_set_unseen(mp: pytest.MonkeyPatch) -> None:
    same = watch._same
    mp.setattr(watch, "_same", lambda old, new: new is None or same(old, new))


@mutant(
    "a watched tensor's memory freed by `.data = t` (no setattr) is not seen: the old trace is served",
    cpu=_STATE + "test_a_change_after_the_first_call_is_served_by_a_new_trace_logged_once[bias.data=ones(1)]",
)
def data_swap_unseen(mp: pytest.MonkeyPatch) -> None:
    note = watch.StateWatch.note

    def unless_freed(self, module, what, attribute=None) -> None:
        if ".data =" not in what:
            note(self, module, what, attribute)

    mp.setattr(watch.StateWatch, "note", unless_freed)


@mutant(
    "`module.__class__` reads the watched class: torch's parametrize removal fails deleting its property",
    cpu=_STATE + "test_a_parametrization_removed_after_the_first_call_is_traced_again",
)
def watched_class_shown(mp: pytest.MonkeyPatch) -> None:
    original = watch.StateWatch.__init__

    def init(self, model, owner, reads=()) -> None:
        original(self, model, owner, reads)
        for module in model.modules():  # each under a subclass of its watched class that shows itself
            shows = {"__class__": object.__dict__["__class__"]}
            object.__dict__["__class__"].__set__(module, type("Shown", (type(module),), shows))

    mp.setattr(watch.StateWatch, "__init__", init)


@mutant(
    "a compiled bound forward watches nothing: its module's attributes set after the first call are not seen",
    cpu=_STATE + "test_a_compiled_bound_forward_watches_its_module",
)
def bound_forward_unwatched(mp: pytest.MonkeyPatch) -> None:
    original = watch.StateWatch.__init__

    def init(self, model, owner, reads=()) -> None:
        original(self, model if owner.model is model else torch.nn.Module(), owner, reads)

    mp.setattr(watch.StateWatch, "__init__", init)


@mutant(
    "a compiled model pickles and copies as any object: the copy fails inside torch",
    cpu=_STATE + "test_a_compiled_model_is_not_pickled_or_copied_naming_the_fix",
)
def compiled_model_pickled(mp: pytest.MonkeyPatch) -> None:
    mp.delattr(api.CompiledModel, "__reduce_ex__")


@mutant(
    "a compiled model called inside a caller's torch.compile is not run outside that trace",
    cpu="suites/test_compile.py::test_a_compiled_model_called_inside_torch_compile_is_served_outside_its_trace",
)
def call_inside_torch_compile_traced(mp: pytest.MonkeyPatch) -> None:
    class Torch:  # torch, whose compiler never says it is compiling, for the compiled model's module alone
        compiler = types.SimpleNamespace(is_dynamo_compiling=lambda: False)

        def __getattr__(self, name: str) -> object:
            return getattr(torch, name)

    mp.setattr(api, "torch", Torch())


@mutant(
    "the torch function modes (torch.device, set_default_device) are not read per call",
    cpu=_STATE + "test_a_torch_function_mode_entered_after_the_first_call_is_traced_for",
)
def function_modes_unwatched(mp: pytest.MonkeyPatch) -> None:
    modes = watch.global_modes
    mp.setattr(watch, "global_modes", lambda: (*modes()[:-1], 0))  # the last: the torch function modes
