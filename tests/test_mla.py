"""Multi-head latent attention (``attention.kind: mla``) against HF's ``DeepseekV3Attention`` with
its weights copied: q through a latent or one projection, yarn's mscale in the scale, rope pairs
interleaved or in halves; its cache (the latent and the rotary key) decodes token by token as the
full pass computes, in the dynamic and the static cache; the spec's rules and its cache size."""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, randomize

from zoo.components.cache import KVCache
from zoo.components.mla import LatentAttention
from zoo.components.rope import RotaryPosition
from zoo.components.static_cache import StaticKVCache
from zoo.spec import MLASpec, parse_spec
from zoo.spec.rope import YarnScalingSpec

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
D, H, NOPE, ROPE, V, KV = 40, 4, 6, 4, 5, 10
YARN = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 0.7, "beta_fast": 32.0, "beta_slow": 1.0}


def hf_attention(q_rank: int | None, interleave: bool, rope: dict):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    config = transformers.DeepseekV3Config(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_rank, kv_lora_rank=KV,
        qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, rope_parameters=rope, rope_interleave=interleave,
        max_position_embeddings=64, attention_bias=q_rank is not None)
    config._attn_implementation = "eager"
    return randomize(m.DeepseekV3Attention(config, 0)), m.DeepseekV3RotaryEmbedding(config), m.yarn_apply_mscale


def zoo_attention(hf, q_rank: int | None, scale: float | None) -> LatentAttention:
    att = LatentAttention(D, n_heads=H, q_rank=q_rank, kv_rank=KV, nope_dim=NOPE, rope_dim=ROPE, v_head_dim=V,
                          bias=q_rank is not None, scale=scale).eval()
    names = {"kv_a": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "out": "o_proj"}
    names |= {"q": "q_proj"} if q_rank is None else {"q_a": "q_a_proj", "q_norm": "q_a_layernorm", "q_b": "q_b_proj"}
    hf_state = hf.state_dict()
    att.load_state_dict({f"{z}.{k.split('.')[-1]}": hf_state[f"{h}.{k.split('.')[-1]}"]
                         for z, h in names.items() for k in att.state_dict() if k.startswith(z + ".")})
    return att


def position(rope: dict, interleave: bool) -> RotaryPosition:
    scaling = None
    if rope["rope_type"] == "yarn":
        scaling = YarnScalingSpec(**{k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta")})
    return RotaryPosition(ROPE, base=rope["rope_theta"], scaling=scaling, max_len=64, interleaved=interleave)


@pytest.mark.parametrize("q_rank,interleave,rope", [(12, True, YARN), (None, True, {"rope_type": "default", "rope_theta": 500.0}),
                                                    (12, False, {"rope_type": "default", "rope_theta": 500.0})])
def test_mla_matches_hf(q_rank, interleave, rope):
    hf, rotary, mscale = hf_attention(q_rank, interleave, rope)
    scale = mscale(rope, (NOPE + ROPE) ** -0.5)
    att, pos = zoo_attention(hf, q_rank, scale), position(rope, interleave)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(7)
    causal = torch.full((7, 7), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want, _ = hf(x, rotary(x, ids[None]), causal)
        got = att(x, pos=pos, positions=ids, is_causal=True)
    assert max_diff(got, want) < 1e-5


@pytest.mark.parametrize("static", [False, True])
def test_mla_cache_holds_the_latent(static):
    hf, _, mscale = hf_attention(12, True, YARN)
    att, pos = zoo_attention(hf, 12, mscale(YARN, (NOPE + ROPE) ** -0.5)), position(YARN, True)
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = att(x, pos=pos, positions=torch.arange(6), is_causal=True)
        cache = StaticKVCache(1, 8, 2) if static else KVCache(1, 8)
        steps = []
        for t in range(6):
            positions, _, real = cache.extend(None, 1, 2, x.device)
            mask = cache.mask(1, None, None) if static else None
            steps.append(att(x[:, t : t + 1], pos=pos, positions=positions if static else positions,
                             mask=mask, cache=cache.layers[0]))
    assert max_diff(torch.cat(steps, dim=1), full) < 1e-5
    layer = cache.layers[0]
    assert layer.k.shape[1:] == (1, 8, KV) and layer.v.shape[1:] == (1, 8, ROPE)  # the latent and the rotary key
    assert att.cache_elements() == KV + ROPE


def test_mla_spec_rules_and_summary():
    spec = MLASpec(n_heads=4, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)
    assert spec.qk_size(40) == 10 and spec.rope_size(40) == 4 and spec.n_kv_heads == 4
    assert "head_dim" not in spec.model_dump(exclude_none=True)
    assert MLASpec.model_validate(spec.model_dump()) == spec
    for bad, field in ((dict(n_kv_heads=2), "n_kv_heads"), (dict(head_dim=9), "head_dim"),
                       (dict(qk_rope_head_dim=3), "qk_rope_head_dim"), (dict(qk_norm={"kind": "rmsnorm"}), "qk_norm")):
        with pytest.raises(ValueError, match=field):
            MLASpec(**{"n_heads": 4, **bad})
    import zoo
    from zoo.summary import summarize

    model_spec = parse_spec({"family": "decoder", "d_model": 40, "n_layers": 2, "vocab_size": 50, "max_seq_len": 32,
                             "position": {"kind": "rope", "pairs": "interleaved"},
                             "block": {"attention": spec.model_dump(exclude_none=True), "norm": {"kind": "rmsnorm"}}})
    model = zoo.build(model_spec)
    assert model.stack.blocks[0].attn.q_b.in_features == 12
    s = summarize(model_spec, batch=1, seq=32)
    assert s.kv_cache_bytes_per_token == 2 * (10 + 4) * 4  # two layers' latent + rotary key, fp32
    logits = model(torch.randint(0, 50, (2, 5)))
    assert logits.shape == (2, 5, 50)


@pytest.mark.parametrize("q_rank,fold", [(12, "auto"), (None, "auto"), (12, "always")])
def test_mla_flops_are_what_torch_counts(q_rank, fold):
    from torch.utils.flop_counter import FlopCounterMode

    att = LatentAttention(D, n_heads=H, q_rank=q_rank, kv_rank=KV, nope_dim=NOPE, rope_dim=ROPE, v_head_dim=V,
                          fold=fold)
    with FlopCounterMode(display=False) as counter:
        att(torch.randn(1, 7, D), is_causal=True)
    assert counter.get_total_flops() == att.flops(7)


def mla_decoder(fold: str, q_rank: int | None = 12):
    import zoo

    spec = zoo.load_spec("deepseek-tiny", [
        "d_model=32", "n_layers=2", "block.attention.n_heads=4", "vocab_size=61", "max_seq_len=40",
        f"block.attention.q_lora_rank={'null' if q_rank is None else q_rank}", "block.attention.kv_lora_rank=10",
        "block.attention.qk_nope_head_dim=6", "block.attention.qk_rope_head_dim=4", "block.attention.v_head_dim=8",
        f"block.attention.fold={fold}", "block.ffn.expert.hidden=24", "block.ffn.shared_hidden=24",
        "layers=[{at: [0], block: {ffn: {kind: swiglu, hidden: 48, bias: false}}}]"])
    return zoo.build(spec, seed=1).eval()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("beams", [1, 3])
def test_folded_decoding_decodes_as_unfolded(cache, beams):
    """Folded (absorbed) decoding == the expanded path, greedy and beam search (the beams reorder the
    cached latents), left-padded prompts, in the dynamic and the static cache."""
    import zoo

    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, 61, (3, 6), generator=g)
    mask = torch.arange(6)[None, :] >= torch.tensor([0, 4, 1])[:, None]
    runs = {fold: zoo.generate(mla_decoder(fold), x.masked_fill(~mask, 0), padding_mask=mask, num_beams=beams,
                               max_new_tokens=8, min_new_tokens=8, eos_id=None, cache=cache)
            for fold in ("never", "always", "auto")}
    for fold in ("always", "auto"):
        assert runs[fold].tokens.equal(runs["never"].tokens)
        torch.testing.assert_close(runs[fold].scores, runs["never"].scores, rtol=0, atol=1e-4)


def test_auto_folds_decoding_steps_only(monkeypatch):
    """``fold: auto``: the prompt's pass (no cache, or a prefill with 2R >= N + V) expands, each
    cached step folds; DeepSeek-V3's sizes fold a step and not a prefill; never and always hold."""
    import zoo

    seen = []
    unfolded = LatentAttention.expand
    monkeypatch.setattr(LatentAttention, "expand", lambda self, *a: seen.append("expand") or unfolded(self, *a))
    folded = LatentAttention.folded
    monkeypatch.setattr(LatentAttention, "folded", lambda self, *a, **k: seen.append("fold") or folded(self, *a, **k))
    model = mla_decoder("auto")
    zoo.generate(model, torch.randint(3, 61, (1, 5)), max_new_tokens=3, min_new_tokens=3, eos_id=None)
    assert seen == ["expand"] * 2 + ["fold"] * 4  # prompt in two layers, then two steps (the last token is not fed)
    v3 = LatentAttention(64, n_heads=2, q_rank=None, kv_rank=512, nope_dim=128, rope_dim=64, v_head_dim=128)
    assert v3.folds(1, 4096, True) and not v3.folds(4096, 4096, True) and not v3.folds(1, 4096, False)
    for fold, want in (("never", False), ("always", True)):
        v3.fold = fold
        assert v3.folds(1, 4096, True) is want and v3.folds(7, 7, False) is want


def test_folded_attention_matches_hf_and_is_differentiable():
    """``fold: always`` on a full pass (no cache) computes HF's attention, and its gradients reach
    ``kv_b`` as the expanded pass's do."""
    hf, rotary, mscale = hf_attention(12, True, YARN)
    scale = mscale(YARN, (NOPE + ROPE) ** -0.5)
    att, pos = zoo_attention(hf, 12, scale), position(YARN, True)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(7)
    causal = torch.full((7, 7), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want, _ = hf(x, rotary(x, ids[None]), causal)
    grads = {}
    for fold in ("always", "never"):
        att.fold = fold
        att.zero_grad()
        got = att(x, pos=pos, positions=ids, is_causal=True)
        assert max_diff(got, want) < 1e-5
        got.square().sum().backward()
        grads[fold] = att.kv_b.weight.grad.clone()
    torch.testing.assert_close(grads["always"], grads["never"], rtol=1e-4, atol=1e-5)
