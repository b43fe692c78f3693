"""The compile cache: warm starts in new processes (on a new host too), corruption, swapped entries,
concurrent cold processes, keys, the index format, and Inductor options that really reach the compiler."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import pieceworks
from pieceworks import CompilationConfig, counters
from pieceworks.cache import CacheIndexError, CompileCache, parse_index, serialize_index
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing.scenario import run_scenario

pytestmark = pytest.mark.inductor


def _artifacts(cache_dir):
    (key_dir,) = [
        os.path.join(cache_dir, d)
        for d in os.listdir(cache_dir)
        if d != "inductor" and not d.startswith("model-")
    ]
    index = parse_index(open(os.path.join(key_dir, "index.json"), "rb").read())
    return key_dir, index


def _libraries(folder):
    """Every shared library under `folder` (the kernels and ISA probes Inductor builds on a CPU)."""
    return {
        os.path.relpath(os.path.join(d, f), folder)
        for d, _, files in os.walk(folder)
        for f in files
        if f.endswith(".so")
    }


def _compile_silly(cache_dir, **kwargs):
    torch._dynamo.reset()
    config = CompilationConfig(splitting_ops=models.SPLITTING_OPS, cache_dir=str(cache_dir), **kwargs)
    compiled = pieceworks.compile(models.SillyModel(), config)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
    return compiled


def _scenario(*args) -> list[str]:
    """The command line of a compile-and-run scenario in a process of its own
    (pieceworks.harness.testing.scenario)."""
    return [sys.executable, "-m", "pieceworks.harness.testing.scenario", *map(str, args)]


def _report(proc) -> dict:
    """The report a scenario process printed last, once it succeeded."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


WARM_START = ("--model", "toy_llama", "--layers", "3", "--batches", "1,5,70")


@pytest.fixture(scope="module", autouse=True)
def warm_start_root(early_processes, tmp_path_factory):
    """The warm-start test's folder, its cold run started there before this module's first test (conftest's
    EarlyProcesses): a cold Inductor builds its kernel libraries, most of this module's time, while the
    in-process tests run."""
    root = tmp_path_factory.mktemp("warm-start")
    (root / "cold-tmp").mkdir()  # Inductor's default cache folder is below $TMPDIR: an empty one
    args, kwargs = _cold(root)
    early_processes.start(test_warm_start_on_a_new_host_compiles_and_builds_nothing, args, **kwargs)
    return root


def _cold(root):
    """The cold run's command line and environment: TORCHINDUCTOR_CACHE_DIR left unset (pieceworks keeps
    Inductor's cache inside its own), an empty $TMPDIR (Inductor's default cache folder is below it)."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"},
        "TMPDIR": str(root / "cold-tmp"),
    }
    return _scenario(*WARM_START, "--cache-dir", root / "cache"), {"env": env}


@pytest.fixture(scope="module")
def cold_run(warm_start_root, early_processes):
    """The report of the cold run `warm_start_root` started, once it has finished (its cache is then
    complete); run now where the test that starts it early is not selected."""
    test = test_warm_start_on_a_new_host_compiles_and_builds_nothing
    if early_processes.selected(test):
        (done,) = early_processes.results(test)
    else:
        args, kwargs = _cold(warm_start_root)
        done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    return _report(done)


def _torch_key() -> bytes:
    from torch._inductor.codecache import torch_key  # only to forge an artifact of "another build"

    return torch_key()


def _corrupt(path, how):
    data = open(path, "rb").read()
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "garbage":
        data = os.urandom(len(data))
    elif how == "empty":
        data = b""
    elif how == "flipped":
        data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
    elif how == "other_build":
        key = _torch_key()
        assert key in data
        data = data.replace(key, bytes(b ^ 0x5A for b in key))
    open(path, "wb").write(data)
    return data


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "flipped", "other_build"])
def test_corrupt_artifact_is_reported_and_recompiled(tmp_path, caplog, how):
    _compile_silly(tmp_path)
    key_dir, index = _artifacts(tmp_path)
    name, entry = sorted(index.items())[0]
    path = os.path.join(key_dir, "artifacts", entry["file"])
    data = _corrupt(path, how)
    if how == "other_build":  # consistent index, so that only the loader can object
        index[name] = {**entry, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        open(os.path.join(key_dir, "index.json"), "wb").write(serialize_index(index))
    caplog.set_level("WARNING", logger="pieceworks")
    with counters.expect(
        num_cache_artifacts_rejected=1,
        num_inductor_compiles=1,
        num_compiled_artifacts_loaded=2,
        num_compiled_artifacts_saved=1,
    ):
        _compile_silly(tmp_path)
    assert path in caplog.text and "recompiling" in caplog.text
    with counters.expect(
        num_cache_artifacts_rejected=0, num_inductor_compiles=0, num_compiled_artifacts_loaded=3
    ):
        _compile_silly(tmp_path)


def test_unreadable_index_is_logged_and_rebuilt(tmp_path, caplog):
    _compile_silly(tmp_path)
    key_dir, _ = _artifacts(tmp_path)
    open(os.path.join(key_dir, "index.json"), "wb").write(b"{not json")
    caplog.set_level("WARNING", logger="pieceworks")
    with counters.expect(num_inductor_compiles=3, num_compiled_artifacts_loaded=0):
        _compile_silly(tmp_path)
    assert caplog.text.count("index.json is unreadable") == 1, caplog.text  # one warning, not one per piece
    assert len(_artifacts(tmp_path)[1]) == 3


def test_disabled_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PIECEWORKS_DISABLE_CACHE", "1")
    with counters.expect(num_compiled_artifacts_saved=0, num_inductor_compiles=3):
        compiled = _compile_silly(tmp_path)
    assert compiled.runtime.compiled.cache_dir is None
    assert os.listdir(tmp_path) == []
    monkeypatch.delenv("PIECEWORKS_DISABLE_CACHE")
    with counters.expect(num_compiled_artifacts_saved=0, num_inductor_compiles=3):
        _compile_silly(tmp_path, cache_enabled=False)


def test_cache_key_changes_with_config_not_with_path(tmp_path):
    a = _compile_silly(tmp_path / "a").runtime.compiled.cache_dir
    b = _compile_silly(tmp_path / "b").runtime.compiled.cache_dir
    c = _compile_silly(tmp_path / "a", compile_ranges=[8]).runtime.compiled.cache_dir
    assert os.path.basename(a) == os.path.basename(b)
    assert os.path.basename(a) != os.path.basename(c)
    factors = json.load(open(os.path.join(a, "factors.json")))
    assert set(factors) == {"environment", "config", "inductor", "graph"}
    assert str(tmp_path) not in json.dumps(factors)


@pytest.mark.slow
def test_concurrent_cold_processes_share_the_work(tmp_path):
    """2 processes start one model on one empty cache at once: each entry is compiled by one of them (under
    that entry's lock) and loaded by the other; nothing is lost, torn or left behind."""
    procs = [
        subprocess.Popen(
            _scenario("--model", "silly", "--cache-dir", tmp_path, "--batches", "4,9"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["max_rel_error"] < 1e-6 for r in reports)
    compiles = sum(r["counters"]["num_inductor_compiles"] for r in reports)
    loads = sum(r["counters"]["num_compiled_artifacts_loaded"] for r in reports)
    assert (compiles, loads) == (3, 3), f"2 cold processes compiled {compiles} pieces and loaded {loads}"
    assert sum(r["counters"]["num_cache_artifacts_rejected"] for r in reports) == 0
    key_dir, index = _artifacts(tmp_path)
    assert len(index) == 3
    for entry in index.values():
        data = open(os.path.join(key_dir, "artifacts", entry["file"]), "rb").read()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    leftovers = [f for f in os.listdir(os.path.join(key_dir, "artifacts")) if f.startswith(".tmp")]
    assert leftovers == []
    with counters.expect(
        num_inductor_compiles=0, num_compiled_artifacts_loaded=3, num_cache_artifacts_rejected=0
    ):
        _compile_silly(tmp_path)


def test_index_format_is_strict_json(tmp_path):
    entries = {"range:1-8|abc": {"file": "x.bin", "sha256": "0" * 64, "bytes": 3}}
    assert parse_index(serialize_index(entries)) == entries
    for bad in [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"version": 99, "entries": {}}',
        b'{"version": 1, "entries": {"k": {"file": "../x", "sha256": "", "bytes": 1}}}',
        b'{"version": 1, "entries": {"k": {"file": "x", "sha256": 1, "bytes": 1}}}',
        serialize_index(entries).replace(b'"bytes": 3', b'"bytes": 4'),
    ]:
        with pytest.raises(CacheIndexError):
            parse_index(bad)


def test_unsaveable_artifact_is_logged_not_fatal(tmp_path, caplog):
    cache = CompileCache(str(tmp_path), "k")

    def fail(path):
        raise RuntimeError("nothing to save")

    caplog.set_level("WARNING", logger="pieceworks")
    assert cache.store("range:1-8|x", fail) is False
    assert "could not save" in caplog.text
    assert cache.read_index() == {}
    assert [f for f in os.listdir(cache.artifact_dir)] == []


class _ReluThenAttention(torch.nn.Module):
    def forward(self, x):
        h = torch.relu(x)
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, h, out)
        return out


def test_inductor_compile_config_reaches_the_generated_code(tmp_path):
    """A non-empty `inductor_compile_config` is applied by Inductor, not only hashed into the key: Inductor's
    own test switch `cpp.inject_relu_bug_TESTING_ONLY="accuracy"` makes its C++ relu compute `x + 1`, which
    shows in the output."""
    x = torch.linspace(-2, 2, 9)

    def run(options):
        torch._dynamo.reset()
        config = CompilationConfig(
            splitting_ops=["silly::attention"],
            cache_dir=str(tmp_path),
            inductor_compile_config=options,
            cudagraph_mode=pieceworks.CUDAGraphMode.NONE,
        )
        with counters.expect(num_inductor_compiles=1):
            return pieceworks.compile(_ReluThenAttention(), config)(x).clone()

    torch.testing.assert_close(run({}), 3 * torch.relu(x))
    torch.testing.assert_close(run({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}), 3 * (x + 1))


@pytest.mark.parametrize(
    "change, named",
    [
        ("config", "config.compile_sizes was [], is [4]"),
        ("inductor", "the global Inductor configuration (torch._inductor.config) changed"),
        ("torch", "environment.torch was '{torch}', is '9.9.9'"),
    ],
)
def test_a_compile_cache_miss_names_what_changed_in_its_key(tmp_path, monkeypatch, caplog, change, named):
    """The same graph compiled again under another compile-cache key (a config field, an Inductor option, the
    torch build): the log names the factor that differs from its newest entries'."""
    import pieceworks.key as key

    _compile_silly(tmp_path)
    caplog.set_level("INFO", logger="pieceworks")
    kwargs, patch = {}, contextlib.nullcontext()
    if change == "config":
        kwargs = {"compile_sizes": [4]}
    elif change == "inductor":
        patch = torch._inductor.config.patch(epilogue_fusion=not torch._inductor.config.epilogue_fusion)
    else:
        found = key.software_factors()
        monkeypatch.setattr(key, "software_factors", lambda: {**found, "torch": "9.9.9"})
    with patch:
        _compile_silly(tmp_path, **kwargs)
    assert (
        "compiling this graph again: its compile-cache key changed since its newest entries were stored: "
        + named.format(torch=torch.__version__)
    ) in caplog.text


def test_artifacts_load_in_this_process(tmp_path, monkeypatch):
    """A warm start loads each artifact with Inductor's compile_threads at 1 (no pool of compile workers
    started for kernels the artifact carries), and leaves the user's setting as it was."""
    config = torch._inductor.config
    _compile_silly(tmp_path)
    seen = []
    load = torch._inductor.CompiledArtifact.load

    def spy(*args, **kwargs):
        seen.append(config.compile_threads)
        return load(*args, **kwargs)

    monkeypatch.setattr(torch._inductor.CompiledArtifact, "load", staticmethod(spy))
    before = counters.snapshot()["num_compiled_artifacts_loaded"]
    with config.patch(compile_threads=3):  # the user's setting (config.patch: Inductor's own way to set it)
        _compile_silly(tmp_path)
        assert config.compile_threads == 3
    assert counters.snapshot()["num_compiled_artifacts_loaded"] > before, "the second compile loaded nothing"
    assert seen and set(seen) == {1}, f"artifacts loaded with compile_threads {seen}"


class _FakeIsa:
    """Inductor's `cpu_vec_isa` as `compiler.known_cpu_isa` reads it: `valid_vec_isa_list()` is what a load
    calls, and `probes` counts the probes it ran (each one builds and starts a process per ISA in
    Inductor)."""

    def __init__(self, passing=("avx512", "avx2")):
        self.supported_vec_isa_list, self.passing, self.probes = ["avx512", "avx2"], passing, 0
        self.valid_vec_isa_list = functools.cache(self._valid)

    def _valid(self):
        config = torch._inductor.config
        if config.cpp.vec_isa_ok:
            return list(self.supported_vec_isa_list)
        self.probes += 1
        return [isa for isa in self.supported_vec_isa_list if isa in self.passing]

    def x86_isa_checker(self):
        return ["avx512", "avx2"]


@pytest.mark.parametrize("recorded, skipped", [(None, False), (["avx512", "avx2"], True), (["avx2"], False)])
def test_the_cpu_isa_probe_is_skipped_only_where_a_passing_probe_of_this_cpu_is_recorded(
    tmp_path, monkeypatch, recorded, skipped
):
    """A load skips Inductor's CPU vector-ISA probe (about 1 s a process: builds and a subprocess per ISA)
    only where an earlier process recorded that the probe passed for every ISA this CPU's flags allow; a probe
    that runs is recorded for the next process; a user's `cpp.vec_isa_ok` is left alone."""
    import importlib
    import platform

    from pieceworks.compiler import known_cpu_isa

    record, fake = tmp_path / "cpu-isa.json", _FakeIsa()
    real_import = importlib.import_module
    monkeypatch.setattr(
        importlib,
        "import_module",
        lambda name, *a: fake if name == "torch._inductor.cpu_vec_isa" else real_import(name, *a),
    )
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    if recorded is not None:  # the record an earlier process left, under this CPU's and torch's key
        with known_cpu_isa(str(record)):
            fake.valid_vec_isa_list()
        data = json.loads(record.read_text())
        record.write_text(json.dumps({key: recorded for key in data}))
        fake = _FakeIsa()  # a new process
    with known_cpu_isa(str(record)):
        assert fake.valid_vec_isa_list()
    assert fake.probes == (0 if skipped else 1)
    assert list(json.loads(record.read_text()).values()) == [
        ["avx512", "avx2"]
    ]  # what the probe gave, or found
    fake = _FakeIsa()
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}), known_cpu_isa(str(record)):
        assert torch._inductor.config.cpp.vec_isa_ok is False  # the user's setting wins


def test_warm_start_on_a_new_host_compiles_and_builds_nothing(warm_start_root, cold_run):
    """Cold in one process; then the cache directory copied elsewhere (another host) and a new process with an
    empty Inductor cache of its own: nothing compiled, no kernel library built (the cache carries them), each
    distinct piece loaded once and shared by its identical twins."""
    root, cold = warm_start_root, cold_run
    shutil.copytree(root / "cache", root / "copied")
    carried = _libraries(root / "copied")
    tmp = root / "warm-tmp"  # the new host's $TMPDIR, empty: its Inductor has nothing
    tmp.mkdir()
    warm = run_scenario(
        *WARM_START,
        "--cache-dir",
        str(root / "copied"),
        env={"TMPDIR": str(tmp)},
        unset=("TORCHINDUCTOR_CACHE_DIR",),
    )
    c, w = cold["counters"], warm["counters"]
    # 4 compiled pieces: first, 2 identical middle ones, last: 3 distinct
    assert (
        c["num_inductor_compiles"],
        c["num_compiled_artifacts_saved"],
        c["num_shared_piece_compiles"],
    ) == (3, 3, 1)
    assert (
        w["num_inductor_compiles"],
        w["num_compiled_artifacts_loaded"],
        w["num_shared_piece_compiles"],
    ) == (0, 3, 1)
    assert w["num_kernel_rebuilds"] == 0
    # vLLM's meaning: one backend compilation per compiled piece and compile target, cold or warm
    assert c["num_backend_compilations"] == w["num_backend_compilations"] == 4
    # the warm start served from the model's serving record: no trace
    assert (
        c["num_dynamo_traces"],
        c["num_traces_reused"],
        w["num_dynamo_traces"],
        w["num_traces_reused"],
    ) == (1, 0, 0, 1)
    assert os.path.basename(warm["cache_dir"]) == os.path.basename(cold["cache_dir"])
    assert carried, "the cold run left no kernel library in the pieceworks cache"
    assert _libraries(root / "copied") == carried, "the warm start rebuilt kernels the cache carries"
    assert _libraries(tmp) == set(), "the warm start built libraries outside the cache"
    assert cold["max_rel_error"] < 1e-5 and warm["max_rel_error"] < 1e-5


@pytest.mark.slow
def test_a_warm_start_whose_kernels_inductor_lost_counts_their_rebuilds(warm_start_root, cold_run):
    """The pieceworks cache without Inductor's (`<cache>/inductor` removed): nothing compiled by pieceworks,
    but the kernels of each loaded artifact are built again, and the counters say so (one per distinct
    piece)."""
    root = warm_start_root
    shutil.copytree(root / "cache", root / "no-kernels")
    shutil.rmtree(root / "no-kernels" / "inductor")
    tmp = root / "no-kernels-tmp"
    tmp.mkdir()
    report = run_scenario(
        *WARM_START,
        "--cache-dir",
        str(root / "no-kernels"),
        env={"TMPDIR": str(tmp)},
        unset=("TORCHINDUCTOR_CACHE_DIR",),
    )
    warm = report["counters"]
    assert (
        warm["num_inductor_compiles"],
        warm["num_compiled_artifacts_loaded"],
        warm["num_kernel_rebuilds"],
    ) == (0, 3, 3)
    # the start's own log, as the start-up benchmark records it, says which artifacts' kernels were rebuilt
    assert sum("did not hold it" in line for line in report["first_call_log"]) == 3, report["first_call_log"]
