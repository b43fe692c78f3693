"""Run each mutant against the properties it must break; write what hypothesis reported.

`python -m pieceworks.harness.run_mutants [--gpu] [--profile find-only] [--only NAME ...] --out
results/property_mutants.md` runs pytest once per mutant (see mutants.py), on the tests named below (stopping at the
first failure), and records for each: did the suite fail (it must), the first error, and the falsifying example
hypothesis printed. Each run has a time limit (`--timeout`, default 600 s): a run past it counts as SURVIVED, with
the reason. Prints `NAME: caught|SURVIVED (seconds)` per mutant as it goes; exit status 1 if any survived.
On the GPU use `--profile find-only` (no shrinking: each shrink step compiles and captures a model).
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import time

import torch

from .mutants import MUTANTS

_FAULTS = "suites/test_user_faults.py::"
_CONFIG = "suites/test_config.py::"
_GATE = "suites/test_gate.py::"
_RUNTIME = "suites/test_runtime.py::"
_PROPS = "suites/test_properties.py::"
TARGETS = {  # mutant -> the CPU test(s) that must fail under it: space-separated node ids, run in one pytest
    "split_loses_order": "suites/test_properties.py::test_split_model_equals_original",
    "getitem_to_next_piece": "suites/test_properties.py::test_split_structure",
    "index_without_checksum": "suites/test_properties.py::test_damaged_index_is_a_clear_error_never_a_wrong_entry",
    "key_ignores_config": "suites/test_cache_key.py::test_every_code_factor_moves_the_key_and_nothing_per_run_does",
    "pad_to_the_size_below": "suites/test_properties.py::test_padding_picks_the_smallest_captured_size_at_least_the_batch",
    "static_copy_misses_last_row":
        "suites/test_dispatch.py::test_static_inputs_hold_each_call_in_place_and_keep_earlier_rows_as_padding",
    "load_without_checking": "suites/test_cache_machine.py",
    "arg_check_skips_dtype":
        "suites/test_properties.py::test_any_argument_mismatch_is_an_input_error_naming_the_argument",
    # the compile cache
    "unusable_cache_raises": "suites/test_cache_faults.py::test_unusable_cache_directory_warns_once_and_runs_uncached",
    "read_only_cache_raises":
        "suites/test_cache_faults.py::test_read_only_cache_loads_what_is_valid_and_compiles_the_rest_in_memory",
    "wrong_types_not_replaced": "suites/test_cache_faults.py::test_wrong_type_inside_the_key_directory_is_replaced",
    "load_ignores_claims":
        "suites/test_cache_faults.py::test_entries_moved_between_names_never_load_for_the_wrong_piece",
    "key_ignores_inductor_config":
        "suites/test_cache_key.py::test_every_code_factor_moves_the_key_and_nothing_per_run_does",
    "key_ignores_torch_git": "suites/test_cache_key.py::test_every_code_factor_moves_the_key_and_nothing_per_run_does",
    "fingerprint_ignores_strides":
        "suites/test_cache_key.py::test_every_code_factor_moves_the_key_and_nothing_per_run_does",
    "key_includes_working_directory":
        "suites/test_cache_key.py::test_every_code_factor_moves_the_key_and_nothing_per_run_does",
    "fingerprint_ignores_constants":
        "suites/test_cache_dedupe.py::test_pieces_differing_in_a_constant_never_share_code",
    "no_entry_lock": "suites/test_cache.py::test_concurrent_cold_processes_share_the_work",
    "store_without_index_lock":
        "suites/test_cache_atomicity.py::test_concurrent_writers_of_different_entries_lose_nothing",
    "index_written_in_place": "suites/test_cache_atomicity.py::test_a_writer_failing_anywhere_leaves_no_torn_file",
    "inductor_cache_not_carried": "suites/test_cache.py::test_warm_start_on_a_new_host_compiles_and_builds_nothing",
    "backend_compilations_count_fresh_compiles":
        "suites/test_cache.py::test_warm_start_on_a_new_host_compiles_and_builds_nothing",
    "inductor_options_ignored": "suites/test_cache.py::test_inductor_compile_config_reaches_the_generated_code",
    # the benchmark registry and the host-overhead breakdown
    "resolve_returns_the_class": "suites/test_implementations.py::test_resolve_by_dotted_path",
    "user_implementations_not_registered":
        "suites/test_implementations.py::test_user_implementations_from_the_environment",
    "pcg_always_available": "suites/test_implementations.py::test_unavailable_reasons",
    "breakdown_drops_splitting_ops": "suites/test_host_overhead.py::test_host_overhead_cpu",
    # what a new user runs into
    "piece_args_from_a_fake_rerun": _FAULTS + "test_data_dependent_sizes_compile_and_run_with_inductor",
    "unbacked_size_bound_in_its_reader": _FAULTS + "test_the_size_a_splitting_op_binds_stays_in_its_piece",
    "static_compiles_of_data_dependent_pieces": _FAULTS + "test_data_dependent_sizes_split_compile_and_run_eager",
    "splitting_ops_unchecked": _FAULTS + "test_a_misspelt_splitting_op_is_a_config_error_naming_the_close_match",
    "absent_splitting_ops_silent": _FAULTS + "test_a_registered_splitting_op_the_graph_never_calls_gets_one_warning",
    "inductor_keys_unchecked": _CONFIG + "test_inductor_config_keys_are_checked_at_construction",
    "config_not_frozen": _CONFIG + "test_a_compiled_config_is_frozen_and_the_model_keeps_its_own_copy",
    "config_shared_not_copied": _CONFIG + "test_a_compiled_config_is_frozen_and_the_model_keeps_its_own_copy",
    "capture_sizes_stop_below_the_limit": _CONFIG + "test_default_capture_sizes_end_at_an_off_stride_token_limit",
    "empty_capture_sizes_accepted": _CONFIG + "test_bad_field_is_named_with_a_fix",  # its cases kwargs18, kwargs19
    "compile_sizes_shorthand_unknown": _CONFIG + "test_compile_sizes_shorthand_expands_to_the_capture_sizes",
    "graph_mode_dropped_quietly":
        "suites/test_modes_cpu.py::test_every_mode_runs_without_graphs_on_cpu_and_says_so[CUDAGraphMode.PIECEWISE]",
    # CI: the benchmark gate and the preflight
    "gate_ratio_inverted": _GATE + "test_latency_regression_fails_with_a_table",
    "gate_one_threshold_for_all": _GATE + "test_memory_regression_beyond_two_percent_fails",
    "gate_ignores_noise": _GATE + "test_noise_guard_widens_the_threshold_to_the_measured_spread",
    "gate_missing_is_ok": _GATE + "test_missing_benchmark_or_parameter_is_incomplete",
    "gate_failures_pass": _GATE + "test_failed_benchmark_is_incomplete",
    "gate_improvements_fail": _GATE + "test_improvement_is_shown_not_failed",
    "conformance_nothing_ran_passes":
        "suites/test_conformance_suite.py::test_a_run_in_which_nothing_ran_fails_saying_why",
    "index_warns_every_read": "suites/test_cache.py::test_unreadable_index_is_logged_and_rebuilt",
    "prune_by_age_only":
        "suites/test_cache_faults.py::test_prune_removes_key_folders_unused_for_days_or_of_another_build",
    "replaced_state_served": _FAULTS + "test_a_replaced_parameter_or_buffer_is_refused_naming_it_and_the_fix",
    "reallocation_unseen": _FAULTS + "test_a_replaced_parameter_or_buffer_is_refused_naming_it_and_the_fix",
    "layout_passed_through": _FAULTS + "test_any_input_layout_is_served_right",
    "no_progress_bar": _FAULTS + "test_the_first_call_shows_compile_progress_on_a_terminal_only",
    "capture_sizes_skip_one": "suites/test_strategies.py::test_sizes_reach",
    "batches_never_beyond": "suites/test_strategies.py::test_sizes_reach",
    "adapter_counts_the_session":
        "suites/test_implementations.py::test_the_adapters_compile_count_is_what_the_build_compiled",
    "gate_drift_per_benchmark": _GATE + "test_a_slow_spell_on_one_batch_size_is_drift_there_not_a_regression",
    "report_always_committed":
        "suites/test_report.py::test_committed_only_where_git_tracks_the_result_files_unmodified",
    "demo_leaves_its_folder": "suites/test_temp_folders.py::test_the_demo_removes_its_folders",
    "report_unmeasured_as_method_text":
        "suites/test_report.py::test_a_cpu_run_says_not_measured_here_for_every_gpu_section",
    "gate_incomplete_hides_regression": _GATE + "test_a_regression_of_ours_with_steady_controls_fails",
    "gate_noise_fails_unchanged": _GATE + "test_a_change_too_noisy_to_judge_is_incomplete",
    "empty_pieces_through_inductor":
        "suites/test_properties.py::test_split_model_through_inductor_equals_original_and_reloads",
    "loads_start_compile_workers": "suites/test_cache.py::test_artifacts_load_in_this_process",
    "timing_not_interleaved": "suites/test_timing.py::test_a_slow_spell_falls_on_both_sides_of_a_ratio",
    "report_hides_what_the_split_costs":
        "suites/test_report.py::test_side_by_side_runs_give_target_rows_and_say_what_the_split_costs",
    "report_hides_later_warm_starts":
        "suites/test_report.py::test_warm_start_runs_get_a_table_and_say_where_their_first_call_went",
    "gate_ignores_controls": _GATE + "test_drift_of_the_environment_is_incomplete_not_a_regression",
    "report_ignores_side_by_side_profiles":
        "suites/test_report.py::test_a_side_by_side_profile_explains_a_miss_the_latency_run_profiled_one_side_of",
    "report_hides_where_the_first_call_went":
        "suites/test_report.py::test_a_warm_start_miss_says_where_the_first_call_went",
    "report_hides_the_capture_cost":
        "suites/test_report.py::test_a_capture_miss_says_what_the_first_size_and_each_further_graph_cost",
    "report_latency_ratio_ignores_rounds":
        "suites/test_report.py::test_latency_ratios_come_from_the_rounds_where_the_run_timed_side_by_side",
    "code_size_counts_docstrings":
        "suites/test_code_size.py::test_code_lines_leave_out_blanks_comments_and_docstrings",
    "report_hides_the_kernel_difference":
        "suites/test_report.py::test_a_miss_is_explained_by_both_sides_and_the_kernels_only_one_runs",
    "preflight_ignores_other_processes": "suites/test_preflight.py::test_another_process_on_the_gpu_is_busy",
    "preflight_ignores_the_clock": "suites/test_preflight.py::test_a_clock_held_below_its_maximum_is_throttled",
    # the runtime on CPU: replay plans, direct calls without Dynamo
    "plan_ignores_moved_inputs":
        _RUNTIME + "test_plan_replays_equal_eager_for_new_values_in_the_static_buffers[fresh_split_outputs]",
    "plan_checks_no_caller_inputs": _RUNTIME + "test_plan_checks_caller_inputs_that_moved_but_not_parameters",
    "parameters_bound_by_value": _RUNTIME + "test_parameter_data_swaps_are_seen_by_direct_calls",
    "batch_size_from_the_trace": _RUNTIME + "test_symbolic_batch_inputs_get_each_calls_batch_size",
    "always_through_dynamo": "suites/test_compile.py::test_after_the_first_call_no_call_enters_dynamo",
    "outputs_flat": _RUNTIME + "test_direct_calls_return_the_models_output_structure",
    # outputs cut back, first call, plain-value checks (test_properties)
    "unpad_cuts_every_n_rows": _PROPS + "test_padded_outputs_are_cut_back_exactly_where_the_trace_has_the_batch",
    "unpad_skips_namedtuples": _PROPS + "test_padded_outputs_are_cut_back_exactly_where_the_trace_has_the_batch",
    "first_call_runs_twice": _PROPS + "test_first_call_writes_model_state_once",
    "trace_writes_not_restored": _PROPS + "test_first_call_writes_model_state_once[1]",  # batch 1 traces on copies
    "value_check_ignores_type": _PROPS + "test_a_plain_value_of_another_type_is_an_input_error",
}
_POOL = "suites/test_pool_gpu.py::"
_SAFETY = "suites/test_replay_safety_gpu.py::"
_WRITES = "suites/test_writes_gpu.py::"
GPU_TARGETS = {  # several targets: space-separated node ids, run in one pytest
    "pad_to_the_size_below": "suites/test_properties_gpu.py::test_replay_matches_eager_for_any_batch_sequence",
    "static_copy_misses_last_row": "suites/test_properties_gpu.py::test_toy_llama_replay_matches_eager_for_any_batch_sequence",
    "capture_smallest_first": _POOL + "test_capture_order_is_largest_first",
    "capture_keeps_outputs": _POOL + "test_one_pool_for_all_sizes_costs_no_more_than_the_largest_alone",
    "replay_leaks_outputs": _POOL + "test_thousands_of_replays_grow_no_memory",
    "checks_parameters_not_split_outputs": f"{_SAFETY}test_fresh_split_outputs_raise_or_are_right_never_stale "
                                           f"{_SAFETY}test_caller_inputs_that_move_raise_or_are_right_never_stale",
    "unpad_top_level_only": _SAFETY + "test_padded_outputs_are_cut_back_in_nested_tuples_and_lists",
    "unpad_keeps_the_tail": _SAFETY + "test_poisoned_rows_never_reach_the_rows_of_later_calls",
    "static_buffers_uninitialised": _SAFETY + "test_padded_rows_never_hold_uninitialised_values",
    "no_copy_back_of_inplace_writes": _WRITES + "test_inplace_writes_happen_once_per_call",
    "warmup_writes_twice": _WRITES + "test_inplace_writes_happen_once_per_call",
    "replay_copies_outputs": _WRITES + "test_outputs_are_valid_until_the_next_call_and_overwritten_by_it",
    "outputs_alias_freed_memory": _WRITES + "test_outputs_are_valid_until_the_next_call_and_overwritten_by_it",
    # the serving state machine may not load weights and then replay in a short run; this deterministic test does
    "capture_snapshots_weights": "suites/test_replay_state_gpu.py::test_weights_loaded_in_place_reach_every_captured_size",
    # chosen by reading the tests (no GPU where they were added): the behaviour exists only with CUDA graphs or CUDA
    "pcg_pads_to_the_size_below": "suites/test_implementations.py::test_meta_pcg_pads_and_serves_like_eager",
    "data_dependent_pieces_captured":
        _FAULTS + "test_pieces_with_data_dependent_sizes_run_without_graphs_logged_once",
    "unsplit_piecewise_runs_without_graphs":
        _FAULTS + "test_piecewise_without_a_splitting_op_captures_the_one_piece_per_size",
    "clock_skips_the_device": "suites/test_timing.py::test_gpu_timers_wait_for_the_device",
    "events_per_launch": "suites/test_timing.py::test_gpu_timers_wait_for_the_device",
    "pool_reading_counts_every_pool": "suites/test_timing.py::test_memory_readings_see_a_known_allocation",
    "no_progress_bar": _FAULTS + "test_capture_shows_progress_on_a_terminal",
    "replaced_state_served": _FAULTS + "test_a_replaced_parameter_or_buffer_is_refused_naming_it_and_the_fix",
}


def _run(mutant: str, target: str, profile: str | None, timeout: float) -> tuple[bool, str]:
    extra = ["--hypothesis-profile", profile] if profile else []
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *target.split(), "-x", "-q", "-p", "no:cacheprovider",
             "--pieceworks-mutant", mutant, *extra],
            capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"(no verdict within {timeout:g} s: counted as survived)"
    text = proc.stdout + proc.stderr
    # the first error pytest shows; a bare `assert` (no message) shows as `E  assert ...` without an error name
    failure = (re.findall(r"^E\s+((?:\w*Error|Failed)\b.*)$", text, re.M)
               or re.findall(r"^E\s+(assert\b.*)$", text, re.M))
    text = re.sub(r"^E {1,7}", "", text, flags=re.M)
    # the shrunk example: "Falsifying example:" (older hypothesis) or "Failing test case:"; or a state machine's steps
    found = re.search(r"((?:Falsifying example|Failing test case):.*?\n\s*\)\s*\n(?:[ \t]*Draw \d+[^\n]*\n)*)",
                      text, re.S) or re.search(r"(state = \w+\(\).*?state\.teardown\(\))", text, re.S)
    detail = found.group(1).strip() if found else "(none printed)"
    first_error = failure[0] if failure else ""
    if proc.returncode not in (0, 1):  # 2-5: interrupted, internal or usage error, nothing collected: no verdict
        return False, f"pytest exit status {proc.returncode}, not a failing test:\n{text[-1500:]}"
    return proc.returncode == 1, f"{first_error}\n{detail}".strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run the GPU mutants (needs CUDA)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", default=None, help="hypothesis profile, e.g. find-only (no shrinking)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these mutants")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant run (default 600)")
    args = parser.parse_args(argv)
    targets = GPU_TARGETS if args.gpu else TARGETS
    if args.only:
        unknown = sorted(set(args.only) - set(targets))
        if unknown:
            parser.error(f"not {'GPU' if args.gpu else 'CPU'} mutants: {unknown}; known: {sorted(targets)}")
        targets = {name: targets[name] for name in args.only}
    lines = [f"## {'GPU' if args.gpu else 'CPU'} mutants, {datetime.date.today()}, torch {torch.__version__}"
             + (f", {torch.cuda.get_device_name()}" if args.gpu else ""), ""]
    survived = []
    for mutant, target in targets.items():
        start = time.perf_counter()
        failed, detail = _run(mutant, target, args.profile, args.timeout)
        print(f"{mutant}: {'caught' if failed else 'SURVIVED'} ({time.perf_counter() - start:.0f} s)", flush=True)
        if not failed:
            survived.append(mutant)
        lines += [f"### `{mutant}`: {MUTANTS[mutant][0]}", "", f"Target: `{target}`. Result: "
                  f"{'the property failed, as it must' if failed else 'the property still passed'}.", "",
                  "```", detail, "```", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
