#!/usr/bin/env bash
# The GPU job: preflight -> pytest -m gpu -> benchmarks of base and head on this GPU, interleaved -> gate.
#
#   bash ci/gpu.sh --base REV|DIR [--head REV|DIR] [--rounds N] [--bench REGEX] [--out DIR] [--allow-busy]
#                  [--skip-tests] [--cpu]
#   bash ci/gpu.sh --prepare-base REV   write REV's tree to .gate/trees/base (to carry to a box without git history)
#
# base: the blessed baseline (a git revision, or a checkout folder); head: the change (default: this checkout).
# Both run head's asv suite (suites/benchmarks), one side at a time with its own code installed (editable) in the
# same environment, in the same benchmark order, rounds alternating base-head, head-base, ... so that slow drift
# of the GPU cancels out; each round's asv result file is kept, and the gate reads every round (median value,
# spread across rounds). The gate judges with base's ci/thresholds.json, so a change cannot loosen its own gate.
# asv needs commit hashes: a scratch repository .gate/repo holds one empty commit per side, named after it.
#
# --cpu: no preflight and no GPU tests: the same comparison of the CPU benchmarks (compile, cache, dispatch, host
# overhead) on a machine without a GPU, e.g. to try the flow.
# Environment: ci/setup.sh (the project venv; PIECEWORKS_WHEELHOUSE=DIR installs the pinned tools offline);
# PIECEWORKS_PREFLIGHT_ARGS adds preflight options (a runner with locked clocks: "--expect-sm-mhz MHZ").
# Writes to --out (default .gate/out): preflight.json, gpu-tests.log, bench.log, results.tar.gz (the rounds),
# gate.txt, gate.md (PR comment), manifest.json.
# Exit status: the gate's (0 pass, 1 regression, 2 incomplete), 75 when the preflight refuses a busy or
# throttled GPU, or the status of the step that failed (setup, preflight without a GPU, GPU tests, usage: 64).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GATE=$ROOT/.gate
log() { echo "gpu: $*" >&2; }
die() { status=$1; shift; echo "gpu: ERROR: $*" >&2; exit "$status"; }

BASE="" HEAD_SPEC=$ROOT ROUNDS=2 BENCH="" OUT=$GATE/out ALLOW_BUSY="" SKIP_TESTS=0 PREPARE="" CPU=0
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --head) HEAD_SPEC=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --bench) BENCH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --allow-busy) ALLOW_BUSY=--allow-busy; shift ;;
    --skip-tests) SKIP_TESTS=1; shift ;;
    --cpu) CPU=1; SKIP_TESTS=1; shift ;;
    --prepare-base) PREPARE=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die 64 "unknown argument $1 (see --help)" ;;
  esac
done

# tree SPEC NAME: a folder holding the project at SPEC (a folder as is, or a git revision written out with git archive)
tree() {
  local spec=$1 name=$2
  if [ -f "$spec/pyproject.toml" ]; then
    (cd "$spec" && pwd)
    return
  fi
  git -C "$ROOT" rev-parse --verify -q "$spec^{commit}" >/dev/null 2>&1 \
    || die 64 "$name '$spec' is neither a folder with pyproject.toml nor a git revision of $ROOT (no git history here? run 'bash ci/gpu.sh --prepare-base REV' where there is, and carry .gate/trees/base)"
  rm -rf "$GATE/trees/$name"
  mkdir -p "$GATE/trees/$name"
  git -C "$ROOT" archive "$spec" | tar -x -C "$GATE/trees/$name"
  echo "$GATE/trees/$name"
}

if [ -n "$PREPARE" ]; then
  dir=$(tree "$PREPARE" base)
  git -C "$ROOT" rev-parse "$PREPARE^{commit}" > "$dir/.gate-revision"
  log "wrote $PREPARE ($(cat "$dir/.gate-revision")) to $dir: carry it, then: bash ci/gpu.sh --base .gate/trees/base"
  exit 0
fi
[ -n "$BASE" ] || die 64 "--base REV|DIR is required (the blessed baseline)"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die 64 "--rounds takes a positive integer, got '$ROUNDS'"
command -v git >/dev/null || die 64 "git is needed (asv keys results by commit): install git on the runner"
mkdir -p "$OUT"
started=$(date -u +%FT%TZ)

log "1/5 set-up"
PY=$(PIECEWORKS_EXTRAS="test bench" bash "$ROOT/ci/setup.sh") || die $? "set-up failed (see above)"

if [ "$CPU" = 1 ]; then
  log "2/5 preflight skipped (--cpu)"
  MACHINE=cpu-$(uname -n | tr -c 'A-Za-z0-9._\n-' '-')
else
  log "2/5 preflight"
  pre=0
  # shellcheck disable=SC2086 # PIECEWORKS_PREFLIGHT_ARGS: the runner's policy, e.g. "--expect-sm-mhz 1755"
  "$PY" -m pieceworks.gate.preflight --out "$OUT/preflight.json" $ALLOW_BUSY ${PIECEWORKS_PREFLIGHT_ARGS:-} || pre=$?
  [ "$pre" -eq 0 ] || die "$pre" "preflight refused (exit $pre): no benchmarks on this GPU now (see $OUT/preflight.json)"
  MACHINE=$("$PY" -c 'import json, re, sys; g = json.load(open(sys.argv[1]))["gpu"]["name"]; print(re.sub(r"[^A-Za-z0-9._-]+", "-", g))' "$OUT/preflight.json")
fi

if [ "$SKIP_TESTS" = 0 ]; then
  log "3/5 pytest -m gpu"
  tests=0
  (cd "$ROOT" && "$PY" -m pytest suites -m gpu -q -p no:cacheprovider) > "$OUT/gpu-tests.log" 2>&1 || tests=$?
  tail -n 3 "$OUT/gpu-tests.log" >&2
  [ "$tests" -eq 0 ] || die "$tests" "GPU tests failed (exit $tests): no benchmarks (see $OUT/gpu-tests.log)"
else
  log "3/5 GPU tests skipped (--skip-tests)"
fi

log "4/5 benchmarks${BENCH:+ matching $BENCH}: base and head, $ROUNDS round(s), on $MACHINE"
BASE_TREE=$(tree "$BASE" base)
HEAD_TREE=$(tree "$HEAD_SPEC" head)
rm -rf "$GATE/repo" "$GATE/results" "$GATE/rounds" "$GATE/html" "$GATE/bench"
git init -q "$GATE/repo"
git -C "$GATE/repo" symbolic-ref HEAD refs/heads/gate
declare -A HASH TREE=([base]=$BASE_TREE [head]=$HEAD_TREE)
for side in base head; do
  label=$([ "$side" = base ] && echo "$BASE" || echo "$HEAD_SPEC")
  [ -f "${TREE[$side]}/.gate-revision" ] && label="$label ($(cat "${TREE[$side]}/.gate-revision"))"
  git -C "$GATE/repo" -c user.name=gate -c user.email=gate@localhost commit -q --allow-empty -m "$side: $label"
  HASH[$side]=$(git -C "$GATE/repo" rev-parse HEAD)
done
"$PY" - "$HEAD_TREE/asv.conf.json" "$GATE" "$HEAD_TREE" <<'PYEOF' || die 1 "cannot read $HEAD_TREE/asv.conf.json"
import json, os, sys
src, gate, head = sys.argv[1:]
text = open(src, encoding="utf-8").read()
try:
    import json5  # asv's own dependency: asv.conf.json may hold comments
    conf = json5.loads(text)
except ImportError:
    conf = json.loads(text)
conf.update(repo=os.path.join(gate, "repo"), dvcs="git", branches=["gate"], environment_type="existing",
            benchmark_dir=os.path.join(head, conf.get("benchmark_dir", "benchmarks")),
            results_dir=os.path.join(gate, "results"), html_dir=os.path.join(gate, "html"),
            env_dir=os.path.join(gate, "env"))
json.dump(conf, open(os.path.join(gate, "asv.conf.json"), "w"), indent=2)
PYEOF
CONF=$GATE/asv.conf.json
"$PY" -m asv machine --yes --machine "$MACHINE" --config "$CONF" >/dev/null
install_tree() { "$PY" -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e "$1" >&2; }
: > "$OUT/bench.log"
for round in $(seq 1 "$ROUNDS"); do
  order="base head"
  [ $((round % 2)) -eq 0 ] && order="head base"
  for side in $order; do
    log "round $round/$ROUNDS: $side (${TREE[$side]})"
    install_tree "${TREE[$side]}"
    echo "=== round $round: $side ${TREE[$side]} ===" >> "$OUT/bench.log"
    # Each side its own compile caches (pieceworks', Inductor's): the key covers graphs, config and software,
    # not pieceworks' own code, so a shared cache would let head replay what base compiled.
    mkdir -p "$GATE/bench/$side"
    (cd "$HEAD_TREE" && PYTHONUNBUFFERED=1 PIECEWORKS_BENCH_DIR="$GATE/bench/$side" \
      "$PY" -m asv run --config "$CONF" --python=same \
      --set-commit-hash "${HASH[$side]}" --machine "$MACHINE" --launch-method spawn --show-stderr \
      ${BENCH:+--bench "$BENCH"}) >> "$OUT/bench.log" 2>&1 \
      || log "asv reported failures for $side in round $round (the gate lists them; see bench.log)"
    mkdir -p "$GATE/rounds/$side/$MACHINE"
    found=("$GATE/results/$MACHINE/${HASH[$side]:0:8}-"*.json)
    [ -f "${found[0]}" ] || die 1 "asv wrote no results for $side in round $round (see $OUT/bench.log)"
    mv "${found[0]}" "$GATE/rounds/$side/$MACHINE/round-$round.json"
    cp "$GATE/results/benchmarks.json" "$GATE/rounds/$side/benchmarks.json"
  done
done
install_tree "$HEAD_TREE"  # leave the environment on head
tar -czf "$OUT/results.tar.gz" -C "$GATE" rounds

log "5/5 gate"
thresholds=$BASE_TREE/ci/thresholds.json
[ -f "$thresholds" ] || { thresholds=$HEAD_TREE/ci/thresholds.json; log "base has no ci/thresholds.json: using head's"; }
gate=0
"$PY" -m pieceworks.gate --base "$GATE/rounds/base/$MACHINE" --head "$GATE/rounds/head/$MACHINE" \
  --thresholds "$thresholds" --markdown "$OUT/gate.md" --base-label "$BASE" --head-label "$HEAD_SPEC" \
  > "$OUT/gate.txt" || gate=$?
cat "$OUT/gate.txt"
"$PY" - "$OUT/manifest.json" "$started" "$MACHINE" "$BASE" "$HEAD_SPEC" "$BASE_TREE" "$HEAD_TREE" "$ROUNDS" \
  "$BENCH" "$thresholds" "$gate" "${HASH[base]}" "${HASH[head]}" <<'PYEOF'
import json, sys
keys = ["started", "machine", "base", "head", "base_tree", "head_tree", "rounds", "bench", "thresholds",
        "gate_exit_status", "asv_commit_base", "asv_commit_head"]
record = dict(zip(keys, sys.argv[2:]))
record["rounds"], record["gate_exit_status"] = int(record["rounds"]), int(record["gate_exit_status"])
json.dump(record, open(sys.argv[1], "w"), indent=2)
PYEOF
log "gate exit status $gate (0 pass, 1 regression, 2 incomplete); files in $OUT"
exit "$gate"
