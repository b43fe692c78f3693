"""The conformance suite end to end, on a CPU, as a user runs it:
`pytest -p pieceworks.conformance.plugin --pyargs pieceworks.conformance` from another directory, with
adapters from files of the user's (`--impl path/to/file.py:Class`), then the table.

- The padded runner of docs/conformance.md, copied from the page into a user's file, passes every property
  that applies to it on SillyModel, silly-inplace and ToyLlama; the rest are not applicable, with the reason.
- Each runtime of suites/planted_runtimes.py (that runner with one bug) fails the property it is planted for:
  one stale input row at batches 3, 6 and 7 fails replay-matches-eager, whatever capture sizes the seed draws
  (the sweep serves every batch up to just above the largest); the one-line verdict names the batches served
  and the rows that differ, and the example ends with the seed to replay it. The runtime that never copies
  argument writes back fails that property and nothing else.
- The seed: `--hypothesis-seed N` draws the sizes `Plan.draw(N)` draws; without it the derandomized `ci`
  profile uses seed 0; `--hypothesis-profile` and the size options reach the plan the header prints.
- A run in which nothing ran fails; a usage error (cuda without CUDA, an unknown implementation) is reported
  once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pieceworks.conformance import table as conformance_table
from pieceworks.conformance.plan import Plan
from suites.helpers import conformance_command, docs_adapter
from suites.planted_runtimes import PLANTED

REPO = Path(__file__).resolve().parent.parent
PLANTED_FILE = REPO / "suites" / "planted_runtimes.py"
SEED = 7


def _start(
    early_processes, test, folder, *args, cuda_visible: str | None = None, profile: str = "ci"
) -> None:
    """Start `test`'s conformance run as a user types it (the installed suite, from `folder`), with `args`,
    under hypothesis profile `profile`."""
    env = {**os.environ, "PIECEWORKS_HYPOTHESIS_PROFILE": profile}
    if cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    early_processes.start(test, conformance_command(*args), env=env, cwd=folder, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def folders(early_processes, tmp_path_factory):
    """Every test's conformance run (a pytest process of its own: seconds, mostly imports), each in a folder
    of its own, all started together before the first test (conftest's EarlyProcesses). The folders, by test
    name."""
    tests = (
        test_the_docs_padded_runner_passes_as_written,
        test_each_planted_bug_fails_its_property,
        test_the_device_defaults_to_what_the_machine_has,
        test_a_run_in_which_nothing_ran_fails_saying_why,
        test_cuda_asked_for_without_cuda_is_a_usage_error_naming_the_fix,
        test_a_usage_error_is_reported_once,
        test_the_seed_profile_and_size_options_reach_the_plan,
        test_a_run_drawing_its_seed_prints_the_seed_and_sizes_it_served,
    )
    folder = {test.__name__: tmp_path_factory.mktemp(test.__name__[5:35]) for test in tests}

    test = test_the_docs_padded_runner_passes_as_written
    (folder[test.__name__] / "my_adapter.py").write_text(docs_adapter())
    _start(
        early_processes,
        test,
        folder[test.__name__],
        "-q",
        "--conformance-device",
        "cpu",
        "--conformance-model",
        "silly",
        "--conformance-model",
        "silly-inplace",
        "--conformance-model",
        "toy-llama",
        "--impl",
        "my_adapter.py:PaddedRunner",
        "--conformance-json",
        folder[test.__name__] / "run.json",
    )

    test = test_each_planted_bug_fails_its_property
    impls = [arg for planted in PLANTED for arg in ("--impl", f"{PLANTED_FILE}:{planted.__name__}")]
    _start(
        early_processes,
        test,
        folder[test.__name__],
        "-q",
        "--conformance-model",
        "silly",
        "--conformance-model",
        "silly-inplace",
        "--conformance-model",
        "toy-llama-bf16",
        *impls,
        "--hypothesis-seed",
        str(SEED),
        "--conformance-json",
        folder[test.__name__] / "run.json",
    )

    test = test_the_device_defaults_to_what_the_machine_has
    _start(
        early_processes,
        test,
        folder[test.__name__],
        "-q",
        "--impl",
        "eager",
        "--conformance-model",
        "silly",
        "--conformance-json",
        folder[test.__name__] / "run.json",
        cuda_visible="",
    )

    test = test_a_run_in_which_nothing_ran_fails_saying_why
    _start(
        early_processes,
        test,
        folder[test.__name__],
        "-q",
        "--impl",
        "reduce-overhead",
        "--conformance-model",
        "silly",
        "--conformance-device",
        "cpu",
    )

    test = test_cuda_asked_for_without_cuda_is_a_usage_error_naming_the_fix
    _start(
        early_processes,
        test,
        folder[test.__name__],
        "-q",
        "--impl",
        "eager",
        "--conformance-model",
        "silly",
        "--conformance-device",
        "cuda",
        cuda_visible="",
    )

    test = test_a_usage_error_is_reported_once
    _start(early_processes, test, folder[test.__name__], "-q", "--impl", "no-such-runtime")

    test = test_the_seed_profile_and_size_options_reach_the_plan
    _start(
        early_processes,
        test,
        folder[test.__name__],
        "--collect-only",
        "--impl",
        "eager",
        "--hypothesis-seed",
        "3",
        "--hypothesis-profile",
        "nightly",
        "--conformance-max-size",
        "40",
        "--conformance-sizes",
        "6",
    )

    test = test_a_run_drawing_its_seed_prints_the_seed_and_sizes_it_served
    _start(
        early_processes,
        test,
        folder[test.__name__],
        *("--impl", "eager", "--conformance-model", "silly", "--conformance-device", "cpu"),
        *("--conformance-json", folder[test.__name__] / "run.json"),
        profile="dev",  # randomized: the run draws its seed
    )
    return folder


@pytest.fixture
def run(request, early_processes, folders) -> tuple[subprocess.CompletedProcess, Path]:
    """This test's conformance run, finished: its process and its folder."""
    (proc,) = early_processes.results(request.function)
    return proc, folders[request.function.__name__]


def _outcomes(folder: Path) -> tuple[dict, dict]:
    document = json.loads((folder / "run.json").read_text())
    return document, {(r["impl"], r["model"], r["property"]): r for r in document["results"]}


def test_the_docs_padded_runner_passes_as_written(run):
    proc, folder = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    document, outcomes = _outcomes(folder)
    assert len(outcomes) == 3 * len(document["meta"]["properties"])
    ran = {
        "replay-matches-eager",
        "outputs-cut-to-batch",
        "poison-stays-in-its-rows",
        "moved-inputs-never-stale",
        "repeats-give-fresh-outputs",
    }
    for (_, model, prop), result in outcomes.items():
        expected = (
            "pass"
            if prop in ran or (model, prop) == ("silly-inplace", "argument-writes-reach-the-caller")
            else "n/a"
        )
        assert result["outcome"] == expected, result
    assert (
        "runs the eager model on static buffers"
        in outcomes["padded-runner", "silly", "replays-grow-no-memory"]["reason"]
    )
    table = conformance_table.render(document)
    assert "| padded-runner | pass | pass | pass | pass | pass | n/a [" in table
    assert f"seed {document['meta']['seed']} (replay: --hypothesis-seed" in table


def test_each_planted_bug_fails_its_property(run):
    proc, folder = run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    document, outcomes = _outcomes(folder)
    assert document["meta"]["seed"] == SEED
    assert document["meta"]["capture_sizes"] == list(Plan.draw(SEED).capture_sizes)
    for planted in PLANTED:
        result = outcomes[planted.name, planted.caught_on, planted.caught_by]
        assert result["outcome"] == "fail", (planted.name, result)
        assert result["example"].endswith(f"replay: --hypothesis-seed {SEED}"), result["example"]
    others = {
        k: r["outcome"]
        for k, r in outcomes.items()
        if k[0] == "no-write-back" and k[2] != "argument-writes-reach-the-caller"
    }
    assert set(others.values()) == {"pass", "n/a"} and "pass" in others.values(), others

    stale = outcomes["stale-row", "silly", "replay-matches-eager"]
    assert re.fullmatch(
        r"call: batches \[[\d, ]*\b([367])\]: call \d+ \(batch \1\): output: rows \[\d+\] of \1 "
        r"differ from eager's \(largest difference \S+\)",
        stale["reason"],
    ), stale["reason"]
    uncut = outcomes["uncut", "silly", "outputs-cut-to-batch"]
    assert "shape" in uncut["reason"] and "explicit example: test_padded_outputs" in uncut["example"]
    assert "    sequence=[1, 2," in uncut["example"] and "served=" not in uncut["example"]
    for line in (
        f"FAIL: stale-row/silly/replay-matches-eager: {stale['reason']}",
        f"FAIL: uncut/silly/outputs-cut-to-batch: {uncut['reason']}",
    ):
        assert line in proc.stdout
    table = conformance_table.render(document)
    assert (
        "| stale-row | **FAIL** |" in table and "### no-write-back / silly-inplace / argument-writes" in table
    )


def test_the_device_defaults_to_what_the_machine_has(run):
    """No --conformance-device on a machine without CUDA (hidden here): the CPU properties run, and the JSON
    and the table name the device they ran on; no seed given, under the derandomized profile: seed 0."""
    proc, folder = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    document, outcomes = _outcomes(folder)
    assert document["meta"]["device"] == "cpu"
    assert document["meta"]["seed"] == 0 and document["meta"]["capture_sizes"] == list(
        Plan.draw(0).capture_sizes
    )
    assert [r["outcome"] for r in outcomes.values()].count("pass") >= 1
    assert conformance_table.render(document).startswith("# Conformance: cpu")
    assert "seed 0 (replay: --hypothesis-seed 0)" in proc.stdout


def test_a_run_drawing_its_seed_prints_the_seed_and_sizes_it_served(run):
    """The suite is reproducible from what it prints: the header's seed and capture sizes are the run's (its
    JSON's), also when pytest imports the suite's files under a second package name."""
    proc, folder = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    meta = _outcomes(folder)[0]["meta"]
    assert meta["capture_sizes"] == list(Plan.draw(meta["seed"]).capture_sizes)
    seed, sizes = meta["seed"], meta["capture_sizes"]
    printed = f"seed {seed} (replay: --hypothesis-seed {seed}), capture sizes {sizes}"
    assert printed in proc.stdout, proc.stdout[:2000]


def test_a_run_in_which_nothing_ran_fails_saying_why(run):
    """Every selected test unavailable (reduce-overhead needs CUDA; the device is cpu): exit 1, not a green
    run."""
    proc, _ = run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "nothing was tested" in proc.stdout and "needs CUDA" in proc.stdout


def test_cuda_asked_for_without_cuda_is_a_usage_error_naming_the_fix(run):
    proc, _ = run
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]  # pytest's usage-error status
    assert "sees no CUDA device" in proc.stderr and "--conformance-device cpu" in proc.stderr


def test_a_usage_error_is_reported_once(run):
    proc, _ = run
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert output.count("unknown implementation 'no-such-runtime'") == 1, output[-3000:]
    assert "Fix: pass one of those" in output and "error" not in proc.stdout.lower(), output[-3000:]


def test_the_seed_profile_and_size_options_reach_the_plan(run):
    proc, _ = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = Plan.draw(3, 40, 6)
    assert len(plan.capture_sizes) <= 6 and 8 <= max(plan.capture_sizes) <= 40
    assert (
        "pieceworks conformance: seed 3 (replay: --hypothesis-seed 3), "
        f"capture sizes {list(plan.capture_sizes)}," in proc.stdout
    ), proc.stdout[-3000:]
    assert "then 200 drawn sequences per property" in proc.stdout  # the nightly profile's 1000 examples / 5


def test_the_parts_of_a_run_split_by_impl_make_one_table():
    """A run too long for one job is split by --impl, a process per part: the table joins the parts' JSONs
    into the table the whole run gives (every implementation's rows, each part's command named), and refuses
    parts of different runs (another machine, torch or seed) or parts that overlap."""
    whole = json.loads((REPO / "results" / "conformance" / "nvidia-h200-single.json").read_text())
    impls = list(dict.fromkeys(r["impl"] for r in whole["results"]))
    assert len(impls) >= 2
    run = {k: v for k, v in whole.items() if k != "runs"}  # the committed run may itself be joined parts
    parts = [
        {
            **run,
            "argv": [*whole["argv"], "--impl", impl],
            "results": [r for r in whole["results"] if r["impl"] == impl],
        }
        for impl in impls
    ]
    joined = conformance_table.render(conformance_table.merge(parts))
    assert joined.split("\n")[3:] == conformance_table.render(whole).split("\n")[3:]
    assert all(f"--impl {impl}`" in joined.split("\n")[2] for impl in impls)
    other = {**parts[1], "meta": {**parts[1]["meta"], "torch": "2.99.0"}}
    with pytest.raises(ValueError, match="differ in torch"):
        conformance_table.merge([parts[0], other])
    with pytest.raises(ValueError, match="overlap"):
        conformance_table.merge([parts[0], parts[0]])
