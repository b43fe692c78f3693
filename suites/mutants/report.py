"""Mutants of what the project reports: the benchmark report, the code-size count and the warm-start command."""

from __future__ import annotations

import contextlib
import tempfile
import types

import pytest

import pieceworks.harness.code_size as code_size
import pieceworks.harness.profile as profile
import pieceworks.harness.report as report
import pieceworks.harness.warm_start as warm_start

from . import mutant

_REPORT = "suites/test_report.py::"


@mutant("a FULL miss in the side-by-side runs never says what FULL without the split measured",
        cpu=_REPORT + "test_side_by_side_runs_give_target_rows_and_say_what_the_split_costs")
def report_hides_what_the_split_costs(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "UNSPLIT", "not timed")


@mutant("the report leaves out warm_start runs: a warm-start miss of an older asv run stays unexplained",
        cpu=_REPORT + "test_warm_start_runs_get_a_table_and_say_where_their_first_call_went")
def report_hides_later_warm_starts(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "warm_start_runs", lambda r: ([], [], []))


@mutant("the report explains a missed target only from the latency run's own profiles, never both sides",
        cpu=_REPORT + "test_a_side_by_side_profile_explains_a_miss_the_latency_run_profiled_one_side_of")
def report_ignores_side_by_side_profiles(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "side_by_side_profile", lambda r, dtype, batch, impls: None)


@mutant("the compile table and the warm-start miss never split the first call into the backend's time and Dynamo's",
        cpu=_REPORT + "test_a_warm_start_miss_says_where_the_first_call_went")
def report_hides_where_the_first_call_went(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "first_call_parts", lambda entry, first_call: (None, None, None))


@mutant("a missed capture target never says what the first size and each further graph cost",
        cpu=_REPORT + "test_a_capture_miss_says_what_the_first_size_and_each_further_graph_cost")
def report_hides_the_capture_cost(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "capture_note", lambda r, mode: "")


@mutant("the latency tables and target rows divide one median by the other where the run timed both sides in "
        "rotating rounds", cpu=_REPORT + "test_latency_ratios_come_from_the_rounds_where_the_run_timed_side_by_side")
def report_latency_ratio_ignores_rounds(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "latency_ratio", lambda in_rounds, top, bottom: (top / bottom if top and bottom else None, None))


@mutant("the report's miss notes never name the kernels only the slower side runs",
        cpu=_REPORT + "test_a_miss_is_explained_by_both_sides_and_the_kernels_only_one_runs")
def report_hides_the_kernel_difference(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(profile, "kernels_only_in", lambda first, second, limit=3: [])


@mutant("the report says 'committed' for result files git does not track",
        cpu=_REPORT + "test_committed_only_where_git_tracks_the_result_files_unmodified")
def report_always_committed(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "result_files_source", lambda paths, results: "the committed result files")


@mutant("a section with no numbers shows its method text, not 'not measured here'",
        cpu=_REPORT + "test_a_cpu_run_says_not_measured_here_for_every_gpu_section")
def report_unmeasured_as_method_text(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(report, "not_measured", lambda title, reason: report.Part(
        [f"## {title}", "", "Median µs per forward, CUDA events.", ""]))


@mutant("the reference core's code lines include docstrings (the core's size target)",
        cpu="suites/test_code_size.py::test_code_lines_leave_out_blanks_comments_and_docstrings")
def code_size_counts_docstrings(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(code_size, "docstring_lines", lambda source: set())


@mutant("the warm-start command leaves its temporary folder behind",
        cpu="suites/test_temp_folders.py::test_the_warm_start_command_removes_its_folders")
def warm_start_leaves_its_folder(mp: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def kept(prefix: str = "tmp", **_: object):
        yield tempfile.mkdtemp(prefix=prefix)

    mp.setattr(warm_start, "tempfile", types.SimpleNamespace(TemporaryDirectory=kept, mkdtemp=tempfile.mkdtemp))
