#!/usr/bin/env bash
# The main job: set up (with the `bench` extra), run the benchmarks this machine can run, write the report.
#
#   bash ci/main.sh [asv run arguments, e.g. --quick, or --bench REGEX to select benchmarks]
#
# On a CPU machine: the CPU subset (compile cold / warm / warm on a new host of ToyLlama 12 layers, host overhead
# of the runtime, dispatch, code size), a few minutes; the GPU benchmarks need CUDA and are not selected. With
# CUDA: the whole asv suite, then the pytest-benchmark host-overhead suite and the runtime breakdown (PIECEWISE's
# parts and its peers side by side); with --bench, only the asv benchmarks selected. asv prints a line per
# benchmark as it goes and skips what already has a result for this commit, so running the same command again
# after an interruption measures only what is missing ($PIECEWORKS_MODEL_CONFIG set: nothing is skipped, and a CPU
# machine builds and serves that model once). Results: results/asv/<machine>/, details and the report in
# results/bench/<machine>/ (REPORT.md, plots/); git ignores them unless that machine's results are committed
# (.gitignore; `git add -f` to commit a new machine's). The machine is named after its GPU (e.g.
# nvidia-h100-80gb-hbm3), else after the host; PIECEWORKS_MACHINE overrides. The run's caches go to a temporary
# folder, removed at the end (or to $PIECEWORKS_BENCH_DIR, kept).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(PIECEWORKS_EXTRAS="test bench" bash ci/setup.sh)
# The commit measured: git's HEAD, else $PIECEWORKS_COMMIT (a copy of the tree whose checkout is not at its commit;
# asv needs that commit in the repository: fetch it first, e.g. from a `git bundle` of it)
COMMIT=${PIECEWORKS_COMMIT:-$(git rev-parse HEAD 2>/dev/null)} || true
[ -n "$COMMIT" ] || { echo "main: no git history here: set PIECEWORKS_COMMIT to the commit of this tree" >&2; exit 64; }
export PIECEWORKS_COMMIT=$COMMIT  # recorded in every details file: the report reads one commit's results
cuda=0
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" && cuda=1
MACHINE=${PIECEWORKS_MACHINE:-$("$PY" -c "
import re, socket, torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else socket.gethostname()
print(re.sub(r'[^A-Za-z0-9_.]+', '-', name.lower()).strip('-'))")}
"$PY" -m asv machine --yes --machine "$MACHINE" >/dev/null
selected=0
for arg in "$@"; do [ "$arg" != --bench ] && [ "${arg#--bench=}" = "$arg" ] || selected=1; done
if [ "$selected" = 1 ]; then
  selection=()
elif [ "$cuda" = 1 ]; then
  selection=(--bench .)
  echo "main: CUDA available: the whole benchmark suite"
elif [ -n "${PIECEWORKS_MODEL_CONFIG:-}" ]; then
  selection=(--bench '^(compile|host_overhead|dispatch|code_size)\.|^serving\.ModelConfig')
  echo "main: no CUDA: the CPU benchmarks, and $PIECEWORKS_MODEL_CONFIG built and served once on the CPU"
else
  selection=(--bench '^(compile|host_overhead|dispatch|code_size)\.')
  echo "main: no CUDA: the CPU benchmarks (compile, host overhead, dispatch, code size); GPU benchmarks need a GPU runner"
fi
# What already has a result for this commit is skipped (a run resumed after an interruption measures what is
# missing), but not where $PIECEWORKS_MODEL_CONFIG names a model: another model's result must not stand for it
skip=(--skip-existing-successful)
[ -z "${PIECEWORKS_MODEL_CONFIG:-}" ] || skip=()
export PIECEWORKS_BENCH_DETAILS=$PWD/results/bench/$MACHINE  # absolute: asv runs benchmarks in temporary folders
mkdir -p "$PIECEWORKS_BENCH_DETAILS"
"$PY" -c "import sys; sys.path.insert(0, 'suites'); from benchmarks import _shared; _shared.write_details('environment', {})"
if [ -z "${PIECEWORKS_BENCH_DIR:-}" ]; then
  PIECEWORKS_BENCH_DIR=$(mktemp -d "${TMPDIR:-/tmp}/pieceworks-bench-XXXXXX")
  trap 'rm -rf "$PIECEWORKS_BENCH_DIR"' EXIT
fi
export PIECEWORKS_BENCH_DIR
status=0
"$PY" -m asv run --python=same --set-commit-hash "$COMMIT" --machine "$MACHINE" --launch-method spawn \
  "${skip[@]}" "${selection[@]}" "$@" || status=$?
if [ "$cuda" = 1 ] && [ "$selected" = 0 ]; then
  "$PY" -m pytest suites/test_host_overhead.py -q -p no:cacheprovider \
    --benchmark-json "$PIECEWORKS_BENCH_DETAILS/host_overhead.json" || status=$?
  "$PY" -m pieceworks.harness.measure.side_by_side \
    --out "$PIECEWORKS_BENCH_DETAILS/runtime_breakdown_${COMMIT:0:7}.json" || status=$?
fi
"$PY" -m pieceworks.report --machine "$MACHINE"
echo "main: results in results/asv/$MACHINE, report in results/bench/$MACHINE/REPORT.md (exit status $status)"
exit "$status"
