"""The sandwich block (``block.kind: sandwich``): a norm before and after each sub-layer, as Gemma 2.

The truth is HF's ``Gemma2ForCausalLM`` with its soft-capping off and ``query_pre_attn_scalar`` at
the head size, so the block alone is what differs from a Pre-Norm decoder: read by the Gemma 2
converter (``from_hf``) into exactly the spec below, its logits and greedy decoding equal zoo's,
with Gemma 2's local and global layers alternating (a layer pattern). The block's formula, its
summary and its place among the families are checked too. tests/test_hf_gemma.py covers the
converter itself, soft-capping and the score scale included.
"""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, randomize

import zoo
from zoo.interop import from_hf
from zoo.summary import summarize

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
V, LAYERS, WINDOW = 71, 4, 4


def gemma2() -> torch.nn.Module:
    config = transformers.Gemma2Config(
        vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=64, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2), query_pre_attn_scalar=12,
        attn_logit_softcapping=None, final_logit_softcapping=None, bos_token_id=0, eos_token_id=0, pad_token_id=None)
    return randomize(transformers.Gemma2ForCausalLM(config)).eval()


SPEC = {
    "family": "decoder", "vocab_size": V, "max_seq_len": 64, "d_model": 32, "n_layers": LAYERS,
    "embedding": {"scale": True, "round_scale": True}, "position": {"kind": "rope", "base": 10000.0},
    "block": {
        "kind": "sandwich",
        "attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 12, "v_head_dim": 12, "bias": False,
                      "window": WINDOW},
        "ffn": {"kind": "geglu", "approximate": "tanh", "hidden": 40, "bias": False},
        "norm": {"kind": "rmsnorm", "eps": 1e-6, "unit_offset": True},
    },
    "layers": [{"at": "1::2", "block": {"attention": {"window": None}}}],  # Gemma 2: local, global, local, ...
}


def test_equals_gemma2_with_alternating_local_and_global_layers():
    hf = gemma2()
    model = from_hf(hf)
    assert model.spec.model_dump(exclude={"init"}) == zoo.parse_spec(SPEC).model_dump(exclude={"init"})
    assert [layer.block.attention.window for layer in model.spec.stack_layers()] == [WINDOW, None] * (LAYERS // 2)
    x = torch.randint(0, V, (3, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < 1e-4
    # greedy decoding through zoo's cache (local layers keep window - 1 keys) equals HF's, past the window
    prompt = x[:, :5]
    ours = zoo.generate(model, prompt, max_new_tokens=12).tokens
    hf.generation_config.eos_token_id = None
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs[:, 5:])


def test_the_block_computes_its_formula():
    model = zoo.build(SPEC, seed=0).eval()
    block = model.stack.blocks[1]
    x = torch.randn(2, 6, 32)
    ctx = model.stack.context(model.position, torch.zeros(2, 6, dtype=torch.long), None, causal=True).layers[1]
    with torch.no_grad():
        h = x + block.attn_post_norm(block.attn(block.attn_norm(x), mask=ctx.mask, is_causal=ctx.is_causal,
                                                 pos=ctx.pos, positions=ctx.positions))
        assert torch.allclose(block(x, ctx), h + block.ffn_post_norm(block.ffn(block.ffn_norm(h))), atol=1e-6)


def test_summary_counts_its_second_norms():
    sandwich, pre = zoo.parse_spec(SPEC), zoo.load_spec(SPEC, ["block.kind=pre"])
    a, b = summarize(sandwich, seq=16), summarize(pre, seq=16)
    d, sublayers = 32, 2 * LAYERS
    assert a.parameters - b.parameters == sublayers * d  # one more RMSNorm weight per sub-layer
    assert a.parts["norms"] - b.parts["norms"] == sublayers * d and a.flops_forward == b.flops_forward
    # each extra RMSNorm keeps its input and its normalised input: 2 * D floats per token
    assert a.activation_bytes - b.activation_bytes == sublayers * 16 * 2 * d * 4


def test_in_an_encoder_decoder_and_through_files(tmp_path):
    model = zoo.build("transformer-base", ["d_model=32", "n_layers=2", "block.attention.n_heads=4", "block.ffn.hidden=40",
                                           "vocab_size=61", "max_seq_len=32", "block.kind=sandwich"], seed=0).eval()
    assert hasattr(model.decoder.blocks[0], "cross_post_norm")
    zoo.save(model, tmp_path / "m.safetensors")
    src, tgt = torch.randint(0, 61, (2, 9)), torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        assert torch.equal(zoo.load(tmp_path / "m.safetensors").eval()(src, tgt), model(src, tgt))
