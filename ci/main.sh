#!/usr/bin/env bash
# The main job: set up, then run the benchmarks. On a CPU-only machine: the cold/warm compile demo on ToyLlama.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m pieceworks.harness.demo "$@"
