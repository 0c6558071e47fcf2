"""Llama 4's parts, each against the HF module it mirrors with the same weights (or, for the mask,
HF's own mask function): the MoE block (top-1 sigmoid router weighting the experts' input, shared
expert without a gate), the weightless qk norm, chunked attention's mask with left padding, and a
chunked zoo decoder decoding with a cache (dynamic and static) as its full pass, on the dense and
blocked backends. The whole class converts both ways in tests/test_conformance.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo import kernels
from zoo.components.attention import PlainRMSNorm
from zoo.components.moe import MoE
from zoo.kernels import Mask, MaskError, attention_backend, blocked

transformers = pytest.importorskip("transformers")
llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")


def _config(**kw):
    return transformers.Llama4TextConfig(hidden_size=16, intermediate_size=12, num_local_experts=4, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=11, **kw)


@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_equals_llama4_text_moe_with_its_weights(top_k):
    torch.manual_seed(0)
    ref = llama4.Llama4TextMoe(_config(num_experts_per_tok=top_k)).eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.3)
    moe = MoE(16, 12, n_experts=4, top_k=top_k, activation=torch.nn.SiLU(), shared_hidden=12, shared_gate=False,
              sigmoid_after_topk=True, weight_input=True).eval()
    with torch.no_grad():
        moe.router.weight.copy_(ref.router.weight)
        moe.w_gate_up.copy_(ref.experts.gate_up_proj.transpose(1, 2))
        moe.w_down.copy_(ref.experts.down_proj.transpose(1, 2))
        s = ref.shared_expert
        moe.shared.fc1.weight.copy_(torch.cat([s.gate_proj.weight, s.up_proj.weight]))
        moe.shared.fc2.weight.copy_(s.down_proj.weight)
    x = torch.randn(2, 7, 16)
    want, logits = ref(x)
    got = moe(x)
    assert (got.reshape(-1, 16) - want).abs().max() < 1e-5
    assert torch.equal(moe.router_logits, logits)
    experts = moe.routed
    weights = torch.sigmoid(logits.gather(1, experts))  # the router's weights: sigmoid of the picked logits
    _, w, e = moe.route(x.reshape(-1, 16))
    assert torch.equal(e, experts) and (w - weights).abs().max() < 1e-6
    # the fixed-shape path (a compiled decoding step's) sums the same
    fixed = moe._fixed_shape(x.reshape(-1, 16), w, e)
    assert (fixed - want).abs().max() < 1e-5


def test_moe_weighting_the_input_trains():
    torch.manual_seed(0)
    moe = MoE(16, 12, n_experts=4, top_k=1, activation=torch.nn.SiLU(), shared_hidden=12, shared_gate=False,
              sigmoid_after_topk=True, weight_input=True)
    moe(torch.randn(3, 5, 16)).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (moe.router.weight, moe.w_gate_up, moe.w_down))


def test_a_sigmoid_router_leaves_the_softmax_fields_alone():
    from zoo.spec.moe import MoERouterSpec

    with pytest.raises(ValueError, match="sigmoid_after_topk"):
        MoERouterSpec(sigmoid_after_topk=True, norm_topk_prob=False)


def test_the_weightless_qk_norm_equals_llama4_l2_norm():
    x = torch.randn(2, 3, 5, 8) * 4
    assert (PlainRMSNorm(1e-5)(x) - llama4.Llama4TextL2Norm(1e-5)(x)).abs().max() < 1e-6


def test_chunked_mask_equals_hf_with_left_padding():
    from transformers.masking_utils import chunked_causal_mask_function, sdpa_mask

    T, chunk = 11, 3
    padding = torch.ones(2, T, dtype=torch.bool)
    padding[1, :4] = False  # left padding: chunks count from the first real token
    positions = (padding.long().cumsum(1) - 1).clamp(min=0)
    mask = Mask(T, T, causal=True, padding=padding, chunk=chunk, chunks=positions // chunk)
    left = (~padding).long().cumprod(1).sum(1)
    want = sdpa_mask(batch_size=2, q_length=T, kv_length=T,
                     mask_function=chunked_causal_mask_function(chunk, left), attention_mask=padding.long(),
                     allow_is_causal_skip=False)
    dense, _ = mask.dense()
    real = padding[:, :, None] & padding[:, None, :]  # padded queries see themselves in zoo (no empty row)
    assert torch.equal(dense[:, 0] & real, want[:, 0] & real)
    assert mask.reach() == (chunk - 1, 0)
    with pytest.raises(MaskError, match="chunk"):
        Mask(T, T, causal=True, chunk=chunk)


@pytest.mark.parametrize("causal", [True, False])
def test_blocked_attention_on_chunks_equals_the_dense_mask(causal, monkeypatch):
    monkeypatch.setattr(blocked, "MIN_BLOCK", 4)
    T, B = 37, 2
    padding = torch.arange(T)[None] < torch.tensor([T, 30])[:, None]
    chunks = (torch.arange(T)[None] // 6).expand(B, -1)
    m = Mask(T, T, causal=causal, padding=padding, chunk=6, chunks=chunks)
    q, k, v = (torch.randn(B, 2, T, 8, requires_grad=True) for _ in range(3))
    dense, is_causal = m.dense()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=is_causal)
    with attention_backend("blocked"):
        assert kernels.backend_for(m, q) == "blocked"
        got = kernels.attention(q, k, v, mask=m)
    assert (got - ref).abs().max() < 1e-5


def _chunked_decoder(temperature: bool = False):
    spec = {"family": "decoder", "d_model": 32, "n_layers": 3, "vocab_size": 29, "max_seq_len": 64,
            "position": {"kind": "rope", "pairs": "interleaved"},
            "block": {"kind": "pre", "norm": {"kind": "rmsnorm"},
                      "attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "bias": False, "chunk": 4,
                                    "qk_norm": {"kind": "rmsnorm", "affine": False}},
                      "ffn": {"kind": "swiglu", "hidden": 48, "bias": False}},
            "layers": [{"at": 1, "position": {"kind": "none"},
                        "block": {"attention": {"chunk": None, "qk_norm": None,
                                                "temperature": {"floor": 3, "scale": 0.5} if temperature else None}}}]}
    return zoo.build(spec, seed=0).eval()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_chunked_decoder_decodes_as_its_full_pass(cache):
    model = _chunked_decoder(temperature=True)
    prompt = torch.randint(0, 29, (2, 5), generator=torch.Generator().manual_seed(0))
    padding = torch.ones(2, 5, dtype=torch.bool)
    padding[1, :2] = False
    out = zoo.generate(model, prompt, padding_mask=padding, max_new_tokens=9, cache=cache)
    tokens = torch.cat([prompt, out.tokens], 1)
    full = torch.cat([padding, torch.ones(2, tokens.shape[1] - 5, dtype=torch.bool)], 1)
    with torch.no_grad():
        logits = model(tokens, padding_mask=full)
        logits = logits.logits if hasattr(logits, "logits") else logits
    assert torch.equal(logits[:, 4:-1].argmax(-1), tokens[:, 5:])  # each new token the full pass's greedy pick
    picked = logits[:, 4:-1].log_softmax(-1).gather(-1, tokens[:, 5:, None]).sum((1, 2))
    assert (picked - out.scores).abs().max() < 1e-4  # and the cached steps' log-probabilities its
    assert model.stack.new_cache(64).layers[0].window == 4  # a chunked layer keeps its chunk's keys only


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (FlexAttention runs on CUDA only)")
def test_flex_attention_on_chunks_equals_the_dense_mask_on_the_gpu():
    T, B = 257, 2
    padding = (torch.arange(T)[None] < torch.tensor([T, 200])[:, None]).cuda()
    positions = (padding.long().cumsum(1) - 1).clamp(min=0)
    m = Mask(T, T, causal=True, padding=padding, chunk=48, chunks=positions // 48, device=torch.device("cuda"))
    q, k, v = (torch.randn(B, 4, T, 16, device="cuda") for _ in range(3))
    dense, is_causal = m.dense()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=is_causal)
    with attention_backend("flex"):
        got = kernels.attention(q, k, v, mask=m)
    real = padding[:, None, :, None]
    assert ((got - ref) * real).abs().max() < 1e-4
