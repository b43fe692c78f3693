#!/usr/bin/env bash
# The whole GPU benchmark run in one command: asv (latency, memory and capture, compile starts, CPU host overhead,
# dispatch), the pytest-benchmark host-overhead suite and the report, packed for committing.
#
#   OUT=<folder to bring back> bash ci/gpu_benchmarks.sh
#
# Offline (the lent H100): carry asv's and piecewise-cuda-graphs' wheels in .whl/, made here with
#   python3 -m pip download -d .whl asv==0.6.6 piecewise-cuda-graphs==0.1.0 --python-version 3.12 \
#     --only-binary=:all: --platform manylinux2014_x86_64 --platform any
# (installed from there when asv is missing). torch, Triton, matplotlib, nvidia-ml-py and pytest-benchmark must be
# installed already.
# Device calls of under 9 minutes each: PIECEWORKS_BENCH_PART=1 (latency: ToyLlama bf16 and fp32, then SillyModel
# if the deadline leaves its SILLY_S) then PIECEWORKS_BENCH_PART=2 (memory and capture, compile starts,
# pytest-benchmark host overhead, CPU benchmarks, SillyModel latency unless part 1 has it, report) on a tree where
# part 1's results.tar.gz was unpacked at the repository root: part 2 adds to the same asv result file (same commit,
# same machine). PIECEWORKS_BENCH_PART=3 (on part 2's tree): the runtime breakdown, every PIECEWISE and FULL variant
# and both peers side by side in rotating rounds (`python -m pieceworks.harness.runtime_breakdown`, about 4 min),
# written as $DETAILS/runtime_breakdown_<commit>.json, then the report again. On the lent H100 (2026-11-23) ToyLlama's latency took 375 s, which leaves SillyModel (174 s) to
# part 2, and part 2 with it may reach its deadline before SillyModel: the log says so, the exit status is 3, and a
# third call (PIECEWORKS_BENCH_PART=2 again, on the tree with part 2's tarball unpacked) runs only what is missing.
# Unset (or "all"): every step in one call (does not fit in 10 minutes).
# A deadline keeps each call inside its device call: PIECEWORKS_DEADLINE_S (default 500) seconds after the start,
# every step still to come is skipped (each asv step runs under `timeout` with what is left, and asv saves a step's
# results only when the step ends), and what exists is packed. To finish a cut-short run: unpack results.tar.gz at
# the repository root and run the same part again with PIECEWORKS_RESUME=1 (asv skips benchmarks that already have
# results for this commit).
# Output in $OUT (default results/gpu-run): results.tar.gz (results/asv and results/bench/<machine>: details,
# pytest-benchmark JSON, REPORT.md, plots), REPORT.md, gpu_benchmarks.log.
# Commit: PIECEWORKS_COMMIT, when set, is the commit results are stored under and reported as, whether or not a .git
# is here (a copied tree may carry a stale one); where the .git lacks that commit, asv records against a throw-away
# repository (outside this tree, through a temporary asv config) and results are moved to PIECEWORKS_COMMIT. Unset:
# `git rev-parse HEAD`. This tree's .git is never written.
# ASV_LAUNCH_METHOD overrides spawn. Exit status: 0, else the first failing step's.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
DEADLINE=${PIECEWORKS_DEADLINE_S:-500}
PART=${PIECEWORKS_BENCH_PART:-all}
case "$PART" in 1|2|3|all) ;; *) echo "PIECEWORKS_BENCH_PART must be 1, 2, 3 or all, not '$PART'"; exit 2 ;; esac
RESUME=${PIECEWORKS_RESUME:-}
[ "$PART" = 1 ] || [ "$PART" = all ] || RESUME=1  # parts 2 and 3 add to part 1's results
PY=${PYTHON:-python3}
OUT=${OUT:-results/gpu-run}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_benchmarks.log") 2>&1
export PYTHONUNBUFFERED=1
say() { echo "[gpu_benchmarks +$((SECONDS - START))s] $*"; }
status=0
fail() { [ "$status" -ne 0 ] || status=$1; }

if ! "$PY" -c "import asv" 2>/dev/null; then
  [ -d .whl ] || { say "asv is not installed and there is no .whl/ folder to install it from"; exit 2; }
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

export PIECEWORKS_BENCH_DIR=${PIECEWORKS_BENCH_DIR:-$(mktemp -d /tmp/pieceworks-bench-XXXXXX)}
COMMIT=
RENAME_TO=
ASV_CONFIG=()
if [ -n "${PIECEWORKS_COMMIT:-}" ]; then
  COMMIT=$(git rev-parse -q --verify "${PIECEWORKS_COMMIT}^{commit}" 2>/dev/null) || COMMIT=
elif ! COMMIT=$(git rev-parse -q --verify HEAD 2>/dev/null); then
  say "not a git checkout: set PIECEWORKS_COMMIT=<the commit this tree is>"; exit 2
fi
if [ -z "$COMMIT" ]; then
  say "this tree's .git (if any) lacks $PIECEWORKS_COMMIT: asv records against a throw-away repository; results go under $PIECEWORKS_COMMIT"
  REPO="$PIECEWORKS_BENCH_DIR/asv-repo"
  git -c init.defaultBranch=main init -q "$REPO" &&
    git -C "$REPO" -c user.name=bench -c user.email=bench@localhost commit -q --allow-empty -m "benchmark run" || exit 2
  COMMIT=$(git -C "$REPO" rev-parse HEAD)
  RENAME_TO=$PIECEWORKS_COMMIT
  CONF=.asv-throwaway.conf.json  # here, so that asv resolves the config's relative paths against this tree
  "$PY" - "$REPO" "$CONF" <<'PYEOF' || exit 2
import json, re, sys
text = re.sub(r"^\s*//.*$", "", open("asv.conf.json").read(), flags=re.M)
conf = json.loads(text)
conf["repo"] = sys.argv[1]
json.dump(conf, open(sys.argv[2], "w"), indent=1)
PYEOF
  ASV_CONFIG=(--config "$CONF")
  trap 'rm -f "$CONF"' EXIT
fi

DETAILS=results/bench/$MACHINE
mkdir -p "$DETAILS"
export PIECEWORKS_BENCH_DETAILS=$PWD/$DETAILS  # absolute: asv runs benchmarks in temporary folders
"$PY" -c "import sys; sys.path.insert(0, 'suites'); from benchmarks import _shared; _shared.write_details('environment', {})" &&
  cat "$DETAILS/environment.json"

left() { echo $((DEADLINE - (SECONDS - START))); }
rename_results() {  # rename_results FROM_COMMIT TO_COMMIT: move asv's result file, merging into one there
  "$PY" - "$MACHINE" "$1" "$2" <<'PYEOF'
import glob, json, os, sys
machine, old, new = sys.argv[1:]
for path in glob.glob(f"results/asv/{machine}/{old[:8]}-*.json"):
    doc = json.load(open(path))
    doc["commit_hash"] = new
    target = os.path.join(os.path.dirname(path), new[:8] + os.path.basename(path)[8:])
    if os.path.exists(target):  # an earlier step's results, already moved
        earlier = json.load(open(target))
        earlier["results"].update(doc["results"])
        earlier["durations"].update(doc.get("durations", {}))
        doc = earlier
    json.dump(doc, open(target, "w"))
    os.remove(path)
PYEOF
}
pack() {
  [ -z "$RENAME_TO" ] || rename_results "$COMMIT" "$RENAME_TO"
  tar czf "$OUT/results.tar.gz" results/asv "$DETAILS" 2>/dev/null
}
[ -z "$RENAME_TO" ] || [ -z "$RESUME" ] || rename_results "$RENAME_TO" "$COMMIT"  # resume: asv's view
step_asv() {  # step_asv MIN_SECONDS REGEX
  local budget
  budget=$(( $(left) - 30 ))  # 30 s kept for the report and packing
  if [ "$budget" -lt "$1" ]; then say "SKIPPED asv '$2': ${budget}s left before the deadline, it needs ~$1s"; fail 3; return; fi
  say "asv run --bench '$2' (machine $MACHINE, at most ${budget}s)"
  timeout "$budget" "$PY" -m asv run ${ASV_CONFIG[@]+"${ASV_CONFIG[@]}"} --python=same --set-commit-hash "$COMMIT" --machine "$MACHINE" \
    --launch-method "${ASV_LAUNCH_METHOD:-spawn}" --show-stderr ${RESUME:+--skip-existing-successful} \
    --bench "$2"
  local rc=$?
  [ "$rc" -ne 124 ] || say "TIMED OUT: asv '$2' did not finish before the deadline; its results are lost"
  [ "$rc" -eq 0 ] || fail "$rc"
  pack
}

in_part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
SILLY_S=180  # SillyModel latency, both dtypes, on the lent H100 (2026-11-23: 174 s)
say "part $PART (deadline ${DEADLINE}s)"
if in_part 1; then
  step_asv 120 '^latency\.ToyLlama'
  if [ "$PART" = 1 ] && [ $(( $(left) - 30 )) -lt "$SILLY_S" ]; then  # not a failure: part 2 runs it
    say "SillyModel latency left to part 2: ${SILLY_S}s needed, $(( $(left) - 30 ))s left"
  elif [ "$PART" = 1 ]; then
    step_asv "$SILLY_S" '^latency\.Silly'
  fi
fi
if in_part 2; then
  step_asv 60 '^memory\.'
  step_asv 60 '^compile\.'
  MEASURED=${RENAME_TO:-$COMMIT}  # the commit results are stored under
  if [ -n "$RESUME" ] && "$PY" - "$DETAILS/host_overhead.json" "$MEASURED" <<'PYEOF'
import json, sys
try:
    sys.exit(0 if json.load(open(sys.argv[1])).get("pieceworks_commit") == sys.argv[2] else 1)
except (OSError, ValueError):
    sys.exit(1)
PYEOF
  then
    say "pytest-benchmark host overhead: results of $MEASURED exist (resume)"
  elif [ "$(( $(left) - 30 ))" -ge 40 ]; then
    say "pytest-benchmark: host overhead (GPU and CPU variants)"
    rm -f "$DETAILS/host_overhead.json"  # a JSON carried from an earlier run must never pass for this one's
    timeout "$(( $(left) - 30 ))" "$PY" -m pytest suites/test_host_overhead.py -q -p no:cacheprovider \
      --benchmark-json "$DETAILS/host_overhead.json" || fail $?
    # the commit measured, for the report and for resuming (pytest-benchmark's commit_info reads whatever .git is
    # here, which on a copied tree may be a stale one); a JSON exists only where pytest got to write one
    [ ! -s "$DETAILS/host_overhead.json" ] || "$PY" - "$DETAILS/host_overhead.json" "$MEASURED" <<'PYEOF' || fail $?
import json, sys
doc = json.load(open(sys.argv[1]))
doc["pieceworks_commit"] = sys.argv[2]
json.dump(doc, open(sys.argv[1], "w"), indent=4)
PYEOF
  else
    say "SKIPPED pytest-benchmark host overhead: too little time left"; fail 3
  fi
  step_asv 20 '^(host_overhead|dispatch|code_size)\.'
  step_asv "$SILLY_S" '^latency\.Silly'  # asv skips it (resuming) where part 1 had time for it
fi
if in_part 3; then
  BREAKDOWN=$DETAILS/runtime_breakdown_$(printf %.7s "${RENAME_TO:-$COMMIT}").json
  if [ "$(( $(left) - 30 ))" -ge 240 ]; then
    say "runtime breakdown, side by side in rotating rounds -> $BREAKDOWN"
    rm -f "$BREAKDOWN"  # never pass an older run's file for this one's
    PIECEWORKS_COMMIT=${RENAME_TO:-$COMMIT} timeout "$(( $(left) - 30 ))" "$PY" -m pieceworks.harness.runtime_breakdown \
      --out "$BREAKDOWN" || fail $?
  else
    say "SKIPPED runtime breakdown: $(( $(left) - 30 ))s left before the deadline, it needs ~240s"; fail 3
  fi
fi
if in_part 2 || in_part 3; then
  say "report"
  [ -z "$RENAME_TO" ] || rename_results "$COMMIT" "$RENAME_TO"  # the report names the commit measured
  "$PY" -m pieceworks.harness.report --machine "$MACHINE" || fail $?
  cp "$DETAILS/REPORT.md" "$OUT/REPORT.md" 2>/dev/null
fi
pack
say "packed $OUT/results.tar.gz ($(du -h "$OUT/results.tar.gz" | cut -f1)); exit status $status"
exit "$status"
