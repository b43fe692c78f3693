#!/usr/bin/env bash
# The main job: set up (with the `bench` extra), run the asv benchmarks this machine can run, write the report.
#
#   bash ci/main.sh [extra asv run arguments, e.g. --quick]
#
# On a CPU machine: the CPU subset (compile cold / warm / warm on a new host of ToyLlama 12 layers, host overhead
# of the runtime, dispatch), a few minutes; the GPU benchmarks need CUDA and are not selected. With CUDA: the whole
# suite (on the lent GPU box use ci/gpu_benchmarks.sh: one command, results packed to bring back). asv prints a
# line per benchmark as it goes. Results: results/asv/<machine>/, details and the report in
# results/bench/<machine>/ (REPORT.md, plots/). PIECEWORKS_MACHINE names the machine (default: the host name).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(PIECEWORKS_EXTRAS="test bench" bash ci/setup.sh)
MACHINE=${PIECEWORKS_MACHINE:-$(hostname | tr -c 'A-Za-z0-9_.\n-' '-')}
"$PY" -m asv machine --yes --machine "$MACHINE" >/dev/null
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  selection='.'
  echo "main: CUDA available: the whole benchmark suite"
else
  selection='^(compile|host_overhead|dispatch|code_size)\.'
  echo "main: no CUDA: the CPU benchmarks (compile, host overhead, dispatch, code size); GPU benchmarks need a GPU runner"
fi
export PIECEWORKS_BENCH_DETAILS=$PWD/results/bench/$MACHINE  # absolute: asv runs benchmarks in temporary folders
mkdir -p "$PIECEWORKS_BENCH_DETAILS"
"$PY" -c "import sys; sys.path.insert(0, 'suites'); from benchmarks import _shared; _shared.write_details('environment', {})"
export PIECEWORKS_BENCH_DIR=${PIECEWORKS_BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/pieceworks-bench-XXXXXX")}
status=0
"$PY" -m asv run --python=same --set-commit-hash "$(git rev-parse HEAD)" --machine "$MACHINE" \
  --launch-method spawn --bench "$selection" "$@" || status=$?
"$PY" -m pieceworks.harness.report --machine "$MACHINE"
echo "main: results in results/asv/$MACHINE, report in results/bench/$MACHINE/REPORT.md (asv exit status $status)"
exit "$status"
