#!/usr/bin/env bash
# The test command: set up, then run the suites. Extra arguments go to pytest (e.g. `-m gpu` on a GPU runner).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m pytest suites "$@"
