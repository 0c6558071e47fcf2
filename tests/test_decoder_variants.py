"""Decoder variants against their HF reference classes, at sizes no preset has: Mistral (sliding-window
attention), Qwen2 (q/k/v biases without an output bias), GPT-NeoX (partial rotary, parallel attention
and FFN), OLMo 2 (qk-norm, norms after each sub-layer), Gemma (scaled embeddings, (1 + w) RMSNorm,
GeGLU-tanh, a head size of its own), OLMo (LayerNorm without weights) and Nemotron (LayerNorm by 1 + w, an
ungated MLP).

For each: a random-init reference converts into zoo with the same logits (fp32, padded or not),
converts back with every tensor equal, survives ``zoo.save``/``zoo.load``, and zoo's cached greedy
decoding gives HF's ``generate(do_sample=False)`` tokens, past the sliding window where there is one.
The presets are their reference configs; what zoo cannot express is refused by name.
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
V = 67  # a small vocabulary


def tokens(batch: int = 3, length: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padding(batch: int = 3, length: int = 11) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, : length // 2], mask[2, : length - 2] = False, False  # row 2: two real tokens
    return mask


# (HF class, config fields). Sizes: odd widths, head counts and FFN widths no preset has.
CASES = {
    "mistral: GQA 6/2, window 4": ("Mistral", {
        "hidden_size": 36, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 44, "sliding_window": 4}),
    "mistral: MQA, head_dim 10, window 7, tied": ("Mistral", {
        "hidden_size": 24, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 10, "intermediate_size": 40,
        "sliding_window": 7, "tie_word_embeddings": True}),
    "mistral: no window": ("Mistral", {
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40, "sliding_window": None}),
    "qwen2: q/k/v biases, GQA 5/1": ("Qwen2", {
        "hidden_size": 40, "num_attention_heads": 5, "num_key_value_heads": 1, "intermediate_size": 52}),
    "qwen2: every layer sliding, window 3": ("Qwen2", {
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 36,
        "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0, "tie_word_embeddings": True}),
    "qwen2: layers 2-3 of 4 sliding (max_window_layers 2), window 3": ("Qwen2", {
        "hidden_size": 24, "num_attention_heads": 3, "num_key_value_heads": 1, "intermediate_size": 28, "num_hidden_layers": 4,
        "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 2}),
    "qwen2: layers 0 and 2 sliding (layer_types), window 4": ("Qwen2", {
        "hidden_size": 24, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 20, "num_hidden_layers": 3,
        "use_sliding_window": True, "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
    "neox: parallel, rotary 0.25": ("GPTNeoX", {
        "hidden_size": 48, "num_attention_heads": 3, "intermediate_size": 72, "rotary_pct": 0.25}),
    "neox: sequential, rotary 0.5, relu, no attention bias, tied": ("GPTNeoX", {
        "hidden_size": 40, "num_attention_heads": 2, "intermediate_size": 56, "rotary_pct": 0.5, "use_parallel_residual": False,
        "hidden_act": "relu", "attention_bias": False, "tie_word_embeddings": True, "layer_norm_eps": 1e-6}),
    "neox: full rotary, gelu-tanh": ("GPTNeoX", {
        "hidden_size": 24, "num_attention_heads": 4, "intermediate_size": 40, "rotary_pct": 1.0, "hidden_act": "gelu_new"}),
    "olmo2: MHA, head 10": ("Olmo2", {
        "hidden_size": 40, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 52}),
    "olmo2: GQA 6/3, biases, tied, eps 1e-6": ("Olmo2", {
        "hidden_size": 36, "num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 44, "attention_bias": True,
        "tie_word_embeddings": True, "rms_norm_eps": 1e-6}),
    "gemma: MQA, head_dim 14": ("Gemma", {
        "hidden_size": 36, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 14, "intermediate_size": 60}),
    "gemma: GQA 4/2, biases, untied": ("Gemma", {
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6, "intermediate_size": 44,
        "attention_bias": True, "tie_word_embeddings": False}),
    "olmo: GQA 6/2, attention biases, tied": ("Olmo", {
        "hidden_size": 36, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 44, "attention_bias": True,
        "tie_word_embeddings": True}),
    "nemotron: MHA, silu, rotary 0.25, tied, eps 1e-6": ("Nemotron", {
        "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 44, "hidden_act": "silu",
        "norm_eps": 1e-6, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}),
}


DEFAULT = {"mistral: no window": "LlamaForCausalLM"}  # to_hf's default where it is not the reference's class


def reference(kind: str, **kw) -> nn.Module:
    kw = {"vocab_size": V, "num_hidden_layers": 2, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0,
          "pad_token_id": None, **kw}
    config = getattr(transformers, f"{kind}Config")(**kw)
    return randomize(getattr(transformers, f"{kind}ForCausalLM")(config))


@pytest.mark.parametrize("case", CASES)
def test_converts_both_ways_saves_and_decodes_as_hf(case, tmp_path):
    kind, kw = CASES[case]
    hf = reference(kind, **kw)
    model = from_hf(hf)
    x, mask = tokens(), left_padding()
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < ATOL
        ref = hf(x, attention_mask=mask, position_ids=positions(mask)).logits
        assert max_diff(model(x, mask), ref, mask) < ATOL
        back = to_hf(model).eval()  # by default, the first architecture that expresses the spec
        assert type(back).__name__ == DEFAULT.get(case, type(hf).__name__)
        back = to_hf(model, type(hf).__name__).eval()
        assert max_diff(back(x).logits, model(x)) < ATOL
    ref_state, back_state = hf.state_dict(), back.state_dict()
    assert ref_state.keys() == back_state.keys()
    assert all(torch.equal(t, back_state[name]) for name, t in ref_state.items())
    assert (model.head.weight is model.tok_emb.weight) == hf.config.tie_word_embeddings

    zoo.save(model, tmp_path / "m.safetensors")
    loaded = zoo.load(tmp_path / "m.safetensors")
    assert loaded.spec == model.spec and loaded.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        assert torch.equal(loaded(x, mask), model(x, mask))

    # greedy decoding through zoo's KV cache equals HF's, past the window (prompt 5 + 12 new tokens),
    # unpadded and left-padded
    prompt = tokens(3, 5, seed=3)
    for prompt_mask in (torch.ones_like(prompt, dtype=torch.bool), left_padding(3, 5)):
        assert_greedy_equals_hf(model, hf, prompt, prompt_mask, 12)


def test_sliding_window_cache_holds_the_window_only():
    """Mistral's cache keeps the last window - 1 keys between steps, however long the sequence grows."""
    model = from_hf(reference("Mistral", **CASES["mistral: GQA 6/2, window 4"][1]))
    cache = model.new_cache(40)
    with torch.no_grad():
        model(tokens(2, 9), cache=cache)
        for t in range(6):
            model(tokens(2, 1, seed=t), cache=cache)
            assert len(cache) == 10 + t and cache.layers[0].k.shape[2] == 3 == cache.layers[1].v.shape[2]


def test_summary_counts_the_window_in_the_kv_cache():
    from zoo.summary import summarize

    spec = zoo.load_spec("mistral-tiny")  # window 128
    long, short = summarize(spec, seq=512), summarize(spec, seq=64)
    assert (long.kv_cache_tokens, short.kv_cache_tokens) == (127, 64)  # a token sees itself and the 127 before it
    assert long.kv_cache_bytes_per_token == summarize(zoo.load_spec("mistral-tiny", ["block.attention.window=null"]),
                                                      seq=512).kv_cache_bytes_per_token
    assert summarize(zoo.load_spec("llama-tiny"), seq=512).kv_cache_tokens == 512


def test_gemma_embedding_scale_is_rounded_to_bfloat16_as_hf():
    """HF Gemma casts sqrt(d_model) to the weights' dtype (sqrt(32) = 5.657 is 5.656 in bfloat16);
    embedding.round_scale does the same, and without it the bfloat16 embeddings differ."""
    hf = reference("Gemma", **CASES["gemma: GQA 4/2, biases, untied"][1]).to(torch.bfloat16)
    model = from_hf(hf)
    x = tokens()
    with torch.no_grad():
        assert torch.equal(model.tok_emb(x), hf.model.embed_tokens(x))
        unrounded = zoo.build(zoo.load_spec(model.spec, ["embedding.round_scale=false"]), dtype=torch.bfloat16)
        unrounded.load_state_dict(model.state_dict())
        assert not torch.equal(unrounded.tok_emb(x), hf.model.embed_tokens(x))


# ------------------------------------------------------------------------------------- presets
PRESETS = {"mistral-tiny": "MistralForCausalLM", "qwen2-tiny": "Qwen2ForCausalLM", "pythia-tiny": "GPTNeoXForCausalLM",
           "olmo2-tiny": "Olmo2ForCausalLM", "gemma-tiny": "GemmaForCausalLM"}


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_their_reference_configs(name):
    """Each preset converts to its reference's config (by default) and model, and back to itself."""
    spec = zoo.load_spec(name)
    config = hf_config(spec)
    assert type(config).__name__ == PRESETS[name].replace("ForCausalLM", "Config")
    with torch.device("meta"):
        ref = getattr(transformers, PRESETS[name])(config)
    assert zoo.count_parameters(zoo.build(spec, device="meta")) == sum(p.numel() for p in ref.parameters())
    assert hf_spec(config).model_dump(exclude={"name"}) == spec.model_dump(exclude={"name"})


# ------------------------------------------------------------------------------------ refusals
FROM_REFUSED = {
    "mistral proportional rope": (lambda: reference("Mistral", hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                                                    intermediate_size=8, rope_parameters={
                                                        "rope_type": "proportional", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.5}),
                                  "rope_parameters.rope_type='proportional'"),
    "neox proportional rope": (lambda: reference("GPTNeoX", hidden_size=16, num_attention_heads=2, intermediate_size=8,
                                                 rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0,
                                                                  "partial_rotary_factor": 0.5}),
                               "rope_parameters.rope_type='proportional'"),
    "neox quick_gelu": (lambda: reference("GPTNeoX", hidden_size=16, num_attention_heads=2, intermediate_size=8,
                                          hidden_act="quick_gelu"), "hidden_act='quick_gelu'"),
    "gemma bidirectional": (lambda: reference("Gemma", hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                              intermediate_size=8, use_bidirectional_attention=True),
                            "use_bidirectional_attention"),
    "olmo clip_qkv": (lambda: reference("Olmo", hidden_size=16, num_attention_heads=2, intermediate_size=8, clip_qkv=8.0),
                      "clip_qkv=8.0"),
    "nemotron quick_gelu": (lambda: reference("Nemotron", hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                                              intermediate_size=8,
                                              hidden_act="quick_gelu"), "hidden_act='quick_gelu'"),
}


@pytest.mark.parametrize("case", FROM_REFUSED)
def test_from_hf_refuses_what_zoo_cannot_express(case):
    build, message = FROM_REFUSED[case]
    with pytest.raises(ConversionError, match=message):
        from_hf(build())


TINY = ["d_model=32", "n_layers=1", "block.ffn.hidden=48", f"vocab_size={V}", "max_seq_len=32"]
HEADS = {  # heads that divide d_model 32, as each preset's attention kind allows
    "qwen2-tiny": ["block.attention.n_heads=4", "block.attention.n_kv_heads=2"],
    "pythia-tiny": ["block.attention.n_heads=4"],
    "olmo2-tiny": ["block.attention.n_heads=4"],
    "nemotron-tiny": ["block.attention.n_heads=4", "block.attention.n_kv_heads=2"],
    "llama-small": ["block.attention.n_heads=4", "block.attention.n_kv_heads=2"],
    "gpt2-small": ["block.attention.n_heads=4"],
    "transformer-base": ["block.attention.n_heads=4"],
}
TO_REFUSED = {
    "window to llama": ("mistral-tiny", [], "LlamaForCausalLM", "block.attention.window=128"),
    "window to gpt2": ("gpt2-small", ["block.attention.window=8"], "GPT2LMHeadModel", "block.attention.window=8"),
    "q/k/v-only biases to llama": ("qwen2-tiny", [], "LlamaForCausalLM", "block.attention.out_bias=False"),
    "output bias to qwen2": ("qwen2-tiny", ["block.attention.out_bias=true"], "Qwen2ForCausalLM", "block.attention.out_bias=True"),
    "no biases to qwen2": ("llama-small", [], "Qwen2ForCausalLM", "block.attention.bias=False"),
    "head_dim to qwen2": ("qwen2-tiny", ["block.attention.head_dim=16", "block.attention.v_head_dim=16"], "Qwen2ForCausalLM",
                          "block.attention.head_dim=16"),
    "biases to mistral": ("llama-small", ["block.attention.bias=true"], "MistralForCausalLM", "block.attention.bias=True"),
    "partial rotary to llama": ("pythia-tiny", ["block.norm.kind=rmsnorm", "block.kind=pre", "block.ffn.kind=swiglu",
                                                "block.ffn.bias=false", "block.attention.bias=false"],
                                "LlamaForCausalLM", "position.fraction=0.25"),
    "parallel to gpt2": ("gpt2-small", ["block.kind=parallel"], "GPT2LMHeadModel", "block.kind='parallel'"),
    "parallel to timm": ("vit-tiny-16", ["block.kind=parallel"], "timm", "block.kind='parallel'"),
    "shared-norm parallel to neox": ("pythia-tiny", ["block.shared_norm=true"], "GPTNeoXForCausalLM",
                                     "block.shared_norm=True"),
    "neox with gqa": ("pythia-tiny", ["block.attention.kind=gqa", "block.attention.n_kv_heads=2"], "GPTNeoXForCausalLM",
                      "block.attention.n_kv_heads=2"),
    "exact geglu to gemma": ("gemma-tiny", ["block.ffn.approximate=none"], "GemmaForCausalLM", "block.ffn.kind='geglu'"),
    "gemma without the unit offset": ("gemma-tiny", ["block.norm.unit_offset=false"], "GemmaForCausalLM",
                                      "block.norm.unit_offset=False"),
    "unit offset to llama": ("gemma-tiny", ["embedding.scale=false", "embedding.round_scale=false"], "LlamaForCausalLM",
                             "block.norm.unit_offset=True"),
    "rounded scale to marian": ("transformer-base", ["embedding.round_scale=true"], "MarianMTModel", "embedding.round_scale=True"),
    "post-sublayer norms to llama": ("llama-small", ["block.kind=post_sublayer"], "LlamaForCausalLM",
                                     "block.kind='post_sublayer'"),
    "qk-norm to llama": ("llama-small", ["block.attention.qk_norm={kind: rmsnorm, scope: all}"], "LlamaForCausalLM",
                         "block.attention.qk_norm="),
    "qk-norm per head to olmo2": ("olmo2-tiny", ["block.attention.qk_norm.scope=head"], "Olmo2ForCausalLM",
                                  "block.attention.qk_norm="),
    "olmo2 without qk-norm": ("olmo2-tiny", ["block.attention.qk_norm=null"], "Olmo2ForCausalLM", "block.attention.qk_norm=None"),
    "olmo2 qk-norm eps apart": ("olmo2-tiny", ["block.attention.qk_norm.eps=1e-5"], "Olmo2ForCausalLM",
                                "block.attention.qk_norm.eps=1e-05"),
    "pre-norm to olmo2": ("olmo2-tiny", ["block.kind=pre"], "Olmo2ForCausalLM", "block.kind='pre'"),
    "layer scale to llama": ("llama-small", ["block.layer_scale=0.1"], "LlamaForCausalLM", "block.layer_scale=0.1"),
    "qk-norm to gpt2": ("gpt2-small", ["block.attention.qk_norm={kind: layernorm}"], "GPT2LMHeadModel", "block.attention.qk_norm="),
    "two window sizes to qwen2": ("qwen2-tiny", ["n_layers=2", "block.attention.window=3", "layers=[{at: 0, block: {attention: {window: 5}}}]"],
                                  "Qwen2ForCausalLM", r"block.attention.window=\[3, 5\]"),
    "a layer's own position to qwen2": ("qwen2-tiny", ["layers=[{at: 0, position: {kind: none}}]"], "Qwen2ForCausalLM",
                                        "layers=\"layer 0's position\""),
    "a layer pattern to llama": ("llama-small", ["layers=[{at: 0, block: {attention: {window: 5}}}]"], "LlamaForCausalLM",
                                 "layers="),
    "weighted layernorm to olmo": ("olmo-tiny", ["block.norm.affine=true"], "OlmoForCausalLM", "block.norm.affine=True"),
    "non-parametric layernorm to llama": ("olmo-tiny", [], "LlamaForCausalLM", "block.norm.kind='layernorm'"),
    "nemotron without the unit offset": ("nemotron-tiny", ["block.norm.unit_offset=false"], "NemotronForCausalLM",
                                         "block.norm.unit_offset=False"),
    "layernorm1p to gpt2": ("gpt2-small", ["block.norm.unit_offset=true"], "GPT2LMHeadModel", "block.norm.unit_offset=True"),
    "non-parametric layernorm to gpt2": ("gpt2-small", ["block.norm={kind: layernorm, affine: false}"], "GPT2LMHeadModel",
                                         "block.norm.(affine=False|bias=False)"),
    "gated ffn to nemotron": ("nemotron-tiny", ["block.ffn.kind=swiglu"], "NemotronForCausalLM", "block.ffn.kind='swiglu'"),
    "relu2 to gpt2": ("gpt2-small", ["block.ffn.kind=relu2"], "GPT2LMHeadModel", "block.ffn.kind='relu2'"),
    "no architecture fits": ("mistral-tiny", ["block.attention.out_bias=true"], None,
                             "no HF architecture expresses this decoder"),
}


@pytest.mark.parametrize("case", TO_REFUSED)
def test_to_reference_refuses_what_it_cannot_express(case):
    from zoo.interop import to_timm

    preset, overrides, architecture, message = TO_REFUSED[case]
    if preset.startswith("vit"):
        tiny = ["d_model=24", "n_layers=1", "block.attention.n_heads=3", "image_size=32", "patch_size=8"]
    else:
        tiny = TINY + HEADS.get(preset, [])
    model = zoo.build(preset, tiny + overrides, device="meta")
    with pytest.raises(ConversionError, match=message):
        to_timm(model) if architecture == "timm" else to_hf(model, architecture)
