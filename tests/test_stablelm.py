"""StableLM (LayerNorm with biases, partial rotary, q/k/v biases by ``use_qkv_bias``, a parallel block
with one shared norm by ``use_parallel_residual``) against HF's ``StableLmForCausalLM``, at sizes no
preset has: a converter stated as LLaMA's field table with StableLM's entries
(:mod:`zoo.interop.hf.stablelm`).

For each case: a random-init reference converts into zoo with the same logits (fp32, padded or
not), converts back with every tensor equal and the same logits, reads the same spec from its
config as from the model, survives ``zoo.save``/``zoo.load``, and zoo's cached greedy decoding
gives HF's tokens. What zoo cannot express is refused by name, both ways.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_greedy_equals_hf, max_diff, positions, randomize
from torch import nn

import zoo
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V = 101  # a small, odd vocabulary

CASES = {  # config fields: hidden 24 or 36 with 3 heads, odd widths
    "sequential, rotary 0.25, no biases": {"hidden_size": 24, "num_attention_heads": 3, "num_key_value_heads": 3,
                                           "intermediate_size": 40, "partial_rotary_factor": 0.25},
    "parallel (one shared norm), q/k/v biases, rotary 0.5, tied": {
        "hidden_size": 24, "num_attention_heads": 3, "num_key_value_heads": 3, "intermediate_size": 44,
        "partial_rotary_factor": 0.5, "use_qkv_bias": True, "use_parallel_residual": True, "tie_word_embeddings": True},
    "MQA, full rotary, GeGLU, eps 1e-6, base 500": {
        "hidden_size": 36, "num_attention_heads": 3, "num_key_value_heads": 1, "intermediate_size": 28,
        "partial_rotary_factor": 1.0, "hidden_act": "gelu", "layer_norm_eps": 1e-6, "use_qkv_bias": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
}


def reference(cls: str = "ForCausalLM", **kw) -> nn.Module:
    kw = {"vocab_size": V, "num_hidden_layers": 3, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0, **kw}
    return randomize(getattr(transformers, f"StableLm{cls}")(transformers.StableLmConfig(**kw)))


def tokens(batch: int = 3, length: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padding(batch: int = 3, length: int = 11) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, : length // 2], mask[2, : length - 2] = False, False  # row 2: two real tokens
    return mask


@pytest.mark.parametrize("case", CASES)
def test_converts_both_ways_saves_and_decodes_as_hf(case, tmp_path):
    hf = reference(**CASES[case]).eval()
    model = from_hf(hf).eval()
    x, mask = tokens(), left_padding()
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < ATOL
        ref = hf(x, attention_mask=mask, position_ids=positions(mask)).logits
        assert max_diff(model(x, mask), ref, mask) < ATOL
        assert type(to_hf(model)).__name__ == "StableLmForCausalLM"  # no other class expresses it
        back = to_hf(model).eval()
        assert torch.equal(back(x).logits, hf(x).logits)
    ref_state, back_state = hf.state_dict(), back.state_dict()
    assert ref_state.keys() == back_state.keys()
    assert all(torch.equal(t, back_state[name]) for name, t in ref_state.items())
    assert (model.head.weight is model.tok_emb.weight) == hf.config.tie_word_embeddings
    assert hf_spec(hf.config) == model.spec and hf_spec(hf_config(model.spec, "StableLmForCausalLM")) == model.spec

    zoo.save(model, tmp_path / "m.safetensors")
    loaded = zoo.load(tmp_path / "m.safetensors").eval()
    with torch.no_grad():
        assert torch.equal(loaded(x, mask), model(x, mask))
    prompt = tokens(3, 5, seed=3)
    for prompt_mask in (torch.ones_like(prompt, dtype=torch.bool), left_padding(3, 5)):
        assert_greedy_equals_hf(loaded, hf, prompt, prompt_mask, 8)


def test_what_the_spec_says():
    """StableLM's fields as zoo reads them, against the config that set them."""
    spec = from_hf(reference(**CASES["parallel (one shared norm), q/k/v biases, rotary 0.5, tied"])).spec
    b = spec.block
    assert (b.kind, b.shared_norm, b.norm.kind, b.norm.bias, b.norm.eps) == ("parallel", True, "layernorm", True, 1e-5)
    assert (b.attention.bias, b.attention.out_bias, b.ffn.kind, b.ffn.bias) == (True, False, "swiglu", False)
    assert (spec.position.kind, spec.position.fraction, spec.head.tied) == ("rope", 0.5, True)
    spec = from_hf(reference(**CASES["sequential, rotary 0.25, no biases"])).spec
    assert (spec.block.kind, spec.block.attention.bias, spec.position.fraction) == ("pre", False, 0.25)


def test_the_backbone_converts_headless():
    hf = reference("Model", **CASES["sequential, rotary 0.25, no biases"]).eval()
    model = from_hf(hf).eval()
    assert model.spec.head.kind == "none"
    x = tokens()
    with torch.no_grad():
        assert max_diff(model(x), hf(x).last_hidden_state) < ATOL
        back = to_hf(model)
        assert type(back).__name__ == "StableLmModel"
        assert torch.equal(back.eval()(x).last_hidden_state, hf(x).last_hidden_state)


FROM_REFUSED = {
    "per-head qk layernorm": ({"qk_layernorm": True}, "qk_layernorm=True is not supported: StableLM's qk_layernorm"),
    "dropout on the MLP's output alone": ({"hidden_dropout": 0.1}, "hidden_dropout=0.1"),
}


@pytest.mark.parametrize("case", FROM_REFUSED)
def test_from_hf_refuses_what_zoo_cannot_express(case):
    fields, message = FROM_REFUSED[case]
    with pytest.raises(ConversionError, match=message):
        from_hf(reference(**CASES["sequential, rotary 0.25, no biases"], **fields))


BASE = CASES["sequential, rotary 0.25, no biases"]
TO_REFUSED = {
    "rmsnorm": (["block.norm={kind: rmsnorm}"], "block.norm.kind='rmsnorm'"),
    "layernorm without bias": (["block.norm.bias=false"], "block.norm.bias=False"),
    "a bias on the output projection": (["block.attention.bias=true", "block.attention.out_bias=true"],
                                        "block.attention.out_bias=True"),
    "mlp biases": (["block.ffn.bias=true"], "block.ffn.bias=True"),
    "a parallel block with two norms": (["block.kind=parallel"], "block.shared_norm=False"),
    "a sliding window": (["block.attention.window=4"], "block.attention.window=4"),
    "head_dim apart from hidden / heads": (["block.attention.head_dim=16", "block.attention.v_head_dim=16"],
                                           "block.attention.head_dim=16"),
    "residual dropout": (["dropout.residual=0.1"], "dropout.residual=0.1"),
}


@pytest.mark.parametrize("case", TO_REFUSED)
def test_to_hf_refuses_what_stablelm_cannot_express(case):
    overrides, message = TO_REFUSED[case]
    spec = hf_spec(transformers.StableLmConfig(vocab_size=V, **BASE))
    model = zoo.build(zoo.load_spec(spec, overrides), device="meta")
    with pytest.raises(ConversionError, match=message):
        to_hf(model, "StableLmForCausalLM")
