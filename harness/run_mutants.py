"""Run each mutant against the properties it must break; write what hypothesis reported.

`python -m pieceworks.harness.run_mutants [--gpu] [--profile find-only] [--only NAME ...] --out
results/property_mutants.md` runs pytest once per mutant (see mutants.py), on the tests named below (stopping at the
first failure), and records for each: did the suite fail (it must), the first error, and the falsifying example
hypothesis printed. Each run has a time limit (`--timeout`, default 240 s): a run past it counts as SURVIVED, with
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

TARGETS = {
    "split_loses_order": "suites/test_properties.py::test_split_model_equals_original",
    "getitem_to_next_piece": "suites/test_properties.py::test_split_structure",
    "index_without_checksum": "suites/test_properties.py::test_damaged_index_is_a_clear_error_never_a_wrong_entry",
    "key_ignores_config": "suites/test_cache_key.py::test_every_code_factor_moves_the_key_and_nothing_per_run_does",
    "pad_to_the_size_below": "suites/test_properties.py::test_padding_picks_the_smallest_captured_size_at_least_the_batch",
    "load_without_checking": "suites/test_cache_machine.py",
    "arg_check_skips_dtype":
        "suites/test_properties.py::test_any_argument_mismatch_is_an_input_error_naming_the_argument",
    # the compile cache (issues 7.2-7.10, 12.6-12.9)
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
    "backend_compilations_count_fresh_compiles": "suites/test_cache.py::test_identical_pieces_are_loaded_once",
    "inductor_options_ignored": "suites/test_cache.py::test_inductor_compile_config_reaches_the_generated_code",
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
    "capture_snapshots_weights": "suites/test_replay_state_gpu.py",
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
    failure = re.findall(r"^E\s+((?:\w*Error|Failed)\b.*)$", text, re.M)
    text = re.sub(r"^E {1,7}", "", text, flags=re.M)
    found = re.search(r"(Falsifying example:.*?\n\s*\)\s*\n(?:[ \t]*Draw \d+[^\n]*\n)*)", text, re.S) or re.search(
        r"(state = \w+\(\).*?state\.teardown\(\))", text, re.S)
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
    parser.add_argument("--timeout", type=float, default=240, help="seconds per mutant run (default 240)")
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
