"""Decoder classes in variants beside the conformance table's one config per class: Qwen3 (RMSNorm on
each query and key head, its own head size, per-layer sliding windows), Phi-3 (fused ``qkv_proj``
and ``gate_up_proj``, partial rotary, a sliding window, residual dropout), Granite (its multipliers),
Cohere (interleaved rope, parallel blocks, a logit scale) and SmolLM3 (NoPE layers by their interval),
at sizes no preset has.

Each variant, a random-init ``*ForCausalLM``, goes through the conformance suite's checks (outputs
both ways, padded or not; every tensor back; its config; cached greedy decoding past the window).
Then what the specs say, and what zoo cannot express refused by name, both ways.
"""

from __future__ import annotations

import pytest
import torch
from conformance_checks import check_config, check_greedy, check_outputs, check_round_trip
from conftest import randomize
from torch import nn

import zoo
from zoo.interop import ConversionError, from_hf, hf_spec, to_hf

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V = 101  # a small, odd vocabulary
SLIDING, FULL = "sliding_attention", "full_attention"


def tokens(batch: int = 3, length: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def rope(factor: float = 1.0, **kw) -> dict:
    return {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": factor, **kw}


# (HF class, config fields, to_hf's default class where it is not the reference's own)
CASES = {
    "qwen3: GQA 6/2, head_dim 16, layers 0 and 2 sliding, window 4": ("Qwen3", {
        "hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 56,
        "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 4, "layer_types": [SLIDING, FULL, SLIDING]}, None),
    "qwen3: MHA 3, head_dim 10, biases, tied, layers 1-2 sliding (max_window_layers 1), window 3": ("Qwen3", {
        "hidden_size": 36, "num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": 10, "intermediate_size": 44,
        "num_hidden_layers": 3, "attention_bias": True, "tie_word_embeddings": True, "use_sliding_window": True,
        "sliding_window": 3, "max_window_layers": 1, "rms_norm_eps": 1e-5}, None),
    "qwen3: MQA, head 8 = d / heads, every layer sliding, window 5": ("Qwen3", {
        "hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 52,
        "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 0}, None),
    "qwen3: no window": ("Qwen3", {
        "hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 56}, None),
    "phi3: GQA 6/2, rotary 0.5, window 5": ("Phi3", {
        "hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 56, "num_hidden_layers": 3,
        "rope_parameters": rope(0.5), "sliding_window": 5}, None),
    "phi3: MQA, rotary 0.75, residual dropout, tied": ("Phi3", {
        "hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1, "intermediate_size": 40, "resid_pdrop": 0.1,
        "rope_parameters": rope(0.75), "tie_word_embeddings": True}, None),
    "phi3: MHA, full rotary, window 4 (as Mistral)": ("Phi3", {
        "hidden_size": 36, "num_attention_heads": 3, "intermediate_size": 44, "rope_parameters": rope(1.0, rope_theta=500.0),
        "sliding_window": 4}, "MistralForCausalLM"),
    "phi3: GQA 4/2, full rotary, no window (as LLaMA)": ("Phi3", {
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 44}, "LlamaForCausalLM"),
    "granite: MQA, the attention multiplier 1/sqrt(head size), tied, biases": ("Granite", {
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 44,
        "attention_multiplier": 8 ** -0.5, "embedding_multiplier": 6.0, "logits_scaling": 0.5, "tie_word_embeddings": True,
        "attention_bias": True, "mlp_bias": True}, None),
    "cohere: GQA 6/2, untied, the default logit scale": ("Cohere", {
        "hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 56,
        "tie_word_embeddings": False}, None),
    "smollm3: NoPE every second layer (no_rope_layer_interval 2), every layer sliding, window 4": ("SmolLM3", {
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 44,
        "num_hidden_layers": 4, "no_rope_layer_interval": 2, "use_sliding_window": True, "sliding_window": 4,
        "layer_types": [SLIDING] * 4}, None),
}


def reference(kind: str, cls: str = "ForCausalLM", **kw) -> nn.Module:
    kw = {"vocab_size": V, "num_hidden_layers": 2, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0,
          "pad_token_id": None, **kw}
    config = getattr(transformers, f"{kind}Config")(**kw)
    return randomize(getattr(transformers, f"{kind}{cls}")(config))


@pytest.mark.parametrize("case", CASES)
def test_variant_converts_both_ways_and_decodes_as_hf(case):
    """The conformance suite's checks (tests/conformance_checks.py) on each variant: the same outputs
    both ways, unpadded and padded on either side; every tensor back; the config read and written and
    the class ``to_hf`` picks; tying; cached greedy decoding past the window, unpadded and left-padded."""
    kind, kw, default = CASES[case]
    hf = reference(kind, **kw)
    model = check_outputs(hf)
    check_round_trip(hf)
    check_config(hf, default)
    assert (model.head.weight is model.tok_emb.weight) == hf.config.tie_word_embeddings
    check_greedy(hf)


def test_what_the_specs_say():
    """The spec fields each reads: Qwen3's per-head qk-norm with the blocks' eps and its windows as a
    layer pattern; Phi-3's partial rotary, window and residual dropout."""
    spec = from_hf(reference("Qwen3", **CASES["qwen3: GQA 6/2, head_dim 16, layers 0 and 2 sliding, window 4"][1])).spec
    att = spec.block.attention
    assert (att.head_dim, att.n_kv_heads, att.bias, att.window) == (16, 2, False, None)
    assert att.qk_norm.model_dump() == {"kind": "rmsnorm", "scope": "head", "eps": 1e-6, "unit_offset": False, "affine": True}
    assert [layer.block.attention.window for layer in spec.stack_layers()] == [4, None, 4]
    spec = from_hf(reference("Phi3", **CASES["phi3: MQA, rotary 0.75, residual dropout, tied"][1])).spec
    assert (spec.position.fraction, spec.block.attention.kind, spec.dropout.residual, spec.head.tied) == (0.75, "mqa", 0.1, True)
    assert spec.block.attention.head_dim is None and spec.block.attention.window is None


def test_phi3_fused_projections_are_zoos_fused_ones():
    """qkv_proj is zoo's [q | k | v] and gate_up_proj its [gate | up], row for row."""
    hf = reference("Phi3", **CASES["phi3: GQA 6/2, rotary 0.5, window 5"][1])
    model = from_hf(hf)
    assert torch.equal(model.stack.blocks[1].attn.qkv.weight, hf.model.layers[1].self_attn.qkv_proj.weight)
    assert torch.equal(model.stack.blocks[2].ffn.fc1.weight, hf.model.layers[2].mlp.gate_up_proj.weight)


# ------------------------------------------------------------------------------------ refusals
SMALL = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8}
LONGROPE = rope(1.0, rope_type="longrope", short_factor=[1.0] * 4, long_factor=[2.0] * 4)
FROM_REFUSED = {
    "qwen3 sliding layers without a window": (lambda: reference("Qwen3", **SMALL, head_dim=8, layer_types=[SLIDING, FULL]),
                                              "sliding_window=None is not supported"),
    "phi3 quick_gelu": (lambda: reference("Phi3", **SMALL, hidden_act="quick_gelu"), "hidden_act='quick_gelu'"),
    "cohere per-head qk-norm": (lambda: reference("Cohere", **SMALL, use_qk_norm=True),
                                "use_qk_norm=True is not supported: Cohere's use_qk_norm is a LayerNorm per head"),
    "smollm3 sliding layers without a window": (
        lambda: reference("SmolLM3", **SMALL, use_sliding_window=True, sliding_window=None, layer_types=[SLIDING, FULL]),
        "sliding_window=None is not supported"),
}


@pytest.mark.parametrize("case", FROM_REFUSED)
def test_from_hf_refuses_what_zoo_cannot_express(case):
    build, message = FROM_REFUSED[case]
    with pytest.raises(ConversionError, match=message):
        from_hf(build())


SCALED = {  # RoPE scalings convert as LLaMA's (tests/test_rope_scaling.py); here through these classes' own layouts
    "phi3 longrope past the original length": lambda: reference(
        "Phi3", **SMALL, max_position_embeddings=64, original_max_position_embeddings=16, rope_parameters=LONGROPE),
    "phi3 backbone longrope": lambda: reference(
        "Phi3", "Model", **SMALL, max_position_embeddings=64, original_max_position_embeddings=16, rope_parameters=LONGROPE),
    "qwen3 yarn": lambda: reference("Qwen3", **SMALL, head_dim=8, rope_parameters={
        "rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0, "original_max_position_embeddings": 16}),
}


@pytest.mark.parametrize("case", SCALED)
def test_rope_scalings_convert_both_ways(case):
    hf = SCALED[case]().eval()
    model = from_hf(hf).eval()
    assert model.spec.position.scaling is not None
    x = tokens(2, 40)
    with torch.no_grad():
        ref = hf(x)
        ref = ref.logits if hasattr(ref, "logits") else ref.last_hidden_state
        assert (model(x) - ref).abs().max() < ATOL
        back = to_hf(model, type(hf).__name__).eval()
        again = back(x)
        assert torch.equal(again.logits if hasattr(again, "logits") else again.last_hidden_state, ref)


QWEN3 = CASES["qwen3: no window"][1]
PHI3 = CASES["phi3: GQA 6/2, rotary 0.5, window 5"][1]
TO_REFUSED = {
    "qk-norm over the whole projections to qwen3": ("Qwen3", QWEN3, ["block.attention.qk_norm.scope=all"],
                                                    "Qwen3ForCausalLM", r"block.attention.qk_norm=\{'kind': 'rmsnorm', 'scope': 'all'"),
    "layernorm qk-norm to qwen3": ("Qwen3", QWEN3, ["block.attention.qk_norm.kind=layernorm"], "Qwen3ForCausalLM",
                                   "block.attention.qk_norm="),
    "qwen3 without qk-norm": ("Qwen3", QWEN3, ["block.attention.qk_norm=null"], "Qwen3ForCausalLM",
                              "block.attention.qk_norm=None"),
    "qwen3 qk-norm eps apart": ("Qwen3", QWEN3, ["block.attention.qk_norm.eps=1e-5"], "Qwen3ForCausalLM",
                                "block.attention.qk_norm.eps=1e-05"),
    "q/k/v-only biases to qwen3": ("Qwen3", QWEN3, ["block.attention.bias=true", "block.attention.out_bias=false"],
                                   "Qwen3ForCausalLM", "block.attention.out_bias=False"),
    "ffn biases to qwen3": ("Qwen3", QWEN3, ["block.ffn.bias=true"], "Qwen3ForCausalLM", "block.ffn.bias=True"),
    "two window sizes to qwen3": ("Qwen3", QWEN3, ["block.attention.window=3", "layers=[{at: 0, block: {attention: {window: 5}}}]"],
                                  "Qwen3ForCausalLM", r"block.attention.window=\[3, 5\]"),
    "per-head qk-norm to llama": ("Qwen3", QWEN3, [], "LlamaForCausalLM", "block.attention.qk_norm="),
    "per-head qk-norm to olmo2": ("Qwen3", {**QWEN3, "head_dim": 8}, ["block.kind=post_sublayer"], "Olmo2ForCausalLM",
                                  "block.attention.qk_norm="),
    "partial rotary to qwen3": ("Phi3", PHI3, [], "Qwen3ForCausalLM", "position.fraction=0.5"),
    "biases to phi3": ("Phi3", PHI3, ["block.attention.bias=true"], "Phi3ForCausalLM", "block.attention.bias=True"),
    "head_dim to phi3": ("Qwen3", QWEN3, ["block.attention.qk_norm=null"], "Phi3ForCausalLM", "block.attention.head_dim=16"),
    "a layer pattern to phi3": ("Phi3", PHI3, ["layers=[{at: 0, block: {attention: {window: null}}}]"], "Phi3ForCausalLM",
                                "layers="),
    "embedding dropout to phi3": ("Phi3", PHI3, ["dropout.embedding=0.1"], "Phi3ForCausalLM", "dropout.embedding=0.1"),
    "interleaved rope to llama": ("Qwen3", QWEN3, ["block.attention.qk_norm=null", "position.pairs=interleaved"],
                                  "LlamaForCausalLM", "position.pairs='interleaved'"),
    "rotate-half rope to cohere": ("Cohere", {**SMALL, "num_key_value_heads": 2}, ["position.pairs=half"],
                                   "CohereForCausalLM", "position.pairs='half'"),
    "scale_dim to granite": ("Granite", SMALL, ["block.attention.scale=null", "block.attention.scale_dim=4"],
                             "GraniteForCausalLM",
                             "block.attention.scale_dim=4"),
    "a logit scale to granite": ("Granite", SMALL, ["head.scale=0.5"], "GraniteForCausalLM", "head.scale=0.5"),
    "a layer's own rope base to smollm3": ("SmolLM3", SMALL, ["layers=[{at: 0, position: {kind: rope, base: 500.0}}]"],
                                           "SmolLM3ForCausalLM", "layer 0's position .* SmolLM3's layers have the model's rope or none"),
    "two window sizes to smollm3": ("SmolLM3", SMALL, ["block.attention.window=3", "layers=[{at: 0, block: {attention: "
                                                      "{window: 5}}}]"], "SmolLM3ForCausalLM", r"block.attention.window=\[3, 5\]"),
    "residual dropout to llama": ("Phi3", {**PHI3, "rope_parameters": rope(1.0), "sliding_window": None},
                                  ["dropout.residual=0.1"], "LlamaForCausalLM", "dropout.residual=0.1"),
}


@pytest.mark.parametrize("case", TO_REFUSED)
def test_to_hf_refuses_what_the_class_cannot_express(case):
    kind, kw, overrides, architecture, message = TO_REFUSED[case]
    spec = hf_spec(getattr(transformers, f"{kind}Config")(vocab_size=V, **kw))
    model = zoo.build(zoo.load_spec(spec, overrides), device="meta")
    with pytest.raises(ConversionError, match=message):
        to_hf(model, architecture)
