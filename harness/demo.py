"""The main job on a CPU-only machine: compile the toy model cold, then warm-start it from the cache.

`python -m pieceworks.harness.demo` runs ToyLlama (12 layers) twice, each time in a new process sharing one cache
directory, and prints what happened: pieces, compiles, artifacts saved and loaded, seconds, and the largest
error against eager. The second run must compile nothing; the demo exits non-zero if it does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from .scenario import run_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--cache-dir", default=None, help="default: a fresh temporary folder")
    args = parser.parse_args(argv)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="pieceworks-demo-")
    common = ["--model", "toy_llama", "--layers", str(args.layers), "--cache-dir", cache_dir, "--batches", "1,7,64,300"]
    print(f"pieceworks demo: ToyLlama, {args.layers} layers, cache in {cache_dir}")
    reports = {}
    # The cold run starts from an empty Inductor cache too, so it is really cold. Both runs share that Inductor
    # cache, as a deployment does: on a CPU, loaded artifacts carry kernel source, and Inductor's cache keeps the
    # built libraries (without it a warm start still runs the C++ compiler, though pieceworks compiles nothing).
    inductor_env = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="pieceworks-demo-inductor-")}
    for phase in ("cold", "warm"):
        r = run_scenario(*common, env=inductor_env)
        reports[phase] = r
        c = r["counters"]
        print(
            f"  {phase}: first call {r['first_call_s']:.2f} s | pieces {c['num_piecewise_graphs_seen']} "
            f"({c['num_piecewise_capturable_graphs_seen']} compiled) | Inductor compiles {c['num_inductor_compiles']}"
            f" | shared by identical pieces {c['num_shared_piece_compiles']} | artifacts saved "
            f"{c['num_compiled_artifacts_saved']}, loaded {c['num_compiled_artifacts_loaded']} | "
            f"max rel. error vs eager {r['max_rel_error']:.1e} | torch {r['torch']}"
        )
    print(f"  cache directory: {reports['warm']['cache_dir']}")
    warm = reports["warm"]["counters"]
    if warm["num_inductor_compiles"] != 0:
        print("FAIL: the warm start compiled", warm["num_inductor_compiles"], "pieces", file=sys.stderr)
        return 1
    print("  warm start compiled nothing: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
