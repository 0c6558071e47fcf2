"""Each part against its math: hand computations and closed forms."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zoo.components import (
    Attention,
    BlockContext,
    GatedMLP,
    LayerScale,
    MLP,
    ParallelBlock,
    PostNormBlock,
    PostSublayerNormBlock,
    PreNormBlock,
    RMSNorm,
    RotaryPosition,
    SinusoidalPosition,
    attention_mask,
)
from zoo.components.position import AlibiPosition, NoPosition, alibi_slopes, sincos_2d_table


def test_sinusoidal_is_the_papers_formula():
    d, n = 6, 9
    table = SinusoidalPosition(d, n).weight
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    concat = SinusoidalPosition(d, n, layout="concat").weight
    torch.testing.assert_close(concat, torch.cat([table[:, 0::2], table[:, 1::2]], dim=1))
    x = torch.zeros(2, 4, d)
    torch.testing.assert_close(SinusoidalPosition(d, n).add(x, torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])),
                               torch.stack([table[0:4], table[5:9]]))


def test_sincos_2d_rows_and_columns():
    table = sincos_2d_table((2, 3), 8, extra_tokens=1)
    assert table.shape == (7, 8) and torch.equal(table[0], torch.zeros(8))
    patch = 1 + 1 * 3 + 2  # row 1, column 2
    omega = 1 / 10000 ** (torch.arange(2) / 2)
    expected = torch.cat([torch.sin(2 * omega), torch.cos(2 * omega), torch.sin(1 * omega), torch.cos(1 * omega)])
    torch.testing.assert_close(table[patch], expected.float())


def test_rope_rotates_pairs_keeps_norms_and_depends_only_on_offset():
    K = 8
    rope = RotaryPosition(K, base=10000.0)
    q, k = torch.randn(1, 2, 5, K), torch.randn(1, 2, 5, K)
    pos = torch.arange(5)
    rq, rk = rope.rotate(q, k, pos)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    # by hand: pair (i, i + K/2) turns by angle pos * base^(-2i/K)
    t, i = 3, 1
    theta = t * 10000 ** (-2 * i / K)
    a, b = q[0, 0, t, i], q[0, 0, t, i + K // 2]
    assert rq[0, 0, t, i].item() == pytest.approx((a * math.cos(theta) - b * math.sin(theta)).item(), abs=1e-5)
    assert rq[0, 0, t, i + K // 2].item() == pytest.approx((b * math.cos(theta) + a * math.sin(theta)).item(), abs=1e-5)
    # q.k depends only on the offset: shift every position by 7
    sq, sk = rope.rotate(q, k, pos + 7)
    torch.testing.assert_close(rq @ rk.transpose(-1, -2), sq @ sk.transpose(-1, -2), atol=1e-5, rtol=1e-5)
    # per-row positions [B, T] match the shared [T] ones row by row
    bq, bk = rope.rotate(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), torch.stack([pos, pos + 7]))
    torch.testing.assert_close(bq[0], rq[0])
    torch.testing.assert_close(bq[1] @ bk[1].transpose(-1, -2), rq[0] @ rk[0].transpose(-1, -2), atol=1e-5, rtol=1e-5)


def test_alibi_slopes_and_bias():
    assert alibi_slopes(8) == pytest.approx([2 ** -(i + 1) for i in range(8)])
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence
    assert alibi_slopes(12) == pytest.approx([2 ** -(i + 1) for i in range(8)] + [2 ** -(0.5 + i) for i in range(4)])
    bias = AlibiPosition().bias(2, torch.arange(3), torch.arange(3))
    expected = -torch.tensor([2**-4, 2**-8])[:, None, None] * torch.tensor([[0, 1, 2], [1, 0, 1], [2, 1, 0]])
    assert bias.shape == (1, 2, 3, 3)
    torch.testing.assert_close(bias.dense(), expected[None])
    t, s = torch.tensor([[2], [0]]), torch.tensor([[0, 1]])  # any pairs, without the dense tensor
    torch.testing.assert_close(bias.at(0, 1, t, s), expected[1][t, s])
    # per row positions (a packed row: positions restart at each document)
    rows = AlibiPosition().bias(2, torch.tensor([[0, 1, 0], [0, 1, 2]]), torch.tensor([[0, 1, 0], [0, 1, 2]]))
    assert rows.shape == (2, 2, 3, 3) and rows.dense()[0, 0, 2, 0] == 0 and rows.dense()[1, 0, 2, 0] == -2 * 2**-4
    none = NoPosition()
    assert none.bias(2, torch.arange(3), torch.arange(3)) is None


def reference_attention(q, k, v, allowed):
    """softmax(q k^T / sqrt(K) masked) v, with key/value heads repeated to the query heads."""
    H, G = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal,padded", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("T,grad", [(5, True), (12, False), (24, True), (24, False), (48, True)])
@pytest.mark.parametrize("path", ["zoo", "sdpa"])  # zoo's CPU attention, or SDPA's kernels
def test_attention_equals_reference_math(n_kv_heads, causal, padded, T, grad, path, monkeypatch):
    import zoo.kernels.cpu.attention as A

    calls = []
    real_apply = A._CpuAttention.apply
    monkeypatch.setattr(A._CpuAttention, "apply", lambda *a: calls.append(1) or real_apply(*a))
    monkeypatch.setattr(A, "_ZOO_KEYS", {torch.float32: (1000, 1000)} if path == "zoo" else {})
    B, D, H, K, V = 2, 16, 4, 6, 3
    attn = Attention(D, n_heads=H, n_kv_heads=n_kv_heads, head_dim=K, v_head_dim=V).eval()
    x = torch.randn(B, T, D, requires_grad=grad)
    pad = torch.ones(B, T, dtype=torch.bool)
    if padded:
        pad[0, -2:] = False
    mask, is_causal = attention_mask(q_len=T, k_len=T, causal=causal, padding_mask=pad if padded else None)
    out = attn(x, mask=mask, is_causal=is_causal)
    assert len(calls) == (path == "zoo" and (grad or T >= A._MIN_QUERIES))
    q, k, v = attn.qkv(x).split([H * K, n_kv_heads * K, n_kv_heads * V], dim=-1)
    q = q.view(B, T, H, K).transpose(1, 2)
    k = k.view(B, T, n_kv_heads, K).transpose(1, 2)
    v = v.view(B, T, n_kv_heads, V).transpose(1, 2)
    allowed = torch.ones(T, T, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    allowed = allowed[None, None] & pad[:, None, None, :]
    ref = reference_attention(q, k, v, allowed).transpose(1, 2).reshape(B, T, H * V)
    ref = attn.out(ref)
    real = pad  # padded query rows are free to differ
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-5)
    if grad:
        w = torch.randn_like(out) * real[..., None]
        (dx,) = torch.autograd.grad((out * w).sum(), x)
        (dx_ref,) = torch.autograd.grad((ref * w).sum(), x)
        torch.testing.assert_close(dx, dx_ref, atol=1e-5, rtol=1e-5)


def test_gqa_equals_mha_with_repeated_key_value_heads():
    D, H, G, K = 16, 4, 2, 4
    gqa = Attention(D, n_heads=H, n_kv_heads=G, head_dim=K, v_head_dim=K).eval()
    mha = Attention(D, n_heads=H, n_kv_heads=H, head_dim=K, v_head_dim=K).eval()
    wq, wk, wv = gqa.qkv.weight.split([H * K, G * K, G * K])
    bq, bk, bv = gqa.qkv.bias.split([H * K, G * K, G * K])

    def repeat(w):  # (G*K, ...) -> (H*K, ...): each kv head serves H/G query heads
        return w.view(G, K, *w.shape[1:]).repeat_interleave(H // G, dim=0).reshape(H * K, *w.shape[1:])

    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, repeat(bk), repeat(bv)]))
        mha.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(2, 6, D)
    torch.testing.assert_close(gqa(x, is_causal=True), mha(x, is_causal=True), atol=1e-6, rtol=1e-5)


def test_cross_attention_reads_memory_and_its_padding():
    attn = Attention(8, n_heads=2, n_kv_heads=2, head_dim=4, v_head_dim=4, cross=True, kv_dim=8).eval()
    x, memory = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
    keep = torch.tensor([[True, True, True, False, False]])
    masked = attn(x, memory, mask=keep[:, None, None, :])
    torch.testing.assert_close(masked, attn(x, memory[:, :3]), atol=1e-6, rtol=1e-5)


def test_causal_mask_with_more_keys_than_queries():
    mask, _ = attention_mask(q_len=2, k_len=5, causal=True, padding_mask=torch.ones(1, 5, dtype=torch.bool))
    assert mask[0, 0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert attention_mask(q_len=4, k_len=4, causal=True) == (None, True)


def test_ffns_by_hand():
    x = torch.randn(2, 3, 8)
    mlp = MLP(8, 12, activation=torch.nn.ReLU())
    torch.testing.assert_close(mlp(x), F.relu(x @ mlp.fc1.weight.T + mlp.fc1.bias) @ mlp.fc2.weight.T + mlp.fc2.bias)
    glu = GatedMLP(8, 12, bias=False, activation=torch.nn.SiLU())
    gate, up = glu.fc1.weight[:12], glu.fc1.weight[12:]
    torch.testing.assert_close(glu(x), (F.silu(x @ gate.T) * (x @ up.T)) @ glu.fc2.weight.T)


def test_rmsnorm_formula():
    norm = RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_()
    x = torch.randn(3, 6)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize("block_cls", [PreNormBlock, PostNormBlock, PostSublayerNormBlock, ParallelBlock, "shared norm"])
def test_block_placement_formulas(block_cls):
    D = 8
    attn = Attention(D, n_heads=2, n_kv_heads=2, head_dim=4, v_head_dim=4)
    ffn = MLP(D, 16, activation=torch.nn.GELU())
    n1, n2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
    with torch.no_grad():
        for n in (n1, n2):
            n.weight.normal_(1.0, 0.3), n.bias.normal_(0.0, 0.3)
    if block_cls == "shared norm":
        block = ParallelBlock(attn=attn, ffn=ffn, attn_norm=n1, ffn_norm=None).eval()
    else:
        block = block_cls(attn=attn, ffn=ffn, attn_norm=n1, ffn_norm=n2).eval()
    x = torch.randn(2, 4, D)
    ctx = BlockContext(is_causal=True, pos=NoPosition(), positions=torch.arange(4))
    a = lambda h: attn(h, is_causal=True)  # noqa: E731
    if block_cls is PreNormBlock:
        h = x + a(n1(x))
        expected = h + ffn(n2(h))
    elif block_cls is PostNormBlock:
        h = n1(x + a(x))
        expected = n2(h + ffn(h))
    elif block_cls is PostSublayerNormBlock:  # OLMo 2
        h = x + n1(a(x))
        expected = h + n2(ffn(h))
    elif block_cls is ParallelBlock:  # GPT-NeoX
        expected = x + a(n1(x)) + ffn(n2(x))
    else:  # GPT-J, PaLM
        expected = x + a(n1(x)) + ffn(n1(x))
    torch.testing.assert_close(block(x, ctx), expected)
    with pytest.raises(ValueError, match="no cross-attention"):
        ParallelBlock(attn=attn, ffn=ffn, attn_norm=n1, ffn_norm=n2, cross_attn=attn, cross_norm=n1)


def _randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Norm weights and biases away from 1 and 0, so a missing or misplaced norm shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module.eval()


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_qk_norm_per_head_by_hand(kind):
    """scope head (timm, Qwen3, Gemma 3): each head's K features normalised, one [K] weight for every head."""
    B, T, D, H, G, K = 2, 5, 16, 4, 2, 6
    attn = _randomized(Attention(D, n_heads=H, n_kv_heads=G, head_dim=K, v_head_dim=K, qk_norm=kind, qk_eps=1e-6))
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (K,)
    x = torch.randn(B, T, D)
    q, k, v = attn.qkv(x).split([H * K, G * K, G * K], dim=-1)
    q, k, v = (t.view(B, T, -1, K).transpose(1, 2) for t in (q, k, v))

    def norm(t, n):
        if kind == "layernorm":
            return (t - t.mean(-1, keepdim=True)) / torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + 1e-6) * n.weight + n.bias
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * n.weight

    q, k = norm(q, attn.q_norm), norm(k, attn.k_norm).repeat_interleave(H // G, dim=1)
    ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(K), dim=-1) @ v.repeat_interleave(H // G, dim=1)
    ref = attn.out(ref.transpose(1, 2).reshape(B, T, H * K))
    torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)


def test_qk_norm_over_the_whole_projection_by_hand():
    """scope all (OLMo 2): the whole q [H*K] and k [G*K] normalised before the head split, then RoPE."""
    B, T, D, H, G, K = 2, 5, 16, 4, 2, 6
    attn = _randomized(Attention(D, n_heads=H, n_kv_heads=G, head_dim=K, v_head_dim=K, qk_norm="rmsnorm", qk_scope="all"))
    assert attn.q_norm.weight.shape == (H * K,) and attn.k_norm.weight.shape == (G * K,)
    x, rope, pos = torch.randn(B, T, D), RotaryPosition(K), torch.arange(T)
    q, k, v = attn.qkv(x).split([H * K, G * K, G * K], dim=-1)
    q, k = (t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * n.weight for t, n in ((q, attn.q_norm), (k, attn.k_norm)))
    q, k, v = (t.view(B, T, -1, K).transpose(1, 2) for t in (q, k, v))
    q, k = rope.rotate(q, k, pos)
    k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    ref = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(K)).masked_fill(~causal, float("-inf")), dim=-1) @ v
    ref = attn.out(ref.transpose(1, 2).reshape(B, T, H * K))
    torch.testing.assert_close(attn(x, is_causal=True, pos=rope, positions=pos), ref, atol=1e-5, rtol=1e-5)


def test_cross_attention_normalises_queries_and_memory_keys():
    attn = _randomized(Attention(8, n_heads=2, n_kv_heads=2, head_dim=4, v_head_dim=4, cross=True, qk_norm="layernorm"))
    x, memory = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
    q = attn.q_norm(attn.q(x).view(1, 3, 2, 4)).transpose(1, 2)
    k, v = attn.kv(memory).split([8, 8], dim=-1)
    k, v = attn.k_norm(k.view(1, 5, 2, 4)).transpose(1, 2), v.view(1, 5, 2, 4).transpose(1, 2)
    ref = attn.out((torch.softmax(q @ k.transpose(-1, -2) / 2, dim=-1) @ v).transpose(1, 2).reshape(1, 3, 8))
    torch.testing.assert_close(attn(x, memory), ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("block_cls", [PreNormBlock, PostNormBlock])
def test_layer_scale_multiplies_each_sublayer_before_the_residual_add(block_cls):
    D = 8
    attn, cross = Attention(D, n_heads=2, n_kv_heads=2, head_dim=4, v_head_dim=4), Attention(
        D, n_heads=2, n_kv_heads=2, head_dim=4, v_head_dim=4, cross=True)
    ffn = MLP(D, 16, activation=torch.nn.GELU())
    n1, n2, n3 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
    s1, s2, s3 = LayerScale(D, 1e-5), LayerScale(D, 1e-5), LayerScale(D, 1e-5)
    assert torch.equal(s1.gamma, torch.full((D,), 1e-5))
    block = block_cls(attn=attn, ffn=ffn, attn_norm=n1, ffn_norm=n2, cross_attn=cross, cross_norm=n3,
                      ls_attn=s1, ls_cross=s3, ls_ffn=s2)
    _randomized(block)
    x, memory = torch.randn(2, 4, D), torch.randn(2, 3, D)
    ctx = BlockContext(is_causal=True, pos=NoPosition(), positions=torch.arange(4), memory=memory)
    if block_cls is PreNormBlock:
        h = x + s1.gamma * attn(n1(x), is_causal=True)
        h = h + s3.gamma * cross(n3(h), memory)
        expected = h + s2.gamma * ffn(n2(h))
    else:
        h = n1(x + s1.gamma * attn(x, is_causal=True))
        h = n3(h + s3.gamma * cross(h, memory))
        expected = n2(h + s2.gamma * ffn(h))
    torch.testing.assert_close(block(x, ctx), expected)


@pytest.mark.parametrize("block_cls", [PostSublayerNormBlock, ParallelBlock])
def test_layer_scale_in_post_sublayer_and_parallel_blocks(block_cls):
    D = 8
    attn, ffn = Attention(D, n_heads=2, n_kv_heads=2, head_dim=4, v_head_dim=4), MLP(D, 16, activation=torch.nn.GELU())
    n1, n2, s1, s2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D), LayerScale(D, 0.1), LayerScale(D, 0.1)
    block = _randomized(block_cls(attn=attn, ffn=ffn, attn_norm=n1, ffn_norm=n2, ls_attn=s1, ls_ffn=s2))
    x = torch.randn(2, 4, D)
    ctx = BlockContext(is_causal=True, pos=NoPosition(), positions=torch.arange(4))
    if block_cls is PostSublayerNormBlock:
        h = x + s1.gamma * n1(attn(x, is_causal=True))
        expected = h + s2.gamma * n2(ffn(h))
    else:
        expected = x + s1.gamma * attn(n1(x), is_causal=True) + s2.gamma * ffn(n2(x))
    torch.testing.assert_close(block(x, ctx), expected)


def test_partial_rope_turns_the_first_dimensions_only():
    """GPT-NeoX's partial rotary: the first R of K dimensions turn as a rope of size R; the rest pass."""
    K, R = 12, 4
    partial, whole = RotaryPosition(K, base=500.0, rotary_dims=R), RotaryPosition(R, base=500.0)
    q, k = torch.randn(2, 3, 5, K), torch.randn(2, 1, 5, K)
    pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    pq, pk = partial.rotate(q, k, pos)
    wq, wk = whole.rotate(q[..., :R], k[..., :R], pos)
    torch.testing.assert_close(pq, torch.cat([wq, q[..., R:]], dim=-1), rtol=0, atol=0)
    torch.testing.assert_close(pk, torch.cat([wk, k[..., R:]], dim=-1), rtol=0, atol=0)
    partial.inv_freq.zero_()
    partial.reset_buffers()
    torch.testing.assert_close(partial.inv_freq, whole.inv_freq, rtol=0, atol=0)


def test_rmsnorm_unit_offset_scales_by_one_plus_weight():
    norm = RMSNorm(6, eps=1e-6, unit_offset=True)
    assert torch.equal(norm.weight, torch.zeros(6))  # the scale starts at one
    with torch.no_grad():
        norm.weight.uniform_()
    x = torch.randn(3, 6)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
    torch.testing.assert_close(norm(x), expected)


def test_output_bias_apart_from_the_projection_biases():
    """Qwen2: biases on q, k and v, none on the output projection."""
    attn = Attention(8, n_heads=2, n_kv_heads=1, head_dim=4, v_head_dim=4, bias=True, out_bias=False)
    assert attn.qkv.bias is not None and attn.out.bias is None
    assert Attention(8, n_heads=2, n_kv_heads=2, head_dim=4, v_head_dim=4, bias=False).out.bias is None


def test_sliding_window_mask():
    """Each query sees itself and the window - 1 keys before it; with more keys than queries (a cache)
    the window ends at each query's own key."""
    mask, is_causal = attention_mask(q_len=5, k_len=5, causal=True, window=2)
    assert not is_causal and mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    mask, _ = attention_mask(q_len=2, k_len=4, causal=True, window=3)
    assert mask[0, 0].int().tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    assert attention_mask(q_len=4, k_len=4, causal=True, window=4) == (None, True)  # the window covers every key


@pytest.mark.parametrize("window", [1, 4, 5, 8, 9])
def test_bidirectional_window_mask(window):
    """Not causal (an encoder's local attention), each query sees the keys at most window // 2 slots
    away on either side, padding slots counted, padded keys masked; a window that covers every key
    leaves no mask."""
    T, i = 5, torch.arange(5)
    near = (i[:, None] - i[None]).abs() <= window // 2
    pad = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    mask, is_causal = attention_mask(q_len=T, k_len=T, causal=False, window=window, padding_mask=pad)
    assert not is_causal and torch.equal(mask[:, 0, :3], (near & pad[:, None, :])[:, :3])
    plain = attention_mask(q_len=T, k_len=T, causal=False, window=window)
    assert plain == (None, False) if window // 2 >= T - 1 else torch.equal(plain[0][0, 0], near)


def test_interleaved_rope_turns_each_pair_2i_2i_plus_1_by_hand():
    """``pairs: interleaved`` (GPT-J, Cohere): dimensions (2i, 2i + 1) as the complex number
    x_2i + j x_2i+1, times e^(j pos base^(-2i/K)); partial rotary keeps the rest as they are."""
    K, base = 8, 500.0
    rope = RotaryPosition(K, base=base, interleaved=True)
    q, k = torch.randn(2, 3, 5, K), torch.randn(2, 1, 5, K)
    pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 1, 2, 3]])
    rq, rk = rope.rotate(q, k, pos)
    theta = pos[:, None, :, None].double() * base ** (-torch.arange(0, K, 2).double() / K)  # (B, 1, T, K/2)
    z = torch.complex(q[..., 0::2].double(), q[..., 1::2].double()) * torch.polar(torch.ones_like(theta), theta)
    torch.testing.assert_close(rq, torch.stack([z.real, z.imag], dim=-1).flatten(-2).float(), atol=1e-5, rtol=1e-5)
    # the same turns as the rotate-half layout on the dimensions reordered [0, 2, 4, ... | 1, 3, 5, ...]
    order = torch.cat([torch.arange(0, K, 2), torch.arange(1, K, 2)])
    hq, hk = RotaryPosition(K, base=base).rotate(q[..., order], k[..., order], pos)
    torch.testing.assert_close(rq[..., order], hq, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rk[..., order], hk, atol=1e-6, rtol=1e-6)
    partial, whole = RotaryPosition(12, base=base, rotary_dims=K, interleaved=True), rope
    pq, _ = partial.rotate(torch.cat([q, q[..., :4]], -1), torch.cat([k, k[..., :4]], -1), pos)
    torch.testing.assert_close(pq, torch.cat([rq, q[..., :4]], -1), rtol=0, atol=0)


def test_a_float_score_scale_replaces_one_over_sqrt_head_size():
    B, T, D, H, K = 2, 5, 16, 4, 4
    attn = _randomized(Attention(D, n_heads=H, n_kv_heads=2, head_dim=K, v_head_dim=K, scale=0.3)).eval()
    x = torch.randn(B, T, D)
    q, k, v = attn.qkv(x).split([H * K, 2 * K, 2 * K], dim=-1)
    q, k, v = (t.view(B, T, -1, K).transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    ref = attn.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * K))
    torch.testing.assert_close(attn(x, is_causal=True), ref, atol=1e-5, rtol=1e-5)


def test_multipliers_of_embeddings_residuals_and_logits_by_hand():
    """``embedding.multiplier``, ``block.residual_scale`` (with and without layer scale), ``head.scale``
    and ``head.divisor`` (Granite, Cohere), against the plain model's parts."""
    import zoo
    from zoo.components.block import ResidualScale

    base = ["vocab_size=31", "d_model=16", "n_layers=1", "max_seq_len=16", "block.attention.n_heads=2",
            "block.attention.n_kv_heads=1", "block.ffn.hidden=24"]
    plain = zoo.build(zoo.load_spec("granite-tiny", base + ["embedding.multiplier=null", "block.residual_scale=null",
                                                              "head.divisor=null"]), seed=0).eval()
    model = zoo.build(zoo.load_spec("granite-tiny", base + ["head.scale=0.5"]), seed=0).eval()
    model.load_state_dict(plain.state_dict())
    x = torch.randint(0, 31, (2, 6))
    torch.testing.assert_close(model.tok_emb(x), plain.tok_emb(x) * 12.0, rtol=0, atol=0)
    b, ctx = plain.stack.blocks[0], BlockContext(is_causal=True, pos=plain.position, positions=torch.arange(6))
    h = torch.randn(2, 6, 16)
    a = h + 0.22 * b.attn(b.attn_norm(h), is_causal=True, pos=ctx.pos, positions=ctx.positions)
    torch.testing.assert_close(model.stack.blocks[0](h, ctx), a + 0.22 * b.ffn(b.ffn_norm(a)), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(model.head(h), plain.head(h) * 0.5 / 16.0, rtol=0, atol=0)
    assert isinstance(model.stack.blocks[0].ls_attn, ResidualScale) and not list(model.stack.blocks[0].ls_attn.parameters())
    scaled = LayerScale(16, 0.1, 0.22)
    torch.testing.assert_close(scaled(h), h * scaled.gamma * 0.22, rtol=0, atol=0)
