"""One mask concept (zoo.kernels.Mask) and the attention backends that read it.

The dense form is checked against a rule written out pair by pair in Python; the blocked CPU kernel
and (on CUDA) FlexAttention against SDPA on that dense mask, forward and gradients, on random masks
of every kind (causal or bidirectional, windows, documents, padding, prefix); packed rows against
each document run alone."""

from __future__ import annotations

import functools
import random

import pytest
import torch

import zoo
import torch.nn.functional as F
from conftest import tiny_model

from zoo import kernels
from zoo.components.position import alibi_slopes, relative_buckets
from zoo.kernels import (AlibiBias, Mask, MaskError, RelativeBias, attention_backend, blocked,
                         document_positions)


def reference_allowed(m: Mask, b: int, t: int, s: int) -> bool:
    """The rule as the docs state it, one pair at a time."""
    i = t + (m.k_len - m.q_len)
    if m.causal and s > i and not (m.prefix is not None and s < int(m.prefix[b])):
        return False
    if m.window is not None:
        if m.causal and s <= i - m.window:
            return False
        if not m.causal and abs(i - s) > m.window // 2:
            return False
    if m.documents is not None and int(m.documents[b, i]) != int(m.documents[b, s]):
        return False
    if m.padding is not None and not bool(m.padding[b, s]):
        return m.q_len == m.k_len and i == s
    return True


def random_documents(B: int, T: int, rng: random.Random) -> torch.Tensor:
    rows = []
    for _ in range(B):
        ids, d = [], 0
        while len(ids) < T:
            ids += [d] * rng.randint(1, max(1, T // 2))
            d += 1
        rows.append(ids[:T])
    return torch.tensor(rows)


def random_mask(seed: int, T: int, *, square: bool = True) -> Mask:
    rng = random.Random(seed)
    B = 2
    S = T if square else T + rng.randint(1, 5)
    causal = rng.random() < 0.6
    window = rng.choice([None, 1, 2, 5, 9, 16]) if rng.random() < 0.7 else None
    padding = documents = prefix = None
    if rng.random() < 0.5:
        lengths = torch.tensor([S, rng.randint(1, S)])
        padding = torch.arange(S)[None] < lengths[:, None]
    if rng.random() < 0.6 and square:
        documents = random_documents(B, S, rng)
    if causal and window is None and rng.random() < 0.3:
        prefix = torch.tensor([rng.randint(0, S), rng.randint(0, S)])
    return Mask(T, S, causal=causal, window=window, padding=padding, documents=documents, prefix=prefix)


@pytest.mark.parametrize("seed", range(24))
def test_dense_form_follows_the_rule_pair_by_pair(seed):
    m = random_mask(seed, T=11, square=seed % 4 != 0)
    dense, is_causal = m.dense()
    want = torch.tensor([[[reference_allowed(m, b, t, s) for s in range(m.k_len)] for t in range(m.q_len)]
                         for b in range(2)])
    if dense is None:
        assert is_causal == (m.causal and m.q_len > 1)
        dense = torch.ones(m.q_len, m.k_len, dtype=torch.bool)
        if is_causal:
            dense = dense.tril()
    assert torch.equal(dense.expand(2, 1, m.q_len, m.k_len)[:, 0], want)


def test_document_positions_restart_and_skip_padding():
    docs = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 7, 7, 7, 7]])
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]
    pad = torch.tensor([[True] * 6, [False, True, True, True, True, False]])
    assert document_positions(docs, pad).tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 0, 1, 2, 2]]


def _qkv(B, H, G, T, K, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, T, K, generator=g, dtype=dtype).to(device).requires_grad_() for n in (H, G, G))
    return q, k, v


def _reference(q, k, v, m: Mask):
    dense, is_causal = m.dense()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=is_causal,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _compare(q, k, v, m: Mask, backend: str, tol: float):
    """Forward and gradients within ``tol`` of the dense reference, relative to the largest value (at least 1)."""
    ref = _reference(q, k, v, m)
    grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    with attention_backend(backend):
        assert kernels.backend_for(m, q) == backend
        got = kernels.attention(q, k, v, mask=m, enable_gqa=q.shape[1] != k.shape[1])
    mine = torch.autograd.grad(got.square().sum(), (q, k, v))
    for a, b in zip((got, *mine), (ref, *grads)):
        assert (a - b).abs().max() < tol * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("seed", range(12))
def test_blocked_attention_equals_the_dense_mask_forward_and_backward(seed, monkeypatch):
    monkeypatch.setattr(blocked, "MIN_BLOCK", 4)  # several blocks at test sizes
    rng = random.Random(100 + seed)
    T = rng.randint(9, 41)
    B = 2
    causal = seed % 3 != 2
    window = rng.choice([2, 5, 8, 13]) if seed % 2 == 0 or seed % 3 == 2 else None
    documents = random_documents(B, T, rng) if window is None or seed % 4 == 0 else None
    padding = (torch.arange(T)[None] < torch.tensor([T, rng.randint(1, T)])[:, None]) if seed % 5 < 2 else None
    m = Mask(T, T, causal=causal, window=window, documents=documents, padding=padding)
    H, G = (4, 2) if seed % 2 else (3, 3)
    q, k, v = _qkv(B, H, G, T, 8, seed)
    _compare(q, k, v, m, "blocked", 1e-5)


@pytest.mark.parametrize("seed", range(9))
def test_blocked_attention_with_a_bias_equals_the_dense_mask_and_trains_the_bias(seed, monkeypatch):
    monkeypatch.setattr(blocked, "MIN_BLOCK", 4)
    rng = random.Random(200 + seed)
    T, B, H = rng.randint(9, 41), 2, 4
    g = torch.Generator().manual_seed(seed)
    documents = random_documents(B, T, rng)
    positions = document_positions(documents)  # restarting in each document
    trained = None
    if seed % 3 == 0:  # a tensor, trainable
        bias = trained = torch.randn(rng.choice([1, B]), rng.choice([1, H]), T, T, generator=g).requires_grad_()
    elif seed % 3 == 1:  # ALiBi as structure
        bias = AlibiBias(torch.tensor(alibi_slopes(H)), positions, positions)
    else:  # T5's as structure: its table trains
        trained = torch.randn(32, H, generator=g).requires_grad_()
        bias = RelativeBias(trained, positions, positions, functools.partial(
            relative_buckets, num_buckets=32, max_distance=20, bidirectional=seed % 2 == 0))
    window = rng.choice([3, 7]) if seed % 4 else None
    m = Mask(T, T, causal=seed % 2 == 1, window=window, documents=documents, bias=bias)
    q, k, v = _qkv(B, H, H, T, 8, seed)
    ref = _reference(q, k, v, m)
    inputs = (q, k, v) + ((trained,) if trained is not None else ())
    want = torch.autograd.grad(ref.square().sum(), inputs)
    with attention_backend("blocked"):
        assert kernels.backend_for(m, q) == "blocked"
        got = kernels.attention(q, k, v, mask=m)
    mine = torch.autograd.grad(got.square().sum(), inputs)
    for a, b in zip((got, *mine), (ref, *want)):
        assert (a - b).abs().max() < 1e-5 * max(1.0, float(b.abs().max()))
    if trained is not None:
        assert float(mine[3].abs().sum()) > 0  # the bias is trained through its bands


def test_blocked_attention_at_a_long_window_is_chosen_and_exact():
    T, W = 640, 64
    m = Mask(T, T, causal=True, window=W)
    q, k, v = _qkv(1, 2, 2, T, 16, 0)
    assert blocked.worth_it(m) and kernels.backend_for(m, q) == "blocked"
    C, back, ahead = blocked.band(m)
    assert ahead == 0 and back * C >= W - 1 and (back + 1) * C < T
    _compare(q, k, v, m, "blocked", 1e-5)


def test_a_bias_needs_a_narrower_band_to_go_blocked():
    T = 2048
    docs = (torch.arange(T) // 300)[None]  # documents of 300: a band of 480 keys (23% of them)
    bias = AlibiBias(torch.ones(8), torch.arange(T), torch.arange(T))  # values do not matter here
    q32, q16 = torch.zeros(1, 8, T, 64), torch.zeros(1, 8, T, 64, dtype=torch.bfloat16)
    assert blocked.band(Mask(T, T, causal=True, documents=docs)) == (160, 2, 0)
    for q in (q32, q16):  # without a bias half the keys is enough
        assert kernels.backend_for(Mask(T, T, causal=True, documents=docs), q) == "blocked"
    # the bias is read into the bands: a quarter of the keys in fp32, a fifth in bf16 (measured)
    assert kernels.backend_for(Mask(T, T, causal=True, documents=docs, bias=bias), q32) == "blocked"
    assert kernels.backend_for(Mask(T, T, causal=True, documents=docs, bias=bias), q16) == "dense"
    long = torch.zeros(1, 1, 1, 1).expand(1, 8, 2 * T, 2 * T)
    assert kernels.backend_for(Mask(2 * T, 2 * T, causal=True, window=256, bias=long), q16) == "blocked"


def test_blocked_or_dense_is_measured_per_class_on_a_cpu(monkeypatch):
    import time

    from zoo.kernels.cpu import banded, choose

    zoo.kernels.use(cpu_attention="measure")
    zoo.kernels.use(cache="off")
    choose.forget()
    timed = []

    def fake(cls, dense):  # the blocked kernel "wins" at 2,048 keys and loses at 4,096
        def kernel(name):
            return lambda: timed.append((name, cls)) or time.sleep(0.02 if (name == "blocked") == (cls[3] == 4096) else 0)
        return {"blocked": kernel("blocked"), "dense": kernel("dense")}

    monkeypatch.setattr(banded, "_timing_calls", fake)
    try:
        T = 2048
        docs = (torch.arange(T) // 300)[None]  # a band of 480 keys: the rule says dense with a bf16 bias
        alibi = AlibiBias(torch.ones(8), torch.arange(T), torch.arange(T))
        q16 = torch.zeros(1, 8, T, 64, dtype=torch.bfloat16)
        m = Mask(T, T, causal=True, documents=docs, bias=alibi)
        assert kernels.backend_for(m, q16) == "blocked" and len(timed) == 2 * 4  # measured: blocked
        assert timed[0][1] == ("bfloat16", "infer", 1, 2048, 512, 64, "alibi")
        assert kernels.backend_for(Mask(T, T, causal=True, documents=(torch.arange(T) // 290)[None], bias=alibi),
                                   q16) == "blocked" and len(timed) == 8  # band 480 again: the same class
        long = Mask(2 * T, 2 * T, causal=True, window=256)  # the rule says blocked, measured dense
        assert kernels.backend_for(long, torch.zeros(1, 8, 2 * T, 64)) == "dense" and len(timed) == 16
        # outside the region where blocking can pay (a band over half the keys): the rule, nothing timed
        assert kernels.backend_for(Mask(T, T, causal=True, documents=(torch.arange(T) // 1000)[None]), q16) == "dense"
        zoo.kernels.use(cpu_attention="rule")
        assert kernels.backend_for(m, q16) == "dense" and len(timed) == 16
        assert banded.band_class(torch.float32, True, 64, 3000, 700, 64, "none") == ("float32", "train", 1, 4096,
                                                                                     1024, 64, "none")
    finally:
        choose.forget()


@pytest.mark.parametrize("bias", ["none", "alibi", "relative", "tensor"])
def test_blocked_or_dense_timing_calls_run_both_without_the_global_rng(bias):
    from zoo.kernels.cpu import banded
    from zoo.kernels.dispatch import _dense_attention

    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    for mode in ("train", "infer"):
        calls = banded._timing_calls(("float32", mode, 2, 512, 128, 8, bias), _dense_attention)
        assert set(calls) == {"blocked", "dense"}
        for call in calls.values():
            call()
    assert torch.equal(torch.rand(3), expected)


def test_a_mask_that_bounds_nothing_stays_dense():
    m = Mask(600, 600, causal=True)
    assert kernels.backend_for(m, torch.zeros(1, 1, 600, 8)) == "dense"
    with attention_backend("blocked"):
        assert kernels.backend_for(Mask(600, 600, causal=True, prefix=torch.tensor([3])), torch.zeros(1, 1, 600, 8)) == "dense"


@pytest.mark.parametrize("kind", ["rope", "learned", "alibi", "window"])
def test_a_packed_row_equals_each_document_alone(kind):
    overrides = {"rope": [], "learned": ["position.kind=learned"], "alibi": ["position.kind=alibi"],
                 "window": ["block.attention.window=3"]}[kind]
    model = tiny_model("decoder", ["dropout.embedding=0", "dropout.residual=0", "dropout.attention=0",
                                   "dropout.ffn=0", *overrides]).eval()
    g = torch.Generator().manual_seed(1)
    V = model.spec.vocab_size
    docs = [torch.randint(0, V, (n,), generator=g) for n in (5, 1, 7, 3)]
    row = torch.cat(docs)[None]
    ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None]
    with torch.no_grad():
        packed = model(row, documents=ids)[0]
        alone = torch.cat([model(d[None])[0] for d in docs])
        for backend in ("dense", "blocked"):
            with attention_backend(backend):
                assert (model(row, documents=ids)[0] - alone).abs().max() < 1e-5
    assert (packed - alone).abs().max() < 1e-5
    assert (model(row)[0, 5:] - alone[5:]).abs().max() > 1e-3  # without documents the rows do see each other


def test_a_packed_encoder_row_equals_each_document_alone():
    model = tiny_model("encoder", ["dropout.embedding=0", "dropout.residual=0", "dropout.attention=0",
                                   "dropout.ffn=0"]).eval()
    g = torch.Generator().manual_seed(2)
    docs = [torch.randint(0, model.spec.vocab_size, (n,), generator=g) for n in (4, 6, 2)]
    ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None]
    with torch.no_grad():
        packed = model(torch.cat(docs)[None], documents=ids)[0]
        alone = torch.cat([model(d[None])[0] for d in docs])
    assert (packed - alone).abs().max() < 1e-5


def test_bad_masks_name_the_shapes_and_the_backend():
    with pytest.raises(MaskError, match=r"documents: shape \(2, 5\) does not fit .*\[B, 6\]"):
        Mask(6, 6, documents=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(MaskError, match=r"documents: shape \(2, 6\) does not fit the batch: expected \[3, 6\].*padding \(3, 6\) has 3 rows"):
        Mask(6, 6, documents=torch.zeros(2, 6, dtype=torch.long), padding=torch.ones(3, 6, dtype=torch.bool))
    with pytest.raises(MaskError, match="prefix"):
        Mask(6, 6, causal=False, prefix=torch.tensor([2]))
    q = torch.zeros(1, 1, 4, 8)
    with attention_backend("flex"), pytest.raises(ValueError, match="run.attention=flex: .*CUDA only.*blocked"):
        kernels.attention(q, q, q, mask=Mask(4, 4, causal=True, window=2))
    with pytest.raises(ValueError, match="attention backend 'fast': use one of auto, dense, blocked, flex"):
        with attention_backend("fast"):
            pass
    model = tiny_model("decoder").eval()
    tokens = torch.zeros(1, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"documents: shape \(1, 5\) does not fit tokens \(1, 6\)"):
        model(tokens, documents=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="packed rows are for full passes"):
        model(tokens, None, model.new_cache(8), documents=torch.zeros(1, 6, dtype=torch.long))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (FlexAttention trains on CUDA only)")
@pytest.mark.parametrize("seed", range(4))
def test_flex_attention_equals_the_dense_mask_on_the_gpu(seed):
    rng = random.Random(200 + seed)
    T = 130 if seed < 2 else 257
    causal = seed % 3 != 2
    window = rng.choice([16, 33, 64]) if seed % 2 == 0 else None
    documents = random_documents(2, T, rng).cuda() if window is None or seed % 4 == 0 else None
    padding = (torch.arange(T)[None] < torch.tensor([T, rng.randint(1, T)])[:, None]).cuda() if seed % 3 == 1 else None
    m = Mask(T, T, causal=causal, window=window, documents=documents, padding=padding, device=torch.device("cuda"))
    q, k, v = _qkv(2, 4, 2 if seed % 2 else 4, T, 16, seed, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    _compare(q, k, v, m, "flex", 1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (FlexAttention trains on CUDA only)")
@pytest.mark.parametrize("kind", ["alibi", "relative", "tensor"])
def test_flex_attention_with_a_bias_equals_the_dense_mask_on_the_gpu(kind):
    T, H = 257, 4
    rng = random.Random(7)
    documents = random_documents(2, T, rng).cuda()
    positions = document_positions(documents)
    if kind == "alibi":  # computed in the score_mod from slopes and positions
        bias = AlibiBias(torch.tensor(alibi_slopes(H), device="cuda"), positions, positions)
    elif kind == "relative":  # T5's table of buckets (not trained here: a trainable bias takes dense)
        bias = RelativeBias(torch.randn(32, H, device="cuda"), positions, positions, functools.partial(
            relative_buckets, num_buckets=32, max_distance=64, bidirectional=False))
    else:  # read in place
        bias = torch.randn(1, H, T, T, generator=torch.Generator().manual_seed(7)).cuda()
    m = Mask(T, T, causal=True, window=48, documents=documents, bias=bias)
    q, k, v = _qkv(2, H, H, T, 16, 7, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    _compare(q, k, v, m, "flex", 1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (FlexAttention trains on CUDA only)")
def test_a_packed_row_on_flex_equals_each_document_alone_and_trains_as_dense():
    model = tiny_model("decoder", ["dropout.embedding=0", "dropout.residual=0", "dropout.attention=0",
                                   "dropout.ffn=0", "block.attention.window=5", "max_seq_len=512", "d_model=64",
                                   "block.attention.n_heads=4"]).cuda()
    g = torch.Generator().manual_seed(3)
    docs = [torch.randint(0, model.spec.vocab_size, (n,), generator=g).cuda() for n in (100, 37, 180, 9)]
    row = torch.cat(docs)[None]
    ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None].cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        alone = torch.cat([model(d[None])[0] for d in docs])
    grads = {}
    for backend in ("flex", "dense"):
        model.zero_grad()
        with attention_backend(backend):
            out = model(row, documents=ids)
        assert (out[0] - alone).abs().max() < 1e-4
        out.square().mean().backward()
        grads[backend] = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads["flex"], grads["dense"]):
        assert (a - b).abs().max() < 1e-4 * max(1.0, float(b.abs().max()))


def test_packed_translation_pairs_equal_each_pair_alone():
    model = tiny_model("encoder_decoder", ["dropout.embedding=0", "dropout.residual=0", "dropout.attention=0",
                                           "dropout.ffn=0"]).eval()
    g = torch.Generator().manual_seed(4)
    pairs = [(torch.randint(0, model.spec.src_vocab_size, (s,), generator=g),
              torch.randint(0, model.spec.vocab_size, (t,), generator=g)) for s, t in ((4, 6), (7, 2), (3, 5))]
    src, tgt = (torch.cat([p[i] for p in pairs])[None] for i in (0, 1))
    ids = [torch.cat([torch.full((len(p[i]),), k) for k, p in enumerate(pairs)])[None] for i in (0, 1)]
    pad = torch.tensor([[True] * src.shape[1] + [False] * 2])  # two padding slots after the packed sources
    src = torch.cat([src, torch.zeros(1, 2, dtype=torch.long)], 1)
    src_ids = torch.cat([ids[0], torch.full((1, 2), 9)], 1)
    with torch.no_grad():
        packed = model(src, tgt, pad, src_documents=src_ids, tgt_documents=ids[1])[0]
        alone = torch.cat([model(s[None], t[None])[0] for s, t in pairs])
    assert (packed - alone).abs().max() < 1e-5
    with pytest.raises(ValueError, match="packed pairs need both"):
        model(src, tgt, pad, src_documents=src_ids)
