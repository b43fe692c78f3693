#!/usr/bin/env bash
# The whole GPU benchmark run in one command: asv (latency, memory/capture, compile, CPU host overhead, dispatch),
# the pytest-benchmark host-overhead suite, and the report; everything packed for committing.
#
#   bash ci/gpu_benchmarks.sh [all|latency|rest]     (default all; OUT=folder for what to bring back)
#
# For a box without network (the lent H100): carry the wheels of asv and piecewise-cuda-graphs in .whl/ (made
# with `python3 -m pip download -d .whl asv==0.6.6 piecewise-cuda-graphs==0.1.0 --python-version 3.12
# --only-binary=:all: --platform manylinux2014_x86_64 --platform any`); they are installed from there when asv is
# missing. Torch, Triton, matplotlib, nvidia-ml-py and pytest-benchmark must already be installed.
# Parts: `latency` (the four latency classes) and `rest` (everything else, then the report) split the run into
# two commands of under 10 minutes each; for that, unpack the first part's results.tar.gz into the checkout
# before the second (asv then adds to the same result file, and the report sees both). `all` runs both parts.
# Output in $OUT (default results/gpu-run): results.tar.gz (results/asv and results/bench/<machine>, with the
# report and plots), REPORT.md, gpu_benchmarks.log. Without a git checkout (a copied tree), set PIECEWORKS_COMMIT
# to the commit the tree is: results are stored under it. Exit status: 0, or asv's/pytest's first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:-all}
PY=${PYTHON:-python3}
OUT=${OUT:-results/gpu-run}
mkdir -p "$OUT"
LOG=$OUT/gpu_benchmarks.log
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1
say() { echo "[gpu_benchmarks $(date -u +%H:%M:%S)] $*"; }
status=0

case "$PART" in all|latency|rest) ;; *) echo "usage: $0 [all|latency|rest]"; exit 2 ;; esac

if ! "$PY" -c "import asv" 2>/dev/null; then
  [ -d .whl ] || { echo "asv is not installed and there is no .whl/ folder of wheels to install it from"; exit 2; }
  say "installing asv and piecewise-cuda-graphs from .whl/ (offline)"
  "$PY" -m pip install -q --no-index --find-links .whl asv piecewise-cuda-graphs || exit 2
fi
if ! "$PY" -c "import pieceworks" 2>/dev/null; then
  say "installing pieceworks (editable, no dependencies)"
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || exit 2
fi

MACHINE=${PIECEWORKS_MACHINE:-$("$PY" - <<'PYEOF'
import re, socket, torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu-" + socket.gethostname()
print(re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"))
PYEOF
)}
"$PY" -m asv machine --yes --machine "$MACHINE" >/dev/null || exit 2

# The commit the results belong to. A tree copied without .git gets a throw-away repository for asv, and the
# result file is renamed to PIECEWORKS_COMMIT afterwards.
COMMIT=$(git rev-parse HEAD 2>/dev/null) || COMMIT=
RENAME_TO=
if [ -z "$COMMIT" ]; then
  [ -n "${PIECEWORKS_COMMIT:-}" ] || { echo "not a git checkout: set PIECEWORKS_COMMIT=<the commit this tree is>"; exit 2; }
  say "no git repository here: a throw-away one for asv; results go under $PIECEWORKS_COMMIT"
  git init -q . && git -c user.name=bench -c user.email=bench@localhost commit -q --allow-empty -m "benchmark run" || exit 2
  COMMIT=$(git rev-parse HEAD)
  RENAME_TO=$PIECEWORKS_COMMIT
fi

export PIECEWORKS_BENCH_DIR=${PIECEWORKS_BENCH_DIR:-$(mktemp -d /tmp/pieceworks-bench-XXXXXX)}
export PIECEWORKS_BENCH_DETAILS=results/bench/$MACHINE
mkdir -p "$PIECEWORKS_BENCH_DETAILS"
"$PY" - <<'PYEOF' || true
import sys; sys.path.insert(0, "suites")
from benchmarks._shared import environment
print("environment:", environment())
PYEOF

run_asv() {  # run_asv REGEX
  say "asv run --bench '$1' (machine $MACHINE, commit ${COMMIT:0:12}, launch method ${ASV_LAUNCH_METHOD:-spawn})"
  "$PY" -m asv run --python=same --set-commit-hash "$COMMIT" --machine "$MACHINE" \
    --launch-method "${ASV_LAUNCH_METHOD:-spawn}" --show-stderr --bench "$1" || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
  say "asv done"
}

if [ "$PART" != rest ]; then
  run_asv '^latency\.'
fi
if [ "$PART" != latency ]; then
  run_asv '^(memory|compile|host_overhead|dispatch)\.'
  say "pytest-benchmark: host overhead (GPU and CPU variants)"
  "$PY" -m pytest suites/test_host_overhead.py -q -p no:cacheprovider \
    --benchmark-json "$PIECEWORKS_BENCH_DETAILS/host_overhead.json" || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
fi

if [ -n "$RENAME_TO" ]; then
  "$PY" - "$MACHINE" "$COMMIT" "$RENAME_TO" <<'PYEOF'
import glob, json, os, sys
machine, old, new = sys.argv[1:]
for path in glob.glob(f"results/asv/{machine}/{old[:8]}-*.json"):
    doc = json.load(open(path))
    doc["commit_hash"] = new
    target = os.path.join(os.path.dirname(path), new[:8] + os.path.basename(path)[8:])
    json.dump(doc, open(target, "w"))
    os.remove(path)
    print("renamed", path, "->", target)
PYEOF
  rm -rf .git
fi

if [ "$PART" != latency ]; then
  say "report"
  "$PY" -m pieceworks.harness.report --machine "$MACHINE" || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
  cp "$PIECEWORKS_BENCH_DETAILS/REPORT.md" "$OUT/REPORT.md" 2>/dev/null || true
fi
tar czf "$OUT/results.tar.gz" results/asv "$PIECEWORKS_BENCH_DETAILS"
say "packed $OUT/results.tar.gz ($(du -h "$OUT/results.tar.gz" | cut -f1)); exit status $status"
exit "$status"
