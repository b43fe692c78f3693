"""asv benchmark suites of pieceworks (asv.conf.json at the repository root points here).

One file per area: `latency` (GPU: implementation x batch size x dtype x model), `memory` (GPU: pool bytes,
allocator and NVML deltas, capture time vs number of captured sizes), `compile` (cold / warm / warm on a new
host, fresh processes, on the machine's device), `dispatch` and `host_overhead` (CPU). `_shared` holds what
they share. Expensive work runs once per class in `setup_cache`, which returns plain numbers; `track_` methods
look them up. No module here imports torch at import time, so asv's per-benchmark processes start fast and
never touch CUDA before a benchmark does.
"""
