"""The conformance suite: one specification, any piecewise CUDA-graph implementation.

Run from anywhere: `pytest -p pieceworks.conformance.plugin --pyargs pieceworks.conformance [--impl NAME ...]
[--conformance-json PATH]`. Each property runs for every selected implementation (an adapter of
`pieceworks.harness.adapters`: a registered name, or your own as `package.module:Adapter` or
`path/to/file.py:Adapter`; `padded_runner.py` is the example docs/conformance.md shows) and every selected
model of `cases.py` (`--conformance-model`; default `subjects.DEFAULT_MODELS`: SillyModel, silly-inplace,
ToyLlama in float32 and in bfloat16, a tiny random-weight Hugging Face Llama and the paged-KV Llama; `all`
adds the closed-form tractable ToyLlama), on capture sizes and batch sequences drawn for the run from one seed
(`plan.py`; `run.py` reads the options). A property needing a capability the implementation does not claim
(`Capabilities`, `Implementation.contracts`) is reported "not applicable" with the reason; an implementation
or model that cannot run here is "unavailable" with the reason. The properties (their table names,
`subjects.PROPERTIES`) are in test_replay.py, test_padding.py, test_addresses.py, test_repeats.py,
test_writes.py, test_memory.py and test_compile_cache.py. `python -m pieceworks.conformance.table PATH` turns
the JSON into the table.
"""
