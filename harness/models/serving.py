"""Serving workloads: requests, the steps a continuous-batching scheduler makes of them, and seeded traces.

A *step* is one forward pass over a batch of tokens from several sequences: one decode token per sequence that
is generating, and chunks of prompts (chunked prefill) in what is left of a token budget (vLLM's
`max_num_batched_tokens`), for at most `max_seqs` sequences at a time. A step whose every sequence brings one
token is *uniform decode*, the kind a full CUDA graph of a decode-only attention may serve; any other step is
mixed.

`schedule` is vLLM's V1 policy in small: each step first gives every generating sequence its decode token,
then the budget left to unfinished prompts, oldest first, admitting waiting requests into free sequence slots
while budget and slots remain. A request's prompt of P tokens takes positions 0..P-1; its first output token
comes with the step that computes the last prompt chunk, each later one with a decode step whose token sits at
the next position, until it has `output` tokens; then its slot is free. `KVBlocks` gives each slot cache
blocks as its sequence grows (from a seeded shuffle of the cache, as a cache looks after some traffic) and
takes them back when it is free.

The traces (docs/benchmarks.md states them): `decode_trace` (sequences already prefilled at random lengths,
decoding until each has its output: batches shrink from `max_seqs` to 1) and `mixed_trace` (requests whose
prompt and output lengths are log-normal, arriving at random, up to the last prompt chunk: prefill chunks keep
joining the decode tokens). `run_step` makes a step's inputs current on a Llama (harness/models/llama.py) and
calls a model on them.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

import pieceworks

from .llama import Llama, serve_tokens

__all__ = [
    "Chunk",
    "KVBlocks",
    "Request",
    "ServingStep",
    "decode_trace",
    "mixed_trace",
    "request_mix",
    "run_step",
    "schedule",
    "step_inputs",
]


@dataclasses.dataclass(frozen=True)
class Request:
    prompt: int  # tokens
    output: int  # tokens to generate, the first one included


class Chunk(NamedTuple):
    """`tokens` consecutive tokens of request `request`, from position `first`, in sequence slot `slot`."""

    request: int
    slot: int
    first: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class ServingStep:
    """One forward pass: its chunks, decode tokens first; `freed`: slots whose sequence finished with this
    step (their blocks may go to others after it)."""

    chunks: tuple[Chunk, ...]
    freed: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(c.tokens for c in self.chunks)

    @property
    def uniform_decode(self) -> bool:
        return all(c.tokens == 1 for c in self.chunks)

    @property
    def kind(self) -> str:
        return "decode" if self.uniform_decode else "mixed"

    def tokens(self) -> tuple[list[int], list[int], list[int]]:
        """`(requests, slots, positions)` of the step's tokens, in order."""
        return (
            [c.request for c in self.chunks for _ in range(c.tokens)],
            [c.slot for c in self.chunks for _ in range(c.tokens)],
            [p for c in self.chunks for p in range(c.first, c.first + c.tokens)],
        )


def request_mix(
    count: int,
    seed: int,
    prompt_median: int = 384,
    output_median: int = 128,
    sigma: float = 0.8,
    max_context: int = 2048,
) -> list[Request]:
    """`count` requests, prompt and output lengths log-normal around their medians (spread `sigma`), each at
    least 1 token, prompt + output within `max_context`."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        prompt = max(1, min(max_context - 1, round(prompt_median * math.exp(rng.gauss(0, sigma)))))
        output = max(1, min(max_context - prompt, round(output_median * math.exp(rng.gauss(0, sigma)))))
        found.append(Request(prompt, output))
    return found


def schedule(
    requests: Sequence[Request], token_budget: int, max_seqs: int, arrivals: Sequence[int] | None = None
) -> list[ServingStep]:
    """The steps that serve `requests`, request i waiting from step `arrivals[i]` on (default: all at the
    start; a step with nothing to run is skipped); see the module doc."""
    if token_budget < max_seqs:
        raise ValueError(
            f"token_budget={token_budget} < max_seqs={max_seqs}: a step of every sequence's decode token "
            "would not fit"
        )
    arrivals = list(arrivals or [0] * len(requests))
    waiting: list[int]  # request indices, oldest first
    later, waiting, free = (
        sorted(range(len(requests)), key=lambda r: (arrivals[r], r)),
        [],
        list(range(max_seqs)),
    )
    running: list[list[int]] = []  # [request, slot, positions computed, tokens generated]
    steps, clock = [], 0
    while later or waiting or running:
        if not waiting and not running:
            clock = max(clock, arrivals[later[0]])
        while later and arrivals[later[0]] <= clock:
            waiting.append(later.pop(0))
        clock += 1
        budget, chunks, freed = token_budget, [], []
        for seq in running:  # decode tokens first
            request, slot, done, made = seq
            if done >= requests[request].prompt and budget:
                chunks.append(Chunk(request, slot, done, 1))
                seq[2], seq[3], budget = done + 1, made + 1, budget - 1
        while budget and (any(s[2] < requests[s[0]].prompt for s in running) or (waiting and free)):
            prefilling = next((s for s in running if s[2] < requests[s[0]].prompt), None)
            if prefilling is None:  # admit the oldest waiting request
                prefilling = [waiting.pop(0), free.pop(0), 0, 0]
                running.append(prefilling)
            request, slot, done, _ = prefilling
            n = min(budget, requests[request].prompt - done)
            chunks.append(Chunk(request, slot, done, n))
            prefilling[2], budget = done + n, budget - n
            if prefilling[2] == requests[request].prompt:
                prefilling[3] = 1  # the last prompt chunk's step gives the first output token
        for seq in [s for s in running if s[3] >= requests[s[0]].output and s[2] >= requests[s[0]].prompt]:
            running.remove(seq)
            free.append(seq[1])
            freed.append(seq[1])
        steps.append(ServingStep(tuple(chunks), tuple(freed)))
    return steps


def decode_trace(seqs: int, seed: int, max_context: int = 2048, output_median: int = 96) -> list[ServingStep]:
    """Decode-only steps: `seqs` sequences already holding prompts of random lengths (up to half of
    `max_context`), each decoding a log-normal number of tokens; a step per token until the last one
    finishes."""
    rng = random.Random(seed)
    lengths = [rng.randint(16, max_context // 2) for _ in range(seqs)]
    outputs = [
        max(1, min(max_context - n, round(output_median * math.exp(rng.gauss(0, 0.6))))) for n in lengths
    ]
    steps, step = [], 0
    while any(step < out for out in outputs):
        live = [s for s in range(seqs) if step < outputs[s]]
        steps.append(
            ServingStep(
                tuple(Chunk(s, s, lengths[s] + step, 1) for s in live),
                tuple(s for s in live if step + 1 == outputs[s]),
            )
        )
        step += 1
    return steps


def mixed_trace(
    requests: int,
    seed: int,
    token_budget: int = 512,
    max_seqs: int = 64,
    max_context: int = 2048,
    per_step: float = 1.0,
) -> list[ServingStep]:
    """`schedule` of `request_mix(requests, seed)` arriving `per_step` requests a step on average (exponential
    gaps), up to the step that computes the last prompt chunk: chunked prefill beside decode tokens while
    requests arrive (the drain after it, decode steps of shrinking batches, is what `decode_trace`
    measures)."""
    rng, clock, arrivals = random.Random(seed + 1), 0.0, []
    for _ in range(requests):
        arrivals.append(int(clock))
        clock += rng.expovariate(per_step)
    steps = schedule(request_mix(requests, seed, max_context=max_context), token_budget, max_seqs, arrivals)
    return steps[: max(i for i, step in enumerate(steps) if not step.uniform_decode) + 1]


class KVBlocks:
    """Cache blocks of one Llama's metadata, handed to sequence slots as they grow and taken back when they
    finish. The free blocks start in a seeded shuffle, so a sequence's blocks are scattered as in a cache
    after traffic."""

    def __init__(self, model: Llama, seed: int = 0) -> None:
        self.metadata, self.block_size = model.attn_metadata, model.config.block_size
        self.free = list(range(1, model.config.num_blocks))
        random.Random(seed).shuffle(self.free)
        self.owned: dict[int, list[int]] = {}

    def cover(self, step: ServingStep) -> None:
        """Every slot of `step` owns blocks for the positions it reaches (`MemoryError` when the cache is
        full)."""
        for _, slot, first, n in step.chunks:
            owned = self.owned.setdefault(slot, [])
            need = -(-(first + n) // self.block_size) - len(owned)
            if need > 0:
                if need > len(self.free):
                    raise MemoryError(
                        f"the cache has {len(self.free)} free blocks, slot {slot} needs {need} more"
                    )
                owned += [self.free.pop() for _ in range(need)]
                self.metadata.assign_blocks(slot, owned)

    def release(self, step: ServingStep) -> None:
        for slot in step.freed:
            self.free += self.owned.pop(slot, [])


def step_inputs(model: Llama, step: ServingStep, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, positions)` of `step`'s tokens, the model's metadata filled for them and current (its
    blocks must be assigned: `KVBlocks.cover`). A token's id depends on its request and position alone, so a
    request gets the same tokens however it is batched."""
    requests, slots, positions = (torch.tensor(x) for x in step.tokens())
    _, positions = serve_tokens(model, slots, positions, device)
    ids = (requests * 7919 + positions.cpu() * 104729) % (model.config.vocab_size - 1)
    return ids.to(device), positions


def run_step(model: Llama, fn: Callable[..., Any], step: ServingStep, device: Any) -> Any:
    """`fn(*step_inputs(model, step, device))`, marked uniform decode where the step is
    (`pieceworks.uniform_decode`)."""
    args = step_inputs(model, step, device)
    with pieceworks.uniform_decode(step.uniform_decode):
        return fn(*args)
