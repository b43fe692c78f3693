"""Property 7: a stateful test of the compile cache.

Rules: compile (cold or warm, cache on or off), damage an artifact, delete an artifact, damage or delete the
index, and a concurrent writer re-storing entries from another thread while a compile runs. Invariants, after
every step: the model's last result was right (`torch.testing.assert_close` with float32 tolerances, on inputs
seeded by hypothesis), and no entry loads unless its bytes are the ones the index vouches for.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode
from pieceworks.cache import CLAIM_FIELDS, CompileCache
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing import strategies as S

pytestmark = pytest.mark.inductor


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="pieceworks-machine-")
        self.enabled = True
        self.result_error: str | None = None
        self.cache_dir: str | None = None

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _cache(self) -> CompileCache | None:
        if self.cache_dir is None:
            return None
        root, key = os.path.split(self.cache_dir)
        return CompileCache(root, key)

    def _files(self) -> list[str]:
        if self.cache_dir is None:
            return []
        folder = os.path.join(self.cache_dir, "artifacts")
        return sorted(os.path.join(folder, f) for f in os.listdir(folder) if not f.startswith("."))

    def _compile_and_check(self, seed: int) -> None:
        torch._dynamo.reset()
        config = CompilationConfig(
            splitting_ops=["silly::attention"],
            cache_dir=self.root,
            cache_enabled=self.enabled,
            cudagraph_mode=CUDAGraphMode.NONE,
        )
        compiled = pieceworks.compile(models.SillyModel(), config)
        x = torch.randn(6, generator=torch.Generator().manual_seed(seed))
        try:
            torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
            self.result_error = None
        except AssertionError as exc:
            self.result_error = f"input {x.tolist()}: {exc}"
        if compiled.runtime.compiled.cache_dir is not None:
            self.cache_dir = compiled.runtime.compiled.cache_dir

    @rule(seed=st.integers(0, 2**32 - 1))
    def compile(self, seed) -> None:
        self._compile_and_check(seed)

    @rule()
    def toggle_cache(self) -> None:
        self.enabled = not self.enabled

    @precondition(lambda self: self.cache_dir is not None)
    @rule(which=st.integers(0, 10), damage=S.corruptions())
    def damage_artifact(self, which, damage) -> None:
        files = self._files()
        if files:
            path = files[which % len(files)]
            data = open(path, "rb").read()
            open(path, "wb").write(S.corrupt(data, damage))

    @precondition(lambda self: self.cache_dir is not None)
    @rule(which=st.integers(0, 10))
    def delete_artifact(self, which) -> None:
        files = self._files()
        if files:
            os.unlink(files[which % len(files)])

    @precondition(lambda self: self.cache_dir is not None)
    @rule(damage=st.one_of(st.none(), S.corruptions()))
    def damage_index(self, damage) -> None:
        path = os.path.join(self.cache_dir, "index.json")
        if not os.path.exists(path):
            return
        if damage is None:
            os.unlink(path)
        else:
            data = open(path, "rb").read()
            open(path, "wb").write(S.corrupt(data, damage))

    @precondition(lambda self: self.cache_dir is not None)
    @rule(seed=st.integers(0, 2**32 - 1))
    def concurrent_writer(self, seed) -> None:
        """Another writer re-stores every intact entry while this process compiles."""
        cache = self._cache()
        intact = {}
        for name, entry in cache.read_index().items():
            path = os.path.join(cache.artifact_dir, entry["file"])
            if os.path.exists(path):
                data = open(path, "rb").read()
                if hashlib.sha256(data).hexdigest() == entry["sha256"]:
                    intact[name] = (data, {k: entry[k] for k in CLAIM_FIELDS if k in entry})

        def write_all() -> None:
            other = self._cache()
            for name, (data, claim) in intact.items():
                other.store(name, lambda p, data=data: open(p, "wb").write(data), claim)

        writer = threading.Thread(target=write_all)
        writer.start()
        self._compile_and_check(seed)
        writer.join()

    @invariant()
    def result_is_right(self) -> None:
        assert self.result_error is None, self.result_error

    @invariant()
    def nothing_corrupt_loads(self) -> None:
        cache = self._cache()
        if cache is None:
            return
        for name, entry in cache.read_index().items():
            data = cache.load(name, lambda p: open(p, "rb").read())[0]
            if data is not None:
                assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]


CacheMachine.TestCase.settings = settings(
    max_examples=max(8, settings.default.max_examples // 10), stateful_step_count=6
)
test_cache_state_machine = CacheMachine.TestCase
