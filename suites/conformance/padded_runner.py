"""A padded CPU runner: the adapter docs/conformance.md shows, which the conformance suite's own tests run as
written.

It serves batches as an engine's model runner serves them with CUDA graphs, without the graphs: one static
buffer of the largest captured size per argument; a batch of b rows copied into the first b rows, the model
run on the first n rows (n: the smallest captured size >= b, so rows b..n-1 hold an earlier call's rows), the
outputs cut back to b rows, and what the model wrote into its arguments copied back to the caller's. Above the
largest size the model runs on the arguments as given. Run it: `--impl
pieceworks.conformance.padded_runner:PaddedRunner`.
"""

import torch

from pieceworks.harness.adapters import Built, Capabilities, Implementation


def cut(out, batch, n):
    """`out` with every tensor whose dim 0 is the padded size n cut to its first `batch` rows (tuples, lists,
    dicts)."""
    if isinstance(out, torch.Tensor):
        return out[:batch] if out.dim() > 0 and out.shape[0] == n else out
    if isinstance(out, dict):
        return {key: cut(value, batch, n) for key, value in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(cut(value, batch, n) for value in out)
    return out


class PaddedRunner(Implementation):
    name = "padded-runner"
    # claims padding only: no CUDA graphs, graph pool or compile cache
    capabilities = Capabilities(padding=True)
    contracts = {
        "cuda_graphs": "runs the eager model on static buffers: no CUDA graphs",
        "shared_pool": "no CUDA graphs, so no graph pool",
        "compile_cache": "compiles nothing, so caches nothing",
    }

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        sizes = sorted(capture_sizes)
        static = [a.clone() for a in make_inputs(sizes[-1])]  # one buffer per argument, of the largest size

        def serve(*args):
            batch = args[0].shape[0]
            n = next((size for size in sizes if size >= batch), None)
            if n is None:  # above the largest captured size
                return model(*args)
            for buffer, a in zip(static, args):
                buffer[:batch].copy_(a)
            out = model(*[buffer[:n] for buffer in static])
            for buffer, a in zip(static, args):
                a.copy_(buffer[:batch])  # in-place writes of the model reach the caller's arguments
            return cut(out, batch, n)

        return Built(serve, capture_order=sizes[::-1], owner=static)
