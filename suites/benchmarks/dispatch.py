"""Dispatch on a CPU: the per-batch decisions a call makes before any kernel runs (pure Python, no torch
work).

- padding: the smallest of vLLM's 51 capture sizes >= the batch, for every batch 1..600 (above 512: none);
- compile dispatch: the exact compile size, else the compile range holding the batch, for every batch 1..600,
  with compile sizes [1, 2, 4, 8] and range endpoints [16, 64, 256] up to 8192.
asv times each over the whole sweep (one call = 600 decisions).
"""

from __future__ import annotations

BATCHES = range(1, 601)


class Dispatch:
    rounds = 1
    repeat = (3, 10, 5.0)

    def setup(self):
        from pieceworks import CompilationConfig, default_capture_sizes
        from pieceworks.core import compile_target, padded_size

        self.sizes = default_capture_sizes(512)
        self.padded_size = padded_size
        self.compile_target = compile_target
        config = CompilationConfig(compile_ranges=[16, 64, 256], compile_sizes=[1, 2, 4, 8])
        self.compile_sizes = config.compile_sizes
        self.ranges = config.ranges()

    def time_padded_size_sweep(self):
        padded, sizes = self.padded_size, self.sizes
        for b in BATCHES:
            padded(sizes, b)

    def time_compile_target_sweep(self):
        target, sizes, ranges = self.compile_target, self.compile_sizes, self.ranges
        for b in BATCHES:
            target(sizes, ranges, b)
