"""gpt-oss's parts, each against the HF module it mirrors with the same weights: attention sinks
(``attention.sinks``) against ``GptOssAttention``, the experts with router and expert biases and the
clamped SwiGLU (``router.bias``, ``expert.bias``, ``expert.limit``/``alpha``/``up_offset``) against
``GptOssMLP``, the dense clamped SwiGLU against ``GptOssExperts``' gate; the sinks' parameters in
the summary, the cached decode of a model with sinks equal to its full pass, and ``gpt-oss-tiny``
training. The whole class converts in tests/test_conformance.py; the presets are counted in
tests/test_presets_hf.py."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.components.attention import Attention
from zoo.summary import summarize

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.reference

D, H, G, K, F, E, TOP = 24, 4, 2, 6, 12, 5, 2  # odd sizes


def _config(**kw):
    return transformers.GptOssConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=G, head_dim=K,
                                     intermediate_size=F, num_local_experts=E, num_experts_per_tok=TOP,
                                     swiglu_limit=0.8, attn_implementation="eager", **kw)


def close(a, b, tol=1e-5) -> bool:
    """Within ``tol`` of b's scale (at least 1): fp32 rounding grows with the values."""
    return bool((a - b).abs().max() < tol * max(1.0, b.abs().max().item()))


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=g))
    return module


@pytest.mark.parametrize("window", [None, 3])
def test_sink_attention_equals_hf_gpt_oss_attention_forward_and_gradients(window):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    hf = _randomize(GptOssAttention(_config(), layer_idx=0))
    zoo_attn = Attention(D, n_heads=H, n_kv_heads=G, head_dim=K, v_head_dim=K, kernel="scores", sinks=True)
    with torch.no_grad():
        a = hf
        zoo_attn.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        zoo_attn.qkv.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        zoo_attn.out.weight.copy_(a.o_proj.weight)
        zoo_attn.out.bias.copy_(a.o_proj.bias)
        zoo_attn.sinks.copy_(a.sinks)
    T = 7
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(1))
    i = torch.arange(T)
    allowed = (i[None, :] <= i[:, None]) & (window is None or (i[:, None] - i[None, :] < (window or T)))
    allowed = allowed[None, None].expand(2, 1, T, T).clone()
    allowed[1, :, :, :2] = False  # the second sequence's first two keys are padding
    allowed[1, :, :2, :2] = torch.eye(2, dtype=torch.bool)  # (its padding queries see themselves)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    identity = (torch.ones(2, T, K // 2), torch.zeros(2, T, K // 2))  # cos, sin: no rotation on either side
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = zoo_attn(xa, mask=allowed)
    yb, _ = hf(xb, position_embeddings=identity, attention_mask=additive)
    assert close(ya, yb)
    g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(2))
    ya.backward(g)
    yb.backward(g)
    assert close(xa.grad, xb.grad)
    assert close(zoo_attn.sinks.grad, hf.sinks.grad)
    # the sinks take weight: without them the output differs
    with torch.no_grad():
        zoo_attn.sinks.fill_(-1e4)
        assert (zoo_attn(x, mask=allowed) - yb).abs().max() > 1e-3


def test_sinks_need_the_scores_kernel_and_the_spec_picks_it():
    with pytest.raises(ValueError, match="sinks"):
        Attention(D, n_heads=H, n_kv_heads=G, head_dim=K, v_head_dim=K, sinks=True)
    spec = zoo.spec.AttentionSpec(kind="gqa", n_heads=H, n_kv_heads=G, sinks=True)
    assert spec.kernel == "scores" and zoo.spec.AttentionSpec(n_heads=H).kernel == "fused"


def _moe_spec(**expert):
    return zoo.spec.MoESpec.model_validate({
        "n_experts": E, "top_k": TOP, "router": {"softmax_before_topk": False, "bias": True},
        "expert": {"kind": "swiglu", "hidden": F, "bias": True, "limit": 0.8, "alpha": 1.702, "up_offset": 1.0, **expert}})


@pytest.mark.parametrize("compiled_shape", [False, True])
def test_experts_equal_hf_gpt_oss_mlp_forward_and_gradients(compiled_shape, monkeypatch):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    hf = _randomize(GptOssMLP(_config()))
    moe = zoo.registry("ffn").builder("moe")(_moe_spec(), dim=D, dropout=0.0)
    with torch.no_grad():  # HF: [E, D, 2F] with gate and up columns alternating; zoo: [E, 2F, D] rows [gate | up]
        gu, b = hf.experts.gate_up_proj, hf.experts.gate_up_proj_bias
        moe.w_gate_up.copy_(torch.cat([gu[..., ::2], gu[..., 1::2]], dim=-1).transpose(1, 2))
        moe.b_gate_up.copy_(torch.cat([b[:, ::2], b[:, 1::2]], dim=-1))
        moe.w_down.copy_(hf.experts.down_proj.transpose(1, 2))
        moe.b_down.copy_(hf.experts.down_proj_bias)
        moe.router.weight.copy_(hf.router.weight)
        moe.router.bias.copy_(hf.router.bias)
    x = torch.randn(3, 7, D, generator=torch.Generator().manual_seed(1))
    if compiled_shape:  # the decoding step's routing-independent paths: each token's experts, every expert
        moe.eval()
        for few in (x[:2, :1], x):  # N * k <= E: the picked experts gathered; else all of them
            with torch.no_grad():
                logits, weights, experts = moe.route(few.reshape(-1, D))
                ya = moe._fixed_shape(few.reshape(-1, D), weights, experts).reshape(few.shape)
                yb, _ = hf(few)
            assert close(ya, yb)
        return
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, (yb, _) = moe(xa), hf(xb)
    assert close(ya, yb)
    g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(2))
    ya.backward(g)
    yb.backward(g)
    assert close(xa.grad, xb.grad)
    assert close(moe.router.bias.grad, hf.router.bias.grad)
    assert close(moe.b_down.grad, hf.experts.down_proj_bias.grad)
    hb = hf.experts.gate_up_proj_bias.grad
    assert (moe.b_gate_up.grad - torch.cat([hb[:, ::2], hb[:, 1::2]], dim=-1)).abs().max() < 1e-5
    assert moe.expert_parameters() == sum(p.numel() for p in hf.experts.parameters())


def test_dense_clamped_swiglu_equals_hf_gpt_oss_gate():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    spec = zoo.spec.SwiGLUSpec(hidden=F, limit=0.8, alpha=1.702, up_offset=1.0)
    assert spec.clamped and not zoo.spec.SwiGLUSpec(hidden=F).clamped
    mlp = _randomize(zoo.registry("ffn").builder("swiglu")(spec, dim=D, dropout=0.0))
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1))
    gate, up = mlp.fc1(x).chunk(2, dim=-1)
    interleaved = torch.stack([gate, up], dim=-1).flatten(-2)  # HF's [g0, u0, g1, u1, ...]
    want = mlp.fc2(GptOssExperts(_config())._apply_gate(interleaved))
    assert (mlp(x) - want).abs().max() < 1e-6
    assert (gate.abs() > 0.8).any() and (up.abs() > 0.8).any()  # the clamp bites


def test_expert_options_are_checked_and_other_moe_converters_refuse_them():
    with pytest.raises(ValueError, match="limit"):
        _moe_spec(limit=-1.0)
    from zoo.interop import ConversionError, to_hf

    spec = zoo.load_spec("olmoe-tiny").model_dump(mode="json")
    spec["block"]["ffn"]["expert"]["bias"] = True
    with pytest.raises(ConversionError, match=r"block\.ffn\.expert\.bias"):
        to_hf(zoo.build(zoo.parse_spec(spec), device="meta"), "OlmoeForCausalLM")


def _tiny(**over):
    data = zoo.load_spec("gpt-oss-tiny").model_dump(mode="json")
    data.update(vocab_size=61, d_model=32, n_layers=2, max_seq_len=64, **over)
    data["block"]["attention"].update(n_heads=4, n_kv_heads=2, window=4)
    data["block"]["ffn"].update(n_experts=4, top_k=2)
    data["block"]["ffn"]["expert"]["hidden"] = 16
    return zoo.parse_spec(data)


def test_summary_counts_the_sinks_and_the_experts_biases():
    spec = _tiny()
    model = zoo.build(spec, device="meta")
    s = summarize(spec)
    attention = 2 * ((32 + 1) * (4 + 2 + 2) * 8 + (32 + 1) * 32 + 4)  # q, k, v, out with biases, 4 sinks, per layer
    assert s.parts["attention"] == attention
    ffn = 2 * (33 * 4 + 4 * (2 * 16 * 32 + 2 * 16 + 32 * 16 + 32))  # biased router, 4 biased experts, per layer
    assert s.parts["ffn"] == ffn == sum(p.numel() for n, p in model.named_parameters() if ".ffn." in n)
    assert [row["sinks"] for row in s.layers] == [4, 4] and [row["window"] for row in s.layers] == [4, None]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_cached_greedy_decoding_with_sinks_equals_the_full_pass(cache):
    model = zoo.build(_tiny(), seed=0).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Attention):
                m.sinks.normal_(0.0, 2.0)  # sinks that take weight
    prompt = torch.randint(0, 61, (2, 6), generator=torch.Generator().manual_seed(0))
    out = zoo.generate(model, prompt, max_new_tokens=8, cache=cache).tokens
    seq = prompt
    with torch.no_grad():  # no cache: the whole sequence again at every step, past the window of 4
        for _ in range(8):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq[:, 6:])


def test_gpt_oss_tiny_trains():
    model = zoo.build(_tiny(), seed=0).train()
    tokens = torch.randint(0, 61, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert all(m.sinks.grad is not None for m in model.modules() if isinstance(m, Attention))


def test_saved_activations_of_the_clamped_swiglu_as_measured():
    spec = zoo.spec.SwiGLUSpec(hidden=F, bias=False, limit=0.8, alpha=1.702, up_offset=1.0)
    mlp = zoo.registry("ffn").builder("swiglu")(spec, dim=D, dropout=0.0)
    x = torch.randn(3, D, requires_grad=True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
        mlp(x)
    inputs = 3 * D + (D * 2 * F + F * D)  # fc1's input, the two weights
    assert sum(kept) - inputs == 3 * mlp.saved_per_token()


@pytest.mark.parametrize("path,value", [
    ("block.attention.sinks", False), ("block.ffn.router.bias", False), ("block.ffn.router.softmax_before_topk", True),
    ("block.ffn.expert.bias", False), ("block.ffn.expert.limit", None), ("block.ffn.expert.up_offset", 0.0),
    ("block.ffn.shared_hidden", 16),
])
def test_gpt_oss_refuses_what_it_does_not_compute_by_name(path, value):
    from zoo.interop import ConversionError, hf_config

    data = _tiny().model_dump(mode="json")
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = value
    with pytest.raises(ConversionError, match=path.replace(".", r"\.")):
        hf_config(zoo.parse_spec(data), "GptOssForCausalLM")


def test_a_config_whose_hidden_act_the_experts_ignore_is_refused_by_name():
    from zoo.interop import ConversionError, hf_spec

    with pytest.raises(ConversionError, match="hidden_act"):
        hf_spec(_config(num_hidden_layers=2, hidden_act="gelu"))
