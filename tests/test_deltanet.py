"""The gated DeltaNet mixer (attention.kind gated_deltanet) and Qwen3-Next's gated attention against
HF's Qwen3NextGatedDeltaNet and Qwen3NextAttention with the same weights (HF's torch paths on the
CPU: chunked and recurrent gated delta rule, the causal conv1d update)."""

from __future__ import annotations

import pytest
import torch

from zoo.components.cache import KVCache
from zoo.components.deltanet import GatedDeltaNet, chunked_delta_rule, delta_rule_step
from zoo.kernels import Mask
from zoo.spec import GatedDeltaNetSpec

qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
from transformers import Qwen3NextConfig  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402


def _config(**kw) -> Qwen3NextConfig:
    base = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=5, linear_value_head_dim=7,
                linear_conv_kernel_dim=3, rms_norm_eps=1e-5, vocab_size=50, num_experts=0, layer_types=["linear_attention", "full_attention"])
    base.update(kw)
    return Qwen3NextConfig(**base)


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    c = _config()
    ref = qn.Qwen3NextGatedDeltaNet(c, 0).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    ours = GatedDeltaNet(24, n_heads=6, key_heads=2, head_dim=5, v_head_dim=7, conv_kernel=3, eps=1e-5).eval()
    ours.load_state_dict({"qkvz.weight": ref.in_proj_qkvz.weight, "ba.weight": ref.in_proj_ba.weight,
                          "conv.weight": ref.conv1d.weight, "dt_bias": ref.dt_bias, "A_log": ref.A_log,
                          "norm.weight": ref.norm.weight, "out.weight": ref.out_proj.weight})
    return c, ref, ours


@torch.no_grad()
def test_mixer_matches_hf_over_chunks():
    _, ref, ours = _pair()
    x = torch.randn(2, 70, 24)  # more than one chunk of 64
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_mixer_left_padding_matches_hf_and_the_unpadded_row():
    _, ref, ours = _pair(1)
    x = torch.randn(2, 9, 24)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[0, :3] = False
    y = ours(x, mask=Mask(9, 9, causal=True, padding=keep))
    want = ref(x, attention_mask=keep.long())
    torch.testing.assert_close(y[keep], want[keep], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(y[0, 3:], ours(x[:1, 3:])[0], atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_mixer_decodes_through_its_state_as_hf():
    c, ref, ours = _pair(2)
    x = torch.randn(2, 11, 24)
    hf_cache, cache = DynamicCache(config=c), KVCache(1, 16)
    got, want = [], []
    for chunk in (x[:, :8], x[:, 8:9], x[:, 9:10], x[:, 10:11]):
        cache.extend(None, chunk.shape[1], 2, x.device)
        got.append(ours(chunk, cache=cache.layers[0]))
        want.append(ref(chunk, cache=hf_cache))
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(got, 1), ours(x), atol=1e-5, rtol=1e-4)


def test_chunked_and_stepped_rules_agree():
    torch.manual_seed(3)
    B, H, T, K, V = 2, 3, 70, 4, 5
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, T, K), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(B, H, T, V), -torch.rand(B, H, T), torch.rand(B, H, T)
    s0 = torch.randn(B, H, K, V)
    y1, s1 = chunked_delta_rule(q, k, v, g, beta, s0)
    y2, s2 = delta_rule_step(q, k, v, g, beta, s0)
    torch.testing.assert_close(y1, y2, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s1, s2, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_gated_attention_matches_hf():
    from zoo.components.attention import Attention
    from zoo.components.rope import RotaryPosition

    torch.manual_seed(4)
    c = _config(partial_rotary_factor=0.5)
    ref = qn.Qwen3NextAttention(c, 1).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    ours = Attention(24, n_heads=4, n_kv_heads=2, head_dim=8, v_head_dim=8, bias=False, qk_norm="rmsnorm",
                     qk_eps=1e-5, qk_unit_offset=True, gate=True).eval()
    ours.load_state_dict({"qkv.weight": torch.cat([ref.q_proj.weight, ref.k_proj.weight, ref.v_proj.weight]),
                          "out.weight": ref.o_proj.weight, "q_norm.weight": ref.q_norm.weight,
                          "k_norm.weight": ref.k_norm.weight})
    x = torch.randn(2, 6, 24)
    rope = qn.Qwen3NextRotaryEmbedding(c)
    positions = torch.arange(6)
    cos, sin = rope(x, positions[None])
    mask = torch.full((6, 6), float("-inf")).triu(1)
    want, _ = ref(x, (cos, sin), mask)
    pos = RotaryPosition(8, base=c.rope_parameters["rope_theta"], rotary_dims=4)
    torch.testing.assert_close(ours(x, is_causal=True, pos=pos, positions=positions), want, atol=1e-5, rtol=1e-4)


def test_spec_refuses_what_the_mixer_lacks():
    with pytest.raises(ValueError, match="qk_norm"):
        GatedDeltaNetSpec(qk_norm={"kind": "rmsnorm"})
    with pytest.raises(ValueError, match="key_heads"):
        GatedDeltaNetSpec(n_heads=6, key_heads=4)
    spec = GatedDeltaNetSpec(n_heads=6, key_heads=2, head_dim=5, v_head_dim=7, conv_kernel=3)
    assert "n_kv_heads" not in spec.model_dump()
    mixer = GatedDeltaNet(24, n_heads=6, key_heads=2, head_dim=5, v_head_dim=7, conv_kernel=3)
    assert spec.state_size(24) == mixer.state_elements() == 6 * 5 * 7 + 2 * (2 * 2 * 5 + 6 * 7)


def test_summary_counts_the_linear_state_per_layer_not_per_token():
    from zoo.spec import parse_spec
    from zoo.summary import summarize

    spec = parse_spec({
        "family": "decoder", "d_model": 24, "n_layers": 3, "vocab_size": 50, "max_seq_len": 64,
        "block": {"attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "v_head_dim": 8, "gate": True,
                                "bias": False},
                  "ffn": {"kind": "swiglu", "hidden": 40, "bias": False}, "norm": {"kind": "rmsnorm"}},
        "position": {"kind": "rope"},
        "layers": [{"at": "0::2", "block": {"attention": {"kind": "gated_deltanet", "n_heads": 6, "key_heads": 2,
                                                         "head_dim": 5, "v_head_dim": 7, "conv_kernel": 3,
                                                         "n_kv_heads": None, "gate": False}},
                    "position": {"kind": "none"}}]})
    state = GatedDeltaNetSpec(n_heads=6, key_heads=2, head_dim=5, v_head_dim=7, conv_kernel=3).state_size(24)
    for seq in (16, 64):
        s = summarize(spec, seq=seq)
        assert s.linear_state_bytes == 2 * state * 4  # two linear layers, float32, whatever the length
        assert s.kv_cache_bytes_per_token == 2 * 8 * 2 * 4  # the full-attention layer's keys and values
        rows = s.layers
        assert [r.get("state_bytes") for r in rows] == [state * 4, None, state * 4]
        assert s.kv_cache_bytes == 2 * 8 * 2 * 4 * seq


@pytest.mark.slow
def test_qwen3_next_tiny_trains():
    import zoo

    model = zoo.build(zoo.load_spec("qwen3-next-tiny", ["vocab_size=61", "max_seq_len=32"]), seed=0).train()
    x = torch.randint(0, 61, (4, 17), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    mixer = model.stack.blocks[0].attn
    assert isinstance(mixer, GatedDeltaNet) and mixer.A_log.grad is None  # zeroed after the step


def test_static_cache_is_refused_by_name():
    import zoo

    model = zoo.build(zoo.load_spec("qwen3-next-tiny", ["vocab_size=61", "max_seq_len=32"]), seed=0).eval()
    with pytest.raises(ValueError, match="static cache"):
        zoo.generate(model, torch.randint(0, 61, (1, 5)), max_new_tokens=2, cache="static")


def test_flops_are_torchs_count_plus_the_triangular_solves():
    from torch.utils.flop_counter import FlopCounterMode

    mixer = GatedDeltaNet(24, n_heads=6, key_heads=2, head_dim=5, v_head_dim=7, conv_kernel=3)
    for T in (50, 130):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            mixer(torch.randn(1, T, 24))
        chunks = -(-T // 64)
        solves = chunks * 6 * 64 * 64 * (5 + 7)  # torch's counter leaves linalg's triangular solves out
        assert abs(counter.get_total_flops() + solves - mixer.flops(T)) < 0.01 * mixer.flops(T)


def test_saved_estimate_is_near_what_autograd_keeps():
    mixer = GatedDeltaNet(24, n_heads=6, key_heads=2, head_dim=5, v_head_dim=7, conv_kernel=3)
    for T in (64, 130):
        x = torch.randn(1, T, 24, requires_grad=True)
        seen, kept = {x.data_ptr()} | {p.data_ptr() for p in mixer.parameters()}, []

        def pack(t):
            if t.data_ptr() not in seen:  # each storage offset once (chunk views count apart: an upper bound)
                seen.add(t.data_ptr())
                kept.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            mixer(x)
        assert 0.6 * sum(kept) < mixer.saved(T) <= sum(kept)
