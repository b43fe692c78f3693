"""Mutants of what the project reports: the benchmark report, the code-size count and the warm-start
command."""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import tempfile
import types

import pytest

import pieceworks.harness.measure.profile as profile
import pieceworks.harness.measure.provenance as provenance
import pieceworks.harness.measure.warm_start as warm_start
import pieceworks.harness.testing.scenario as scenario
import pieceworks.report as report
import pieceworks.report.document as document
import pieceworks.report.host_overhead as host_overhead
import pieceworks.report.latency as latency
import pieceworks.report.notes as notes
import pieceworks.report.parts as parts
import pieceworks.report.results as results
import pieceworks.report.serving as serving
import pieceworks.report.starts as starts
import suites.benchmarks.code_size as code_size

from . import mutant

_REPORT = "suites/test_report.py::"


@mutant(
    "a call-over-plan miss in the side-by-side runs never says what the call adds under cProfile",
    cpu=_REPORT + "test_a_call_over_plan_miss_names_what_the_call_adds_under_cprofile",
)
def report_hides_what_the_call_adds(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(notes, "call_profile_note", lambda dtype, result: "")


@mutant(
    "a latency target is judged on every table that timed its sides, whatever its models and smallest batch",
    cpu=_REPORT + "test_a_latency_target_judges_its_models_from_its_smallest_batch",
)
def report_judges_every_table(mp: pytest.MonkeyPatch) -> None:
    original = report.load_results

    def load_results(*args, **kwargs):
        found = original(*args, **kwargs)
        for key in latency.LATENCY_TARGETS:
            found.targets[key] = {
                **found.targets[key],
                "models": [m for m, _ in latency.LATENCY_TABLES],
                "min_batch": 0,
            }
        return found

    mp.setattr(report, "load_results", load_results)


@mutant(
    "of the runtime_breakdown runs, the report reads the last by file name, not the newest by date",
    cpu=_REPORT + "test_the_newest_side_by_side_run_gets_a_table_of_its_rounds_and_the_call_over_plan_row",
)
def report_reads_the_last_name_not_the_newest_run(mp: pytest.MonkeyPatch) -> None:
    def last_by_name(details: dict, kind: str) -> dict | None:
        runs = {
            name[len(kind) + 1 :]: details.pop(name)
            for name in sorted(details)
            if name.startswith(kind + "_")
        }
        return {"commit": max(runs), **runs[max(runs)]} if runs else None

    mp.setattr(results, "newest", last_by_name)


@mutant(
    "the report judges the targets by limits of its own, not the thresholds file's",
    cpu=_REPORT + "test_targets_their_limits_and_labels_come_from_the_thresholds_file",
)
def report_keeps_its_own_limits(mp: pytest.MonkeyPatch) -> None:
    own = {"pool_51_vs_largest": 1.05, "core_lines": 1600}
    mp.setattr(results.Results, "limit", lambda self, key: own.get(key, 1.0))


@mutant(
    "a missed warm-start target never splits the first call into trace, split, load and compile",
    cpu=_REPORT + "test_a_warm_start_miss_says_where_the_first_call_went",
)
def report_hides_where_the_first_call_went(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(notes, "first_call_note", lambda what, entry: "")


@mutant(
    "a start's first call keeps no log: the start-up benchmark cannot say why a warm start traced or rebuilt",
    cpu="suites/test_cache.py::test_a_warm_start_whose_kernels_inductor_lost_counts_their_rebuilds",
)
def start_keeps_no_log(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        scenario,
        "logging",
        types.SimpleNamespace(  # the handler listens to a logger pieceworks never uses
            Handler=logging.Handler,
            INFO=logging.INFO,
            getLogger=lambda name: logging.getLogger("pieceworks-unheard"),
        ),
    )


@mutant(
    "where torch's bytecode is not cached, every start compiles torch's sources again (no priming start)",
    cpu="suites/test_temp_folders.py::test_where_bytecode_is_not_cached_a_priming_start_fills_a_cache_every_start_reads",
)
def starts_without_bytecode_cache(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(warm_start, "bytecode_cache", lambda work: None)


@mutant(
    "a missed capture target never says what the first size and each further graph cost",
    cpu=_REPORT
    + "test_a_capture_miss_says_what_the_first_size_and_each_further_graph_cost "
    + _REPORT
    + "test_serving_misses_carry_their_profiles",
)
def report_hides_the_capture_cost(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(notes, "capture_note", lambda r, model, mode: "")


@mutant(
    "a missed warm start or capture never says what it would cost without pieceworks' own time: torch's "
    "share and ours read alike",
    cpu=_REPORT
    + "test_a_capture_miss_says_what_the_first_size_and_each_further_graph_cost "
    + _REPORT
    + "test_a_warm_start_miss_says_where_the_first_call_went",
)
def report_hides_what_is_not_pieceworks(mp: pytest.MonkeyPatch) -> None:
    original = notes.host_profile_note
    mp.setattr(notes, "host_profile_note", lambda profile, measured=None: original(profile))


@mutant(
    "a serving target's note comes from its worst misses, explained or not: the whole 8B's capture misses, "
    "which no memory run profiled, leave the capture targets unexplained",
    cpu=_REPORT + "test_capture_misses_are_explained_by_the_worst_miss_a_memory_run_profiled",
)
def report_notes_from_unexplained_misses(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(serving, "worst_explained", _worst_misses(noted_only=False))


@mutant(
    "a serving target's note repeats one profile for its two worst misses (one model, both attentions) and "
    "leaves the next model's miss unexplained",
    cpu=_REPORT + "test_a_serving_target_notes_the_worst_miss_of_each_profile",
)
def report_notes_one_profile_twice(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(serving, "worst_explained", _worst_misses(noted_only=True))


def _worst_misses(noted_only: bool):
    """`serving.worst_explained` without its one miss per note (and, unless `noted_only`, without skipping
    the misses that carry no note)."""

    def worst(found, limit, count=2):
        return sorted((f for f in found if f[1] > limit and (f[2] or not noted_only)), key=lambda f: -f[1])[
            :count
        ]

    return worst


@mutant(
    "the report's mode to serve with is each trace's best alone: a mode within 1% of it in the rounds is not "
    "named, and one mode alike on both traces is missed",
    cpu=_REPORT + "test_the_report_answers_which_mode_to_serve_with",
)
def report_names_only_the_best_mode(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(serving, "ALIKE", 1.0 + 1e-9)


@mutant(
    "the latency tables and target rows divide one median by the other where the run timed both sides in "
    "rotating rounds",
    cpu=_REPORT + "test_latency_ratios_come_from_the_rounds_where_the_run_timed_side_by_side",
)
def report_latency_ratio_ignores_rounds(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        latency,
        "latency_ratio",
        lambda in_rounds, top, bottom: (top / bottom if top and bottom else None, None),
    )


@mutant(
    "the report's miss notes never name the kernels only the slower side runs",
    cpu=_REPORT + "test_a_miss_is_explained_by_both_sides_and_the_kernels_only_one_runs",
)
def report_hides_the_kernel_difference(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(profile, "kernels_only_in", lambda first, second, limit=3: [])


@mutant(
    "a latency table's implementations that were skipped or failed go unnamed, their n/a cells unexplained",
    cpu=_REPORT + "test_an_implementation_not_timed_is_named_with_its_reason_under_its_table",
)
def report_hides_what_was_not_timed(mp: pytest.MonkeyPatch) -> None:
    original = latency.latency_table

    def latency_table(r, model, dtype, worst):
        part = original(r, model, dtype, worst)
        part.lines = [line for line in part.lines if not line.startswith("Not timed")]
        return part

    mp.setattr(latency, "latency_table", latency_table)


@mutant(
    "the report says 'committed' for result files git does not track",
    cpu=_REPORT + "test_committed_only_where_git_tracks_the_result_files_unmodified",
)
def report_always_committed(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "result_files_source", lambda paths, results: "the committed result files")


@mutant(
    "a section with no numbers shows its method text, not 'not measured here'",
    cpu=_REPORT + "test_a_cpu_run_says_not_measured_here_for_every_gpu_section",
)
def report_unmeasured_as_method_text(mp: pytest.MonkeyPatch) -> None:
    def method_text(what, reason, heading=True, targets=()):
        return parts.Part([f"## {what}", "", "Median µs per forward, CUDA events.", ""])

    for section in {inspect.getmodule(s) for s in document.SECTIONS}:  # every section module that calls it
        if hasattr(section, "not_measured"):
            mp.setattr(section, "not_measured", method_text)


@mutant(
    "the reference core's code lines include docstrings (the core's size target)",
    cpu="suites/test_code_size.py::test_code_lines_leave_out_blanks_comments_and_docstrings",
)
def code_size_counts_docstrings(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(code_size, "docstring_lines", lambda source: set())


@mutant(
    "the start-up measurement leaves its temporary folder behind",
    cpu="suites/test_temp_folders.py::test_the_compile_benchmark_removes_its_folders_and_profiles_each_warm_start",
)
def warm_start_leaves_its_folder(mp: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def kept(prefix: str = "tmp", **_: object):
        yield tempfile.mkdtemp(prefix=prefix)

    mp.setattr(
        warm_start, "tempfile", types.SimpleNamespace(TemporaryDirectory=kept, mkdtemp=tempfile.mkdtemp)
    )


@mutant(
    "every model's start-up table reads ToyLlama's results",
    cpu=_REPORT + "test_each_started_model_has_its_own_table_from_its_own_results",
)
def report_starts_of_one_model(mp: pytest.MonkeyPatch) -> None:
    original = starts.model_starts
    mp.setattr(
        starts,
        "model_starts",
        lambda r, detail, benchmark, model: original(r, "compile", "compile.CompileStart", model),
    )


@mutant(
    "a negative host overhead per piece (the pieces timed alone took longer than the forward) is judged met",
    cpu=_REPORT + "test_a_negative_host_overhead_per_piece_is_shown_and_not_judged",
)
def report_judges_an_unresolved_overhead(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(host_overhead, "resolved", lambda overhead_us: True)


@mutant(
    "pytest-benchmark's file records git's HEAD only: a tree measured for another commit is left out",
    cpu=_REPORT + "test_the_suite_records_the_measured_commit_in_pytest_benchmarks_file",
)
def benchmark_file_without_the_measured_commit(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(provenance, "code_commit", lambda: None)


@mutant(
    "a benchmark this machine cannot run never names the machine that measured it at this commit",
    cpu=_REPORT + "test_a_benchmark_this_machine_cannot_run_points_to_the_machine_that_ran_it_at_this_commit",
)
def report_never_points_elsewhere(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(results, "measured_elsewhere", lambda root, machine, commit: {})


@mutant(
    "a benchmark this machine cannot run names a machine that measured it at another commit",
    cpu=_REPORT + "test_a_benchmark_this_machine_cannot_run_points_to_the_machine_that_ran_it_at_this_commit",
)
def report_points_to_another_commit(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        results,
        "measured_elsewhere",
        lambda root, machine, commit: {"latency_llama_8b_4l_tp2_bfloat16": "nvidia-h200"},
    )


@mutant(
    "the report leaves out the host that host-bound times ran on",
    cpu=_REPORT + "test_the_header_says_what_host_times_ran_on",
)
def report_without_host(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(document, "host_line", lambda host: "- host: recorded")


@mutant(
    "the new host's start is profiled on the warm host, whose Inductor cache is full",
    cpu="suites/test_temp_folders.py::test_the_compile_benchmark_removes_its_folders_and_profiles_each_warm_start",
)
def new_host_profiled_on_the_warm_host(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(warm_start, "PROFILED", {"warm": "host", "warm_new_host": "host"})


@mutant(
    "the user's-model start ignores $PIECEWORKS_MODEL_CONFIG and always starts the shipped tiny Qwen3",
    cpu="suites/test_temp_folders.py::test_the_user_model_starts_from_the_config_named_else_the_shipped_tiny_qwen3",
)
def user_model_ignores_the_config_named(mp: pytest.MonkeyPatch) -> None:
    import importlib
    from pathlib import Path

    from pieceworks.harness.models import hf_llama

    mp.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # as the benchmarks' tests import them
    compile_benchmark = importlib.import_module("benchmarks.compile")
    mp.setattr(
        compile_benchmark, "user_model", lambda: (str(hf_llama.CONFIGS / "tiny-qwen3.json"), "hf_tiny_qwen3")
    )


@mutant(
    "a missed pool target never says how the pool grows with the sizes",
    cpu=_REPORT + "test_a_pool_miss_says_how_the_pool_grows_with_the_sizes",
)
def report_hides_the_pool_growth(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(notes, "pool_note", lambda what, sizes: "")


_CONFIG_BENCH = (
    "suites/test_hf_models.py::"
    "test_the_serving_benchmark_takes_a_config_json_and_runs_on_a_cpu_up_to_where_cuda_is_needed"
)


@mutant("a user's model is named after its file's stem, not after what it is", cpu=_CONFIG_BENCH)
def user_model_named_by_its_file(mp: pytest.MonkeyPatch) -> None:
    import re
    from pathlib import Path

    import suites.benchmarks.serving as serving_benchmark

    mp.setattr(
        serving_benchmark, "config_name", lambda path: "hf_" + re.sub(r"\W+", "_", Path(path).stem).lower()
    )


@mutant("on a CPU the serving benchmark skips a config without building it", cpu=_CONFIG_BENCH)
def user_model_unchecked_on_a_cpu(mp: pytest.MonkeyPatch) -> None:
    import suites.benchmarks.serving as serving_benchmark

    mp.setattr(serving_benchmark, "cpu_check", lambda path: "built as a paged model on the CPU (not checked)")


@mutant(
    "the host-overhead report prints one number per cell, the range over rounds left out",
    cpu=_REPORT + "test_the_host_overhead_per_piece_shows_its_range_over_rounds",
)
def host_overhead_range_hidden(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(host_overhead, "with_range", lambda value, low, high: parts.fmt(value, 2))


@mutant(
    "a start-up table reads asv's tracks alone: a run made without asv (no git) reports its starts as not "
    "measured although its details file holds them",
    cpu=_REPORT + "test_start_up_tables_read_the_details_file_where_asv_recorded_no_run",
)
def starts_from_asv_alone(mp: pytest.MonkeyPatch) -> None:
    original = starts.model_starts

    def model_starts(r, detail, benchmark, model):
        if not any(name.startswith(f"{benchmark}.") for name in r.asv):  # no asv run: its details unread
            r = copy.copy(r)
            r.details = {k: v for k, v in r.details.items() if k != detail}
        return original(r, detail, benchmark, model)

    mp.setattr(starts, "model_starts", model_starts)
