"""Padded CPU runtimes with one planted bug each: the conformance suite's own tests check that the property
named in each class's `caught_by` fails for it (and that the clean runner,
`pieceworks.conformance.padded_runner`, passes).

Each serves a batch as the clean runner does (static buffers of the largest capture size, padding, cut-back,
writes copied back), but for its `bug`:

- stale-row: at batches 3, 6 and 7 the last row is not copied in (the row of an earlier call is read instead);
- uncut: outputs are not cut back to the batch;
- same-tensors: nothing is copied in when the arguments are the tensors of the previous call (same address and
  shape), so an argument rewritten in place is served stale;
- last-output: a call of the previous call's batch size returns the previous call's outputs;
- no-write-back: what the model writes into its arguments stays in the static buffers;
- far-rows: a batch above 100 rows (far above every capture size) gets rows past 100 zeroed;
- float32: the model runs in float32 (a bfloat16 model's output comes back in float32).

`caught_on` names the suite model each is checked with.
"""

from __future__ import annotations

import copy

from pieceworks.conformance.padded_runner import PaddedRunner, cut
from pieceworks.harness.adapters import Built


class Planted(PaddedRunner):
    bug: str | None = None
    caught_by: str = ""
    caught_on = "silly"

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        model = copy.deepcopy(model).float() if self.bug == "float32" else model
        sizes = sorted(capture_sizes)
        static = [a.clone() for a in make_inputs(sizes[-1])]
        last: dict = {}

        def serve(*args):
            batch = args[0].shape[0]
            n = next((size for size in sizes if size >= batch), None)
            if n is None:
                out = model(*args)
                if self.bug == "far-rows" and batch > 100:
                    out[100:] = 0
                return out
            if self.bug == "last-output" and last.get("batch") == batch:
                return last["out"]
            key = [(a.data_ptr(), a.shape) for a in args]
            if not (self.bug == "same-tensors" and last.get("key") == key):
                rows = batch - 1 if self.bug == "stale-row" and batch in (3, 6, 7) else batch
                for buffer, a in zip(static, args):
                    buffer[:rows].copy_(a[:rows])
            out = model(*[buffer[:n] for buffer in static])
            if self.bug != "no-write-back":
                for buffer, a in zip(static, args):
                    a.copy_(buffer[:batch])
            last.update(batch=batch, key=key, out=out if self.bug == "uncut" else cut(out, batch, n))
            return last["out"]

        return Built(serve, capture_order=sizes[::-1], owner=static)


class StaleRow(Planted):
    name, bug, caught_by = "stale-row", "stale-row", "replay-matches-eager"


class Uncut(Planted):
    name, bug, caught_by = "uncut", "uncut", "outputs-cut-to-batch"


class SameTensors(Planted):
    name, bug, caught_by = "same-tensors", "same-tensors", "moved-inputs-never-stale"


class LastOutput(Planted):
    name, bug, caught_by = "last-output", "last-output", "repeats-give-fresh-outputs"


class NoWriteBack(Planted):
    name, bug, caught_by = "no-write-back", "no-write-back", "argument-writes-reach-the-caller"
    caught_on = "silly-inplace"


class FarRows(Planted):
    name, bug, caught_by = "far-rows", "far-rows", "replay-matches-eager"


class Float32(Planted):
    name, bug, caught_by = "float32", "float32", "replay-matches-eager"
    caught_on = "toy-llama-bf16"


PLANTED = [StaleRow, Uncut, SameTensors, LastOutput, NoWriteBack, FarRows, Float32]
