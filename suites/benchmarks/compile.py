"""Start-up: cold, warm, and warm on a new host, each start in a fresh process: ToyLlama (12 layers) on any
machine, Llama-3.2-1B's shape and Llama-3.1-8B's, all 32 layers (bfloat16, the unified attention) on CUDA, and
a user's model on any machine:
the Hugging Face causal LM of the config.json $PIECEWORKS_MODEL_CONFIG names, else of the shipped tiny Qwen3,
called with keywords.

Runs on the machine's serving device (CUDA where torch sees it, else the CPU) through
`pieceworks.harness.measure.warm_start.measure` (its module doc says what each start is and what is recorded;
the same measurement runs alone as `python -m pieceworks.harness.measure.warm_start`). (Naming a
`TORCHINDUCTOR_CACHE_DIR` is the user's choice, which pieceworks leaves alone: a new host with an empty one
rebuilds every kernel, so every start here unsets it and keeps Inductor's default cache under its host's
`TMPDIR`.) On CUDA each start also estimates and then captures the 51 default sizes (PIECEWISE) after its
first call. Tracked: seconds of the first call, split into trace (outside the backend: Dynamo's trace, or
reading the serving record on a warm start), load (artifacts) and compile (Inductor); seconds of the capture
and of the whole process (imports included); Inductor compiles, artifacts loaded and Dynamo traces. Details
(`compile.json`, for the report): all of it (`compile_llama_1b.json` for the 1B, `compile_llama_8b.json` for
the 8B, `compile_user_model.json` for the user's model), with the estimated and the captured pool bytes, and
where each warm first call's host time goes (each warm start once more, under cProfile). Targets (report):
warm 0 compiles, 0 traces and <= 10% of cold, also on a new host."""

from __future__ import annotations

from . import _shared

SCENARIOS = ["cold", "warm", "warm_new_host"]  # pieceworks.harness.measure.warm_start.STARTS
LAYERS = 12


def measure(model: str = "toy_llama") -> dict:
    """Every start of `model` (`{"skip": reason}` for the 1B without CUDA, or a user's model without
    transformers), its details written. "hf": the config.json $PIECEWORKS_MODEL_CONFIG names, else the shipped
    tiny Qwen3 (harness/models/configs/tiny-qwen3.json)."""
    import torch

    from pieceworks.harness.measure.warm_start import measure as warm_start
    from pieceworks.harness.models import hf_llama

    device = "cuda" if torch.cuda.is_available() else "cpu"
    detail = {"toy_llama": "compile", "hf": "compile_user_model"}.get(model, f"compile_{model}")
    reason = {
        "llama_1b": device == "cpu" and _shared.cuda_skip_reason(),
        "llama_8b": device == "cpu" and _shared.cuda_skip_reason(),
        "hf": hf_llama.unavailable_reason(),
    }.get(model)
    if reason:
        _shared.write_details(detail, {"skip": reason})
        return {start: {"skip": reason} for start in SCENARIOS}
    config, name = user_model() if model == "hf" else (None, model)
    results = warm_start(
        device,
        LAYERS,
        capture=device == "cuda",
        profile=True,
        progress=_shared.progress,
        model=model,
        config=config,
    )
    _shared.write_details(
        detail,
        {
            "device": device,
            "model": name,
            "entries": results,
            **({"layers": LAYERS} if model == "toy_llama" else {}),
        },
    )
    return results


def user_model() -> tuple[str, str]:
    """(path, name) of the user's model: the config.json $PIECEWORKS_MODEL_CONFIG names
    (`serving.model_config`), else the shipped tiny Qwen3."""
    import os

    from pieceworks.harness.models import hf_llama

    from .serving import MODEL_CONFIG, config_name, model_config

    if os.environ.get(MODEL_CONFIG):
        return model_config()
    path = str(hf_llama.CONFIGS / "tiny-qwen3.json")
    return path, config_name(path)


class CompileStart:
    params = [SCENARIOS]
    param_names = ["start"]
    timeout = 900

    def setup_cache(self):
        return measure()

    def setup(self, cache, start):
        _shared.check(cache[start])

    def _reading(self, cache, start, key):
        if key not in cache[start]:
            raise _shared.Skip(f"{key} is read on CUDA only")
        return cache[start][key]


class CompileStartLlama1B(CompileStart):  # its own setup_cache: asv keys the cache by where it is defined
    timeout = 1800

    def setup_cache(self):
        return measure("llama_1b")


class CompileStartLlama8B(CompileStart):  # its own setup_cache: asv keys the cache by where it is defined
    timeout = 1800

    def setup_cache(self):
        return measure("llama_8b")


class CompileStartUserModel(CompileStart):  # its own setup_cache: asv keys the cache by where it is defined
    timeout = 1800

    def setup_cache(self):
        return measure("hf")


def _track(key: str, unit: str):
    def track(self, cache, start):
        return self._reading(cache, start, key)

    track.unit = unit
    return track


for _key, _unit in [
    ("first_call_seconds", "seconds"),
    ("trace_seconds", "seconds"),
    ("load_seconds", "seconds"),
    ("compile_seconds", "seconds"),
    ("capture_seconds", "seconds"),
    ("process_seconds", "seconds"),
    ("inductor_compiles", "compiles"),
    ("artifacts_loaded", "artifacts"),
    ("dynamo_traces", "traces"),
    ("kernel_rebuilds", "rebuilds"),
]:
    setattr(CompileStart, f"track_{_key}", _track(_key, _unit))  # CompileStartLlama1B inherits them
