#!/usr/bin/env bash
# The lint command: set up (ci/setup.sh with the extras test and lint), then, over the whole repository with
# pyproject.toml's settings: `ruff check`, `ruff format --check` and mypy (ci/typecheck.py: the packages under their
# import names). CI runs it on the oldest Python pyproject claims (requires-python). Every check runs even after one
# has failed; each says its name, its command and its verdict. Exit 1 if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(PIECEWORKS_EXTRAS="test lint" bash ci/setup.sh)
for tool in ruff mypy; do
  "$PY" -c "import $tool" 2>/dev/null || {
    echo "lint: $tool is not installed in $PY (the lint extra; PIECEWORKS_WHEELHOUSE's set lacks it)" >&2
    exit 1
  }
done
echo "lint: $("$PY" -m ruff --version), $("$PY" -m mypy --version), Python $("$PY" -c 'import platform; print(platform.python_version())')"

failed=()
check() {  # check NAME COMMAND...
  local name=$1 start=$SECONDS status=0
  shift
  echo "lint: $name: $*"
  "$@" || status=$?
  if [ "$status" -eq 0 ]; then
    echo "lint: $name: ok ($((SECONDS - start)) s)"
  else
    echo "lint: $name: FAILED (exit $status, $((SECONDS - start)) s)"
    failed+=("$name")
  fi
}
check "ruff check" "$PY" -m ruff check --output-format concise .
check "ruff format" "$PY" -m ruff format --check .
check mypy "$PY" ci/typecheck.py

if [ "${#failed[@]}" -ne 0 ]; then
  echo "lint: failed: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
  exit 1
fi
echo "lint: all checks passed"
