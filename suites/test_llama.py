"""harness/models/llama.py: its paged attention against dense causal attention, padding rows, pieceworks
(Inductor pieces, and CUDA graphs where there is CUDA) against eager, and the presets' shapes. CPU tests use
`TINY`."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, counters
from pieceworks.harness.models import llama as L

C = L.TINY
SCALE = C.head_dim**-0.5


def _caches(stale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v caches whose sequence blocks hold NaN (`stale`: data no row may read) or random numbers (as if
    earlier calls wrote them); the reserved block 0 holds zeros, as the model allocates it."""
    shape, gen = (C.num_blocks, C.block_size, C.num_kv_heads, C.head_dim), torch.Generator().manual_seed(5)
    caches = tuple(
        torch.full(shape, float("nan")) if stale else torch.randn(shape, generator=gen) for _ in "kv"
    )
    for cache in caches:
        cache[0] = 0
    return caches


def _qkv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, C.num_heads, C.head_dim, generator=gen),
        torch.randn(n, C.num_kv_heads, C.head_dim, generator=gen),
        torch.randn(n, C.num_kv_heads, C.head_dim, generator=gen),
    )


def _paged(md: L.AttentionMetadata, seq_ids, positions, q, k, v, caches) -> torch.Tensor:
    """The op on tokens (seq_ids[i], positions[i]) of q, k, v, through `md`."""
    md.set_batch(torch.as_tensor(seq_ids), torch.as_tensor(positions))
    out = torch.full_like(q, float("nan"))
    with L.attention_context(md):
        torch.ops.llama.paged_attention(q, k, v, *caches, out, SCALE)
    return out


def _dense(q, k, v) -> torch.Tensor:
    """Causal attention of one whole sequence [S, heads, D], no cache."""
    return F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=SCALE, enable_gqa=True
    ).transpose(0, 1)


def test_prefill_in_chunks_equals_dense_causal_attention():
    md, caches = L.AttentionMetadata(C), _caches()
    q, k, v = _qkv(23, seed=0)  # 23 positions: 6 blocks, the last one partly filled
    first = _paged(md, [9] * 15, range(15), q[:15], k[:15], v[:15], caches)
    rest = _paged(
        md, [9] * 8, range(15, 23), q[15:], k[15:], v[15:], caches
    )  # reads what the first call wrote
    torch.testing.assert_close(torch.cat([first, rest]), _dense(q, k, v))


def test_decode_batch_equals_dense_attention_over_each_sequence():
    md, caches = L.AttentionMetadata(C), _caches()
    seqs, lengths = [7, 0, C.max_tokens - 1, 12, 3], [1, 4, 5, 17, C.max_context]
    full = {s: _qkv(n, seed=s) for s, n in zip(seqs, lengths)}
    for s, n in zip(seqs, lengths):  # earlier calls write each sequence's first n - 1 positions
        if n > 1:
            _paged(md, [s] * (n - 1), range(n - 1), *(t[:-1] for t in full[s]), caches)
    last = [torch.stack([full[s][i][-1] for s in seqs]) for i in range(3)]
    got = _paged(md, seqs, [n - 1 for n in lengths], *last, caches)
    for row, s in enumerate(seqs):
        torch.testing.assert_close(got[row], _dense(*full[s])[-1], msg=lambda m, s=s: f"sequence {s}: {m}")


def test_padding_rows_change_no_real_row_and_write_no_sequence_slot():
    md = L.AttentionMetadata(C)
    seqs, positions, pad = [4, 1, 30], [6, 0, 13], 5
    q, k, v = _qkv(len(seqs) + pad, seed=1)
    k[len(seqs) :], v[len(seqs) :] = float("nan"), float("inf")  # poisoned padding rows
    alone_caches, padded_caches = _caches(stale=False), _caches(stale=False)
    alone = _paged(md, seqs, positions, q[:3], k[:3], v[:3], alone_caches)
    padded = _paged(md, seqs, positions, q, k, v, padded_caches)  # set_batch made rows 3.. padding rows
    assert md.seq_lens[3:].eq(1).all() and md.slot_mapping[3:].eq(L.SCRATCH_SLOT).all()
    torch.testing.assert_close(padded[:3], alone)
    assert padded[3:].eq(0).all()  # padding rows attend to the zero slot alone: zeros, never NaN
    for alone_cache, padded_cache in zip(alone_caches, padded_caches):
        torch.testing.assert_close(
            padded_cache[1:], alone_cache[1:], equal_nan=True
        )  # every sequence's block
        assert padded_cache.view(-1, C.num_kv_heads, C.head_dim)[L.ZERO_SLOT].eq(0).all()


def test_model_decode_batch_continues_each_prefill():
    """End to end: decoding the next token of 4 prefilled sequences in one batch gives the last rows of
    prefills of the whole sequences."""
    torch.manual_seed(0)
    model, gen = L.Llama(C), torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, C.vocab_size, (n,), generator=gen) for n in [4, 10, 1, 21]]
    expected = []
    for s, ids in enumerate(prompts):
        expected.append(model(ids, L.prefill_batch(model, len(ids), seq=10 + s)[1])[-1].clone())
        if len(ids) > 1:
            model(ids[:-1], L.prefill_batch(model, len(ids) - 1, seq=s)[1])
    _, positions = L.decode_batch(model, len(prompts), positions=[len(ids) - 1 for ids in prompts])
    got = model(torch.stack([ids[-1] for ids in prompts]), positions)
    torch.testing.assert_close(got, torch.stack(expected))


@pytest.mark.inductor
def test_inductor_pieces_match_eager_for_decode_and_prefill_batches():
    """pieceworks (Inductor, no CUDA graphs) serves decode batches of 5 and 1 and a 16-token prefill like
    eager, after splitting the 2-layer model into 5 pieces and compiling its 3 distinct ones."""
    torch.manual_seed(0)
    model = L.Llama(C)
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=L.SPLITTING_OPS, cudagraph_mode=CUDAGraphMode.NONE)
    )
    batches = [
        lambda: L.decode_batch(model, 5, seed=5),
        lambda: L.decode_batch(model, 1, seed=1),
        lambda: L.prefill_batch(model, 16, seq=3),
    ]  # each fills the model's metadata for its own batch
    with counters.expect(
        num_piecewise_graphs_seen=5, num_piecewise_capturable_graphs_seen=3, num_inductor_compiles=3
    ):
        for i, batch in enumerate(batches):
            args = batch()
            expected = model(*args).clone()  # eager and compiled write the same k, v into the same slots
            torch.testing.assert_close(
                compiled(*args), expected, rtol=1e-4, atol=1e-4, msg=lambda m, i=i: f"call {i}: {m}"
            )


@pytest.mark.parametrize("attention", ["unified", "varlen"])
def test_the_model_is_keyed_for_a_serving_record_whatever_its_current_batch(attention, caplog):
    """The model's attributes, its attention metadata's host plan included, are values a serving record's key
    can digest, and the plan (per-call data) by its type alone: the key is the same whatever batch is current,
    so a warm start whose first batch differs from the cold start's serves from the record instead of tracing
    again."""
    from pieceworks.model import record

    model, config = (
        L.Llama(dataclasses.replace(C, attention=attention)),
        CompilationConfig(splitting_ops=[L.ATTENTION_OPS[attention]]),
    )
    keys = []
    for batch in (lambda: L.decode_batch(model, 3), lambda: L.prefill_batch(model, 5, seq=1)):
        batch()  # makes its plan current
        with caplog.at_level("INFO", logger="pieceworks"):
            facts = record.model_facts(model, [], config)
        assert facts is not None, caplog.text
        keys.append(record.key_of(facts))
    assert model.attn_metadata.plan.num_tokens == 5 and keys[0] == keys[1]


@pytest.mark.parametrize("layers", [1, 3])
def test_the_graph_splits_into_2L_plus_1_pieces(layers):
    config = dataclasses.replace(C, num_layers=layers)
    model = L.Llama(config)
    compiled = pieceworks.compile(
        model,
        CompilationConfig(splitting_ops=L.SPLITTING_OPS, compiler="eager", cudagraph_mode=CUDAGraphMode.NONE),
    )
    with counters.expect(
        num_piecewise_graphs_seen=2 * layers + 1, num_piecewise_capturable_graphs_seen=layers + 1
    ):
        compiled(*L.decode_batch(model, 4))
    pieces = compiled.runtime.compiled.pieces
    assert [p.is_splitting_graph for p in pieces] == [False, True] * layers + [False]
    attention = (torch.ops.llama.paged_attention, torch.ops.llama.paged_attention.default)
    for piece in pieces:  # each splitting piece holds one attention, no other piece holds any
        calls = [n for n in piece.fx_graph.graph.nodes if n.op == "call_function" and n.target in attention]
        assert len(calls) == piece.is_splitting_graph


def _params(model: torch.nn.Module, embedding: bool = True) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if embedding or "tok_embeddings" not in name)


def test_presets_have_the_published_shapes():
    with torch.device("meta"):  # no memory: shapes only
        small, big = L.Llama(L.LLAMA_1B), L.Llama(dataclasses.replace(L.LLAMA_8B, num_layers=4))
    # Llama-3.2-1B: 16 layers of (qkv 2048x3072, o 2048x2048, SwiGLU 3 x 2048x8192, 2 norms) + a final norm;
    # its lm_head is tied to the 128256 x 2048 embedding, so with the embedding this is the published
    # 1,235,814,400.
    assert _params(small, embedding=False) == 16 * (2048 * 3072 + 2048**2 + 3 * 2048 * 8192 + 2 * 2048) + 2048
    assert _params(small) == 1_235_814_400
    # Llama-3.1-8B: 32 layers of 218,112,000, an untied embedding and lm_head of 128256 x 4096: 8,030,261,248.
    per_layer = 4096 * 6144 + 4096**2 + 3 * 4096 * 14336 + 2 * 4096
    assert _params(big, embedding=False) == 4 * per_layer + 4096
    assert 32 * per_layer + 4096 + 2 * 128256 * 4096 == 8_030_261_248
    assert len(big.layers) == 4 and L.LLAMA_8B.num_layers == 32
    block = small.layers[0]
    assert block.wqkv.weight.shape == (48 * 64, 2048) and block.w13.weight.shape == (2 * 8192, 2048)
    assert block.k_cache.shape == (1 + 512 * 16, 16, 8, 64) == big.layers[0].v_cache.shape[:2] + (8, 64)
    assert (L.LLAMA_1B.norm_eps, L.LLAMA_1B.rope_theta, L.LLAMA_1B.vocab_size) == (1e-5, 500000.0, 128256)
    assert (C.num_layers, C.hidden_size, C.num_heads, C.num_kv_heads, C.intermediate_size, C.vocab_size) == (
        2,
        64,
        4,
        2,
        128,
        256,
    )


def _mixed_batch(model: L.Llama, device, chunk: int, decodes: int, seed: int) -> tuple:
    """A mixed batch: a prefill chunk of `chunk` tokens of sequence 40 (positions 8..), then `decodes` decode
    tokens of sequences 0, 1, ...; the model's metadata filled for it and current."""
    gen = torch.Generator().manual_seed(seed)
    positions = [*range(8, 8 + chunk), *torch.randint(0, C.max_context, (decodes,), generator=gen).tolist()]
    return L.serve_tokens(model, [40] * chunk + list(range(decodes)), positions, device, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["unified", "varlen"])
@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"])
def test_cuda_graphs_serve_decode_and_mixed_batches_like_eager(cuda, mode, attention, caplog):
    """Every mode serves uniform decode batches (inside `uniform_decode()`) and mixed ones like eager, with
    either attention op; FULL over the varlen op, whose graphs may hold uniform decode batches only, is
    lowered to FULL_AND_PIECEWISE with a WARNING, and no graph ever replays a mixed batch's plan for another
    batch."""
    torch.manual_seed(0)
    config = dataclasses.replace(C, attention=attention)
    model = L.Llama(config).to(cuda)
    caplog.set_level("WARNING", logger="pieceworks")
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            splitting_ops=config.splitting_ops, cudagraph_mode=mode, cudagraph_capture_sizes=[1, 4, 8, 16]
        ),
    )
    compiled(*L.decode_batch(model, 3, cuda))
    L.decode_batch(model, 16, cuda)  # a uniform decode batch is current while capturing (vLLM's dummy run)
    compiled.capture()
    lowered = attention == "varlen" and mode == "FULL"
    assert (
        compiled.runtime.mode.name == "FULL_AND_PIECEWISE"
    ) == lowered or compiled.runtime.mode.name == mode
    assert any("lowered to FULL_AND_PIECEWISE" in r.getMessage() for r in caplog.records) == lowered
    batches = [(lambda b=b: L.decode_batch(model, b, cuda, seed=b), True) for b in [8, 3, 1, 6, 16]] + [
        (lambda c=c, d=d: _mixed_batch(model, cuda, c, d, seed=c), False)
        for c, d in [(5, 2), (1, 6), (12, 3)]
    ]
    for make, uniform in batches * 2:  # twice: replays after other kinds and sizes
        args = make()
        expected = model(*args).clone()  # eager writes the same k, v into the same slots
        with pieceworks.uniform_decode(uniform):
            got = compiled(*args)
        torch.testing.assert_close(
            got,
            expected,
            rtol=1e-4,
            atol=1e-4,
            msg=lambda m, args=args, uniform=uniform: f"{len(args[0])} tokens, uniform decode {uniform}: {m}",
        )


def test_a_batch_or_rows_beyond_max_tokens_is_a_clear_error_never_a_read_past_the_metadata():
    md, caches = L.AttentionMetadata(C), _caches()
    with pytest.raises(ValueError, match=f"{C.max_tokens + 1} tokens, but the metadata holds {C.max_tokens}"):
        md.set_batch(torch.zeros(C.max_tokens + 1, dtype=torch.long), torch.arange(C.max_tokens + 1))
    with pytest.raises(ValueError, match=f"{C.max_tokens + 1} rows, but the metadata holds {C.max_tokens}"):
        _paged(md, [0], [0], *_qkv(C.max_tokens + 1, seed=2), caches)  # 1 token, the rest padding rows
