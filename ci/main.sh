#!/usr/bin/env bash
# The main job: set up, then run the benchmarks. Everywhere: the cold/warm compile demo on ToyLlama (CPU).
# Where CUDA is available, also the CUDA-graph measurement, written to results/ (commit it with its device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
PY=${PYTHON:-python3}
"$PY" -m pieceworks.harness.demo "$@"
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  out="results/$(date -u +%F)_cudagraphs_$("$PY" -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))").json"
  "$PY" -m pieceworks.harness.measure_cudagraphs --out "$out"
  echo "main: wrote $out"
fi
