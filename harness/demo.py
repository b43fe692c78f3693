"""The main job on a CPU-only machine: compile the toy model cold, then warm-start it from the cache, here and on a
"new host".

`python -m pieceworks.harness.demo` runs ToyLlama (12 layers) three times, each in a new process: cold (empty
pieceworks cache, empty Inductor cache), warm (same cache directory), and warm on a new host (the cache directory
copied to another path, and a process whose own Inductor cache is empty: only what the pieceworks cache carries
is there). It prints pieces, compiles, artifacts saved and loaded, the first call's seconds (trace + compile or
load) and its ratio to cold, and the largest error against eager. A warm start must compile nothing; the demo
exits non-zero if one does. Speed is reported, never asserted. `--profile DIR` writes a cProfile of each first
call (`python -m pstats DIR/warm-new-host.prof`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from .scenario import run_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--cache-dir", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", default=None, help="folder for cProfile files of each first call")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pieceworks-demo-", ignore_cleanup_errors=True) as work:
        return _run(args, work)


def _run(args: argparse.Namespace, work: str) -> int:
    """The three starts, with every folder the demo makes under `work` (the cache too, unless --cache-dir)."""
    cache_dir = args.cache_dir or os.path.join(work, "cache")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    print(f"pieceworks demo: ToyLlama, {args.layers} layers, {args.device}, cache in {cache_dir}")
    reports = {}
    for phase in ("cold", "warm", "warm-new-host"):
        root = cache_dir
        if phase == "warm-new-host":  # another machine: the cache directory copied over, nothing else
            root = os.path.join(work, "copied-cache")
            shutil.copytree(cache_dir, root)
        # Inductor's default cache lives under the temporary folder: emptied before each process, Inductor has
        # nothing of its own (the same path each time, as on a twin machine: Inductor's build commands name it);
        # TORCHINDUCTOR_CACHE_DIR unset lets pieceworks keep Inductor's cache inside its own.
        tmp = os.path.join(work, "tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        extra = ["--profile", os.path.join(args.profile, f"{phase}.prof")] if args.profile else []
        r = run_scenario("--model", "toy_llama", "--layers", str(args.layers), "--cache-dir", root,
                         "--batches", "1,7,64,300", "--device", args.device, *extra,
                         env={"TMPDIR": tmp}, unset=("TORCHINDUCTOR_CACHE_DIR",))
        reports[phase] = r
        c = r["counters"]
        ratio = r["first_call_s"] / reports["cold"]["first_call_s"]
        print(
            f"  {phase:>13}: first call {r['first_call_s']:6.2f} s ({ratio:4.0%} of cold) | pieces "
            f"{c['num_piecewise_graphs_seen']} ({c['num_piecewise_capturable_graphs_seen']} compiled, backend "
            f"compilations {c['num_backend_compilations']}) | Inductor compiles {c['num_inductor_compiles']} | "
            f"artifacts saved {c['num_compiled_artifacts_saved']}, loaded {c['num_compiled_artifacts_loaded']} | "
            f"max rel. error vs eager {r['max_rel_error']:.1e} | torch {r['torch']}"
        )
    kept = "" if args.cache_dir else " (temporary, removed at exit)"
    print(f"  cache directory: {reports['warm']['cache_dir']}{kept}")
    compiled = {p: r["counters"]["num_inductor_compiles"] for p, r in reports.items() if p != "cold"}
    if any(compiled.values()):
        print(f"FAIL: a warm start compiled pieces: {compiled}", file=sys.stderr)
        return 1
    print("  warm starts compiled nothing: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
