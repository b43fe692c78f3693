"""Cache key sensitivity, complete.

Every factor that changes compiled code moves the key: the inputs' dtype, strides and device, the torch build
(version, git hash, CUDA), Triton, Python, the GPU, the effective global Inductor and functorch configuration,
and the config's code fields. Nothing per run moves it: the cache folder, Inductor's cache folder, the working
directory, Inductor's debug-trace output and compile threads, capture settings. Equal factors give equal keys
in another process with another working directory, temporary folder and hash seed.

Factors outside the graph are changed at their source (the attribute, module or function torch reports them
from), so the property tests that the key reads them, not that a dict is hashed.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import types
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pieceworks import CompilationConfig
from pieceworks.harness.testing import strategies as S
from pieceworks.key import cache_factors, cache_key
from pieceworks.split import split_graph
from suites.helpers import dynamo_graph

SPLIT = ["silly::attention", "silly::pair"]


def _bool_keys(module) -> list[str]:
    return sorted(
        k for k, v in module.save_config_portable().items() if isinstance(v, bool) and not k.isupper()
    )


INDUCTOR_KEYS = _bool_keys(torch._inductor.config)
FUNCTORCH_KEYS = _bool_keys(torch._functorch.config)


def _trace(program, dtype=torch.float32, layout="contiguous", device="cpu"):
    """Dynamo's graph of `program` plus `sin(x)` as an output, so that the graph reads `x` whatever the
    program."""
    module = S.ProgramModule(S.with_extra_output(program)).to(dtype)
    x, y = (t.to(dtype) for t in S.program_inputs(3))
    if layout == "transposed":  # same values, column-major strides
        x = x.t().contiguous().t()
    if device != "cpu":
        module, x, y = module.to(device), x.to(device), y.to(device)
    gm, _ = dynamo_graph(module, [x, y])
    return gm, [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]


def _key(traced, **config) -> str:
    """The key the backend computes for this graph: split, then the factors of the split graph and its
    pieces."""
    gm, fakes = traced
    config = CompilationConfig(**{"splitting_ops": SPLIT, **config})
    split_gm, pieces = split_graph(gm, config.splitting_ops)
    return cache_key(cache_factors(split_gm, fakes, [p.fingerprint for p in pieces], config))


@contextlib.contextmanager
def _fake_triton(version):
    module = types.ModuleType("triton")
    module.__version__ = version
    with mock.patch.dict(sys.modules, {"triton": module}):
        yield


@contextlib.contextmanager
def _fake_gpu(name):
    with (
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(torch.cuda, "current_device", lambda: 0),
        mock.patch.object(torch.cuda, "get_device_name", lambda i=None: name),
        mock.patch.object(torch.cuda, "get_device_capability", lambda i=None: (9, 0)),
    ):
        yield


@contextlib.contextmanager
def _chdir(path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


ENVIRONMENT = {  # factor -> a context in which it differs
    "torch version": lambda: mock.patch.object(torch, "__version__", "2.99.0+other"),
    "torch git hash": lambda: mock.patch.object(torch.version, "git_version", "0" * 40),
    "CUDA version": lambda: mock.patch.object(torch.version, "cuda", "99.9"),
    "Triton version": lambda: _fake_triton("9.9.9"),
    "Python version": lambda: mock.patch.object(platform, "python_version", lambda: "3.99.0"),
    "GPU": lambda: _fake_gpu("Some Other GPU"),
}
CONFIG = [
    {"splitting_ops": ["silly::attention"]},
    {"compile_ranges": [4]},
    {"compile_sizes": [2]},
    {"max_num_batched_tokens": 1024},
    {"compiler": "eager"},
    {"inductor_compile_config": {"max_autotune": True}},
]
PER_RUN_CONFIG = [
    {"cache_dir": "/elsewhere"},
    {"cudagraph_mode": "FULL"},
    {"cudagraph_capture_sizes": [1, 2]},
    {"cache_enabled": False},
    {"cudagraph_num_warmups": 3},
    {"lazy_capture": True},
]


def _per_run(tmp):
    return {
        "working directory": lambda: _chdir(tmp),
        "TORCHINDUCTOR_CACHE_DIR": lambda: mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": tmp}),
        "Inductor trace output": lambda: torch._inductor.config.patch(
            {"trace.enabled": True, "trace.debug_dir": tmp}
        ),
        "compile threads": lambda: torch._inductor.config.patch(compile_threads=1),
    }


@settings(max_examples=5)
@given(
    program=S.programs(max_len=5),
    inductor_key=st.sampled_from(INDUCTOR_KEYS),
    functorch_key=st.sampled_from(FUNCTORCH_KEYS),
)
def test_every_code_factor_moves_the_key_and_nothing_per_run_does(
    program, inductor_key, functorch_key, tmp_path_factory
):
    traced = _trace(program)
    base = _key(traced)
    assert _key(traced) == base
    moved = {
        "dtype": _key(_trace(program, dtype=torch.float64)),
        "strides": _key(_trace(program, layout="transposed")),
        "device": _key(_trace(program, device="meta")),
    }
    for name, differ in ENVIRONMENT.items():
        with differ():
            moved[name] = _key(traced)
    flipped = not getattr(torch._inductor.config, inductor_key)
    with torch._inductor.config.patch({inductor_key: flipped}):
        moved[f"torch._inductor.config.{inductor_key}"] = _key(traced)
    flipped = not getattr(torch._functorch.config, functorch_key)
    with torch._functorch.config.patch({functorch_key: flipped}):
        moved[f"torch._functorch.config.{functorch_key}"] = _key(traced)
    for change in CONFIG:
        moved[f"config {change}"] = _key(traced, **change)
    unmoved = [name for name, key in moved.items() if key == base]
    assert not unmoved, f"the cache key ignores {unmoved}"

    tmp = str(tmp_path_factory.mktemp("elsewhere"))
    for name, differ in _per_run(tmp).items():
        with differ():
            assert _key(traced) == base, f"the cache key changes with {name}"
    for change in PER_RUN_CONFIG:
        assert _key(traced, **change) == base, f"the cache key changes with {change}"


CHILD = """
import json, os, sys, torch
sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]  # suites/, and the repository root for suites.helpers
from test_cache_key import _key, _trace
for line in sys.stdin:  # a request per line: programs; a reply per line: the keys of each, float32 and float64
    out = []
    for program in json.loads(line):
        program = (tuple(tuple(i) for i in program[0]), tuple(program[1]))
        with torch.no_grad():
            out.append([_key(_trace(program)), _key(_trace(program, dtype=torch.float64))])
    print("keys: " + json.dumps(out), flush=True)
"""  # noqa: E501 - the child script's own comments: the string is kept as it is


@pytest.fixture(scope="module", autouse=True)
def keys_in_another_process(early_processes, tmp_path_factory):
    """Another interpreter, with another working directory, temporary folder and hash seed and no Inductor
    cache folder set, that computes the keys of the programs sent to it (`keys(programs)`). One for every
    example of the module, started before its first test (it takes seconds to import torch), and only when the
    pytest run includes the test that asks it."""
    if not early_processes.selected(test_equal_factors_give_equal_keys_in_another_process):
        yield None
        return
    elsewhere = tmp_path_factory.mktemp("child")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(
        PYTHONHASHSEED="random",
        TMPDIR=str(elsewhere),
        TORCHINDUCTOR_COMPILE_THREADS="1",
        PIECEWORKS_CACHE_DIR=str(elsewhere / "pieceworks-cache"),
    )
    with open(elsewhere / "stderr", "w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, os.path.dirname(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=elsewhere,
        )

        def keys(programs):
            try:
                proc.stdin.write(json.dumps(programs) + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # it ended: said below
            for line in proc.stdout:
                if line.startswith("keys: "):
                    return json.loads(line[len("keys: ") :])
            err.seek(0)
            raise AssertionError(
                f"the other process ended (exit status {proc.wait()}):\n{err.read()[-3000:]}"
            )

        yield keys
        try:
            proc.stdin.close()  # its end of input: it exits
            proc.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


@settings(max_examples=2)
@given(programs=st.lists(S.programs(max_len=5), min_size=2, max_size=2))
def test_equal_factors_give_equal_keys_in_another_process(programs, keys_in_another_process):
    here = [[_key(_trace(p)), _key(_trace(p, dtype=torch.float64))] for p in programs]
    assert keys_in_another_process(programs) == here
