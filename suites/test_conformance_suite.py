"""The conformance suite end to end, on a CPU, as a user runs it: `pytest -p pieceworks.conformance.plugin --pyargs
pieceworks.conformance` from another directory, with adapters from a file of the user's (`--impl
path/to/file.py:Class`), then the table.

The user's file holds two adapters that pad on the CPU (eager model on static buffers): `Padding`, correct, and
`Uncut`, which forgets to cut outputs back to the batch. The run must pass Padding's applicable properties, fail
Uncut's with a minimal example, report every other property as not applicable with the reason, write the JSON,
and the table must show all of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pieceworks.conformance import table as conformance_table

ADAPTERS = textwrap.dedent('''
    import bisect

    import torch

    from pieceworks.harness.implementations import Built, Capabilities, Implementation


    class Padding(Implementation):
        """Pads each batch to the next capture size in static buffers and runs the eager model there."""

        name = "user-padding"
        capabilities = Capabilities(padding=True)
        cut = True

        def build(self, model, make_inputs, capture_sizes, splitting_ops):
            sizes = sorted(capture_sizes)
            static = [a.clone() for a in make_inputs(sizes[-1])]

            def serve(*args):
                batch = args[0].shape[0]
                i = bisect.bisect_left(sizes, batch)
                if i == len(sizes):
                    return model(*args)
                n = sizes[i]
                for buffer, a in zip(static, args):
                    buffer[:batch].copy_(a)
                out = model(*[s[:n] for s in static])
                return out[:batch] if self.cut else out

            return Built(serve)


    class Uncut(Padding):
        name = "user-uncut"
        cut = False
''')


def _start(early_processes, test, folder, *args, cuda_visible: str | None = None) -> None:
    """Start `test`'s conformance run as a user types it (the installed suite, from `folder`), with `args`."""
    env = {**os.environ, "PIECEWORKS_HYPOTHESIS_PROFILE": "ci"}
    if cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    early_processes.start(test, [sys.executable, "-m", "pytest", "-p", "pieceworks.conformance.plugin", "--pyargs",
                                 "pieceworks.conformance", "-q", "-p", "no:cacheprovider", *args],
                          env=env, cwd=folder, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def folders(early_processes, tmp_path_factory):
    """Every test's conformance run (a pytest process of its own: seconds, mostly imports), each in a folder of its
    own, all started together before the first test (conftest's EarlyProcesses). The folders, by test name."""
    folder = {test.__name__: tmp_path_factory.mktemp(test.__name__[5:35]) for test in (
        test_a_users_adapters_run_through_the_installed_suite_and_make_a_table,
        test_the_device_defaults_to_what_the_machine_has, test_a_run_in_which_nothing_ran_fails_saying_why,
        test_cuda_asked_for_without_cuda_is_a_usage_error_naming_the_fix)}

    test = test_a_users_adapters_run_through_the_installed_suite_and_make_a_table
    users = folder[test.__name__]
    (users / "my_adapters.py").write_text(ADAPTERS)
    _start(early_processes, test, users, "--conformance-device", "cpu", "--conformance-model", "silly",
           "--conformance-model", "toy-llama", "--impl", "my_adapters.py:Padding",
           "--impl", f"{users / 'my_adapters.py'}:Uncut", "--conformance-json", users / "run.json")

    test = test_the_device_defaults_to_what_the_machine_has
    _start(early_processes, test, folder[test.__name__], "--impl", "eager", "--conformance-model", "silly",
           "--conformance-json", folder[test.__name__] / "run.json", cuda_visible="")

    test = test_a_run_in_which_nothing_ran_fails_saying_why
    _start(early_processes, test, folder[test.__name__], "--impl", "reduce-overhead", "--conformance-model", "silly",
           "--conformance-device", "cpu")

    test = test_cuda_asked_for_without_cuda_is_a_usage_error_naming_the_fix
    _start(early_processes, test, folder[test.__name__], "--impl", "eager", "--conformance-model", "silly",
           "--conformance-device", "cuda", cuda_visible="")
    return folder


@pytest.fixture
def run(request, early_processes, folders) -> tuple[subprocess.CompletedProcess, Path]:
    """This test's conformance run, finished: its process and its folder."""
    (proc,) = early_processes.results(request.function)
    return proc, folders[request.function.__name__]


def test_a_users_adapters_run_through_the_installed_suite_and_make_a_table(run):
    proc, folder = run
    out = folder / "run.json"
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # Uncut fails, nothing else goes wrong
    assert "pieceworks conformance" in proc.stdout and "n/a: user-padding: does not claim" in proc.stdout
    document = json.loads(out.read_text())
    outcomes = {(r["impl"], r["model"], r["property"]): r for r in document["results"]}
    assert len(outcomes) == 2 * 2 * len(document["meta"]["properties"])
    for model in ["silly", "toy-llama"]:
        for prop in ["replay-matches-eager", "outputs-cut-to-batch", "poison-stays-in-its-rows"]:
            assert outcomes["user-padding", model, prop]["outcome"] == "pass", outcomes["user-padding", model, prop]
            failed = outcomes["user-uncut", model, prop]
            assert failed["outcome"] == "fail" and "shape" in failed["example"], failed
        moved = outcomes["user-padding", model, "moved-inputs-never-stale"]
        assert moved["outcome"] == "n/a" and "does not claim cuda_graphs" in moved["reason"]
    example = outcomes["user-uncut", "silly", "replay-matches-eager"]["example"]
    assert "example: test_replay_matches_eager" in example and "    sequence=[" in example and "served=" not in example
    table = conformance_table.render(document)
    assert "| user-padding | pass | pass | pass | n/a [" in table and "| user-uncut | **FAIL** |" in table
    assert "### user-uncut / toy-llama / outputs-cut-to-batch (fail)" in table


def test_the_device_defaults_to_what_the_machine_has(run):
    """No --conformance-device on a machine without CUDA (hidden here): the CPU properties run, and the JSON and
    the table name the device they ran on."""
    proc, folder = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    document = json.loads((folder / "run.json").read_text())
    assert document["meta"]["device"] == "cpu"
    assert [r["outcome"] for r in document["results"]].count("pass") >= 1
    assert conformance_table.render(document).startswith("# Conformance: cpu")


def test_a_run_in_which_nothing_ran_fails_saying_why(run):
    """Every selected test unavailable (reduce-overhead needs CUDA; the device is cpu): exit 1, not a green run."""
    proc, _ = run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "nothing was tested" in proc.stdout and "needs CUDA" in proc.stdout


def test_cuda_asked_for_without_cuda_is_a_usage_error_naming_the_fix(run):
    proc, _ = run
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]  # pytest's usage-error status
    assert "sees no CUDA device" in proc.stderr and "--conformance-device cpu" in proc.stderr
