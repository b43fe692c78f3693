"""The registry of implementations under test (pieceworks.harness.adapters).

CPU: names and capabilities of the built-ins, users' adapters by dotted path (module attribute, subclass or
instance; the environment variable the benchmarks read), a clear error for each bad path, the reasons an
implementation is unavailable, and that every adapter that runs on a CPU serves every batch size like the
eager model. GPU (`-m gpu`): the compiled and CUDA-graph adapters (Inductor, Meta pcg, reduce-overhead,
pieceworks) serve captured sizes, sizes between them (padded) and sizes above them like the eager model, and
report what they claim to.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from pieceworks.harness import adapters
from pieceworks.harness.adapters import Capabilities, Implementation, load_user_implementations, resolve
from pieceworks.harness.models import toy as models

BUILT_IN = [
    "eager",
    "inductor",
    "reduce-overhead",
    "pieceworks-none",
    "pieceworks-piecewise",
    "pieceworks-full",
    "pieceworks-full_and_piecewise",
    "meta-pcg",
    "breakable",
    "inductor-partition",
]


def test_built_in_names_and_capabilities():
    registry = adapters.IMPLEMENTATIONS
    assert set(BUILT_IN) <= set(registry)
    for name in BUILT_IN:
        impl = registry[name]
        assert isinstance(impl, Implementation) and impl.name == name
        caps = impl.capabilities
        assert not (caps.padding or caps.piecewise or caps.shared_pool) or caps.cuda_graphs, name
    for name in ["meta-pcg", "breakable", "inductor-partition"]:
        assert registry[name].capabilities.piecewise, name
    assert registry["meta-pcg"].capabilities.padding and registry["breakable"].capabilities.padding
    assert not registry["reduce-overhead"].capabilities.padding  # it records per size instead
    assert registry["pieceworks-piecewise"].capabilities.compile_cache


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's adapter module on sys.path: an Implementation subclass, an instance, and something else."""
    (tmp_path / "my_backend.py").write_text(
        textwrap.dedent("""
        from pieceworks.harness.adapters import Built, Capabilities, Implementation

        class Doubling(Implementation):
            name = "my-doubling"
            capabilities = Capabilities()

            def build(self, model, make_inputs, capture_sizes, splitting_ops):
                return Built(lambda *args: model(*args) * 2)

        INSTANCE = Doubling()
        INSTANCE.name = "my-instance"
        NOT_AN_ADAPTER = 42
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_backend", raising=False)
    monkeypatch.setattr(adapters, "IMPLEMENTATIONS", dict(adapters.IMPLEMENTATIONS))
    yield "my_backend"
    sys.modules.pop("my_backend", None)


def test_resolve_by_dotted_path(user_module):
    from_class = resolve(f"{user_module}:Doubling")
    assert type(from_class).__name__ == "Doubling" and from_class.name == "my-doubling"
    instance = resolve(f"{user_module}:INSTANCE")
    assert instance is sys.modules[user_module].INSTANCE
    built = from_class.build(models.SillyModel(), lambda b: (torch.zeros(b),), [1], [])
    torch.testing.assert_close(built(torch.zeros(3)), 2 * models.silly_model_expected(torch.zeros(3)))


def test_resolve_errors_name_the_problem(user_module):
    with pytest.raises(KeyError, match="registered: .*eager.*package.module:Adapter"):
        resolve("no-such-implementation")
    with pytest.raises(ImportError, match="cannot import module 'not_a_module_anywhere'"):
        resolve("not_a_module_anywhere:Adapter")
    with pytest.raises(AttributeError, match="has no attribute 'Missing'"):
        resolve(f"{user_module}:Missing")
    with pytest.raises(TypeError, match="is a int, not a pieceworks.harness.adapters.Implementation"):
        resolve(f"{user_module}:NOT_AN_ADAPTER")


def test_user_implementations_from_the_environment(user_module, monkeypatch):
    monkeypatch.setenv("PIECEWORKS_IMPLEMENTATIONS", f" {user_module}:Doubling , {user_module}:INSTANCE,")
    found = load_user_implementations()
    assert [impl.name for impl in found] == ["my-doubling", "my-instance"]
    assert adapters.IMPLEMENTATIONS["my-doubling"] is found[0]
    assert resolve("my-instance") is found[1]
    with pytest.raises(ValueError, match="'my_backend.Doubling' is not a 'package.module:Adapter' path"):
        load_user_implementations("my_backend.Doubling")


def test_unavailable_reasons(monkeypatch):
    for name, module in [("meta-pcg", "piecewise_cuda_graphs"), ("breakable", "breakable_cuda_graphs")]:
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
        reason = adapters.IMPLEMENTATIONS[name].unavailable_reason()
        assert reason is not None and module.replace("_", "-") in reason and "pip install" in reason
        monkeypatch.delitem(sys.modules, module)

    class NeedsCuda(Implementation):
        name = "needs-cuda"
        capabilities = Capabilities(needs_cuda=True)

    if torch.cuda.is_available():
        assert NeedsCuda().unavailable_reason() is None
    else:
        assert "needs CUDA" in NeedsCuda().unavailable_reason()
        assert "needs CUDA" in adapters.IMPLEMENTATIONS["reduce-overhead"].unavailable_reason()
    assert adapters.IMPLEMENTATIONS["eager"].unavailable_reason() is None


def _serves_like_eager(impl: Implementation, model, make_inputs, sizes, batches, atol=0.0) -> None:
    built = impl.build(model, make_inputs, sizes, models.SPLITTING_OPS)
    with torch.no_grad():
        for batch in batches:
            inputs = make_inputs(batch)
            got = built(*inputs).clone()
            want = model(*inputs)
            assert got.shape == want.shape, (impl.name, batch)
            scale = float(want.abs().max()) or 1.0
            assert float((got.float() - want.float()).abs().max()) <= atol * scale, (impl.name, batch)
    return built


@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
def test_cpu_adapters_serve_every_batch_like_eager(mode):
    """On a CPU the graph modes run without graphs: still every batch size, same numbers (eager compiler)."""
    config = models.ToyLlamaConfig(hidden_size=16, mlp_size=32, vocab_size=16, num_layers=2)
    torch.manual_seed(0)
    model = models.ToyLlama(config)
    make_inputs = lambda b: models.toy_llama_inputs(b, config, seed=b)  # noqa: E731
    impl = adapters.Pieceworks(mode, compiler="eager")
    assert impl.name == f"pieceworks-{mode.lower()}-eager"
    _serves_like_eager(impl, model, make_inputs, [1, 2, 4, 8], [1, 3, 8, 9, 2])
    _serves_like_eager(adapters.IMPLEMENTATIONS["eager"], model, make_inputs, [1], [1, 5])


def test_the_adapters_compile_count_is_what_the_build_compiled():
    """ToyLlama of 2 layers has 3 distinct compiled pieces (first layer, middle, last): every build with the
    eager compiler compiles them (3), and a model compiled twice counts each build's own compiles, not the
    process's."""
    config = models.ToyLlamaConfig(hidden_size=16, mlp_size=32, vocab_size=16, num_layers=2)
    make_inputs = lambda b: models.toy_llama_inputs(b, config, seed=b)  # noqa: E731
    impl = adapters.Pieceworks("NONE", compiler="eager")
    for _ in range(2):
        built = impl.build(models.ToyLlama(config), make_inputs, [1, 4], ["silly::attention"])
        assert built.compiles == 3, built.compiles


# ---- GPU: the CUDA-graph adapters --------------------------------------------------------------------------


def _cuda_llama(dtype=torch.float32):
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=2)
    model = models.ToyLlama(config).cuda().to(dtype)
    return model, lambda b: models.toy_llama_inputs(b, config, device="cuda", seed=b)


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["meta-pcg", "breakable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiler_free_peers_pad_and_serve_like_eager(name, dtype):
    impl = adapters.IMPLEMENTATIONS[name]
    reason = impl.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from pieceworks.harness.measure.memory import pool_bytes

    model, make_inputs = _cuda_llama(dtype)
    atol = 0.0 if dtype is torch.float32 else 2e-2
    built = _serves_like_eager(impl, model, make_inputs, [1, 4, 16], [16, 1, 3, 4, 9, 16, 17, 2], atol=atol)
    assert built.capture_order == [16, 4, 1]
    assert pool_bytes(built.pool) > 0 and built.capture_seconds > 0
    silly = _serves_like_eager(
        impl, models.SillyModel(), lambda b: (torch.randn(b, device="cuda"),), [8, 2], [8, 2, 1, 5, 9]
    )
    assert silly.capture_order == [8, 2]


@pytest.mark.gpu
@pytest.mark.inductor
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "name", ["inductor", "reduce-overhead", "inductor-partition", "pieceworks-piecewise", "pieceworks-full"]
)
def test_compiled_adapters_serve_like_eager(name, tmp_path):
    """(Inductor's adapter is tested here, on a GPU, to keep Inductor compiles out of the CPU suite.)"""
    impl = adapters.IMPLEMENTATIONS[name]
    if name.startswith("pieceworks"):
        impl = adapters.Pieceworks(impl.mode, cache_dir=str(tmp_path))
    model, make_inputs = _cuda_llama()
    padded = [1, 3, 4, 9] if impl.capabilities.padding else []
    built = _serves_like_eager(impl, model, make_inputs, [4, 16], [16, 4, *padded], atol=1e-4)
    if impl.capabilities.padding:
        assert built.capture_order == [16, 4]
