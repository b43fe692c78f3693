"""Mutants of configuration and of what a new user is told: splitting ops, Inductor keys, capture sizes,
frozen configs, graph modes dropped, progress bars, environment variables, cache folders and the modes
torch.compile refuses."""

from __future__ import annotations

import os
import types

import pytest
from torch._dynamo.backends import registry

import pieceworks.backend as backend
import pieceworks.batch_kind as batch_kind
import pieceworks.compiled as compiled
import pieceworks.config as config
import pieceworks.model.compiled_model as api
import pieceworks.progress as progress

from . import mutant

_CONFIG = "suites/test_config.py::"
_FAULTS = "suites/test_user_faults.py::"


@mutant(
    "splitting ops naming no registered op are accepted",
    cpu=_FAULTS + "test_a_misspelt_splitting_op_is_a_config_error_naming_the_close_match",
)
def splitting_ops_unchecked(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(compiled, "check_splitting_ops", lambda ops: None)


@mutant(
    "splitting ops the graph never calls go unreported",
    cpu=_FAULTS + "test_a_registered_splitting_op_the_graph_never_calls_gets_one_warning",
)
def absent_splitting_ops_silent(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(compiled, "absent_splitting_ops", lambda gm, ops: [])


@mutant(
    "unknown inductor_compile_config keys are accepted",
    cpu=_CONFIG + "test_inductor_config_keys_are_checked_at_construction",
)
def inductor_keys_unchecked(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(config, "check_inductor_keys", lambda keys: None)


@mutant(
    "a compiled config can still be edited",
    cpu=_CONFIG + "test_a_compiled_config_is_frozen_and_the_model_keeps_its_own_copy",
)
def config_not_frozen(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(config.CompilationConfig, "freeze", lambda self: self)


@mutant(
    "compiled models use the caller's config object itself",
    cpu=_CONFIG + "test_a_compiled_config_is_frozen_and_the_model_keeps_its_own_copy",
)
def config_shared_not_copied(mp: pytest.MonkeyPatch) -> None:
    for module in (api.core, backend):  # what CompiledModel and Backend read
        mp.setattr(
            module,
            "own_config",
            lambda given: given.freeze() if given is not None else backend.CompilationConfig().freeze(),
        )


@mutant(
    "default capture sizes end at the stride step below an off-stride max_num_batched_tokens",
    cpu=_CONFIG + "test_default_capture_sizes_end_at_an_off_stride_token_limit",
)
def capture_sizes_stop_below_the_limit(mp: pytest.MonkeyPatch) -> None:
    def sizes(max_size=512):
        return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)] if s <= max_size]

    mp.setattr(config, "default_capture_sizes", sizes)


# its cases kwargs18, kwargs19
@mutant("a graph mode with no capture size is accepted", cpu=_CONFIG + "test_bad_field_is_named_with_a_fix")
def empty_capture_sizes_accepted(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(config, "check_something_to_capture", lambda mode, sizes: None)


@mutant(
    'compile_sizes=["cudagraph_capture_sizes"] is rejected',
    cpu=_CONFIG + "test_compile_sizes_shorthand_expands_to_the_capture_sizes",
)
def compile_sizes_shorthand_unknown(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(config, "CAPTURE_SIZES_SHORTHAND", "capture_sizes")  # vLLM's spelling is then an unknown entry


@mutant(
    "a graph mode that becomes NONE is logged at INFO",
    cpu="suites/test_modes_cpu.py::test_every_mode_runs_without_graphs_on_cpu_and_says_so[CUDAGraphMode.PIECEWISE]",
)
def graph_mode_dropped_quietly(mp: pytest.MonkeyPatch) -> None:
    log = batch_kind.log  # effective_mode's, which logs the mode a graph gets
    mp.setattr(
        batch_kind,
        "log",
        types.SimpleNamespace(info=log.info, warning=log.info, debug=log.debug, error=log.error),
    )


@mutant(
    "compile and capture show no progress bar on a terminal",
    cpu=_FAULTS + "test_the_first_call_shows_compile_progress_on_a_terminal_only",
    gpu=_FAULTS + "test_capture_shows_progress_on_a_terminal",
)
def no_progress_bar(mp: pytest.MonkeyPatch) -> None:
    for module in (compiled, api.core):  # what compile_pieces and CompiledModel read
        mp.setattr(module, "progress", lambda items, description: items)


@mutant(
    "a progress bar is drawn when stderr is not a terminal (a log file, CI)",
    cpu=_FAULTS + "test_the_first_call_shows_compile_progress_on_a_terminal_only",
)
def progress_bar_in_logs(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(progress, "shown", lambda: config.env_flag("PIECEWORKS_PROGRESS", True))


@mutant(
    "boolean environment variables are on for any value but 0: "
    "PIECEWORKS_DISABLE_CACHE=false disables the cache",
    cpu=f"{_CONFIG}test_the_disable_switch_takes_the_usual_spellings "
    f"{_CONFIG}test_a_boolean_variable_of_another_spelling_is_a_config_error_naming_it",
)
def env_flags_read_as_not_zero(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        config, "env_flag", lambda name, default: os.environ.get(name, "0" if not default else "1") != "0"
    )


@mutant(
    "a cache folder starting with ~ is taken literally: a folder named ~ appears in the working directory",
    cpu=_CONFIG + "test_a_cache_folder_with_a_tilde_is_under_the_home_folder",
)
def cache_dir_tilde_literal(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(config, "expand_path", os.fspath)


@mutant(
    "inductor_compile_config values are not checked against their options' types: max_autotune='yes' passes",
    cpu=_CONFIG + "test_bad_field_is_named_with_a_fix",
)
def inductor_values_unchecked(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(config, "fits_option_type", lambda value, declared: True)


@mutant(
    "a field pieceworks lacks (vLLM's `level`) gets Python's TypeError, which names no pieceworks fix",
    cpu=_CONFIG + "test_bad_field_is_named_with_a_fix",
)
def unknown_field_unnamed(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(config.CompilationConfig, "__new__", lambda cls, *args, **fields: object.__new__(cls))


@mutant(
    'torch.compile(model, backend="pieceworks", mode="reduce-overhead") runs, ignoring the mode, instead of '
    "being refused by name",
    cpu="suites/test_compile.py::test_torch_compiles_mode_is_refused_by_name_naming_the_options_that_set_cuda_"
    "graphs",
)
def compile_mode_ignored(mp: pytest.MonkeyPatch) -> None:
    original = backend.registered_backend

    def registered(gm, example_inputs, options=None, mode=None):
        return original(gm, example_inputs, options)

    registered._tags = ()  # type: ignore[attr-defined]  # what list_backends reads
    mp.setattr(backend, "registered_backend", registered)
    # torch calls the function it holds under "pieceworks" (loaded once from the entry point)
    mp.setitem(registry._COMPILER_FNS, "pieceworks", registered)
