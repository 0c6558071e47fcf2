"""Gemma 2 and Gemma 3 (text) against HF's ``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` at sizes no
release has, and the spec options they brought: attention and final-logit soft-capping
(``block.attention.softcap``, ``head.softcap``), the score scale (``block.attention.scale_dim``), the
(1 + w) qk-norm (``qk_norm.unit_offset``), with sandwich norms, local and global layers and a rope
per layer type (Gemma 3: base and scaling, the 4B model's linear factor 8 on its global layers, yarn
and the other kinds).

Each variant beside the conformance table's one config per class, a random-init reference (eager
attention, so HF applies its soft-capping), goes through the conformance suite's checks (outputs
both ways, padded or not, past the window; every tensor back; its config; cached greedy decoding
past the window). The options are checked against their formulas, shown to change the outputs, and
refused by name where a class cannot express them.
"""

from __future__ import annotations

import pytest
import torch
from conformance_checks import check_config, check_greedy, check_outputs, check_round_trip
from conftest import max_diff, randomize
from torch import nn

import zoo
from zoo import kernels
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf
from zoo.spec import SpecError
from zoo.spec.rope import SCALINGS

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V, WINDOW = 101, 5
S, F = "sliding_attention", "full_attention"

# (HF class, config fields): hidden 48, head size 16, window 5; both local and global layers occur
CASES = {
    "gemma2: GQA 4/2, caps 3 and 2.5 that bite, query_pre_attn_scalar 24": ("Gemma2", {
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
        "query_pre_attn_scalar": 24, "attn_logit_softcapping": 3.0, "final_logit_softcapping": 2.5}),
    "gemma2: MQA 3/1, HF's caps 50 and 30, biases, untied, exact GeGLU": ("Gemma2", {
        "num_hidden_layers": 4, "num_attention_heads": 3, "num_key_value_heads": 1, "intermediate_size": 36,
        "query_pre_attn_scalar": 16, "attention_bias": True, "tie_word_embeddings": False, "hidden_activation": "gelu"}),
    "gemma3: 6 layers, five local per global, bases 1e4 and 1e6, final cap": ("Gemma3Text", {
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
        "query_pre_attn_scalar": 24, "final_logit_softcapping": 4.0}),
    "gemma3: 4 layers alternating (layer_types), bases 100 and 5e4, untied": ("Gemma3Text", {
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 44,
        "layer_types": [S, F, S, F], "rope_parameters": {S: {"rope_type": "default", "rope_theta": 100.0},
                                                         F: {"rope_type": "default", "rope_theta": 5e4}},
        "tie_word_embeddings": False, "rms_norm_eps": 1e-5}),
    # Gemma 3 4B and up: a linear factor 8 on the global layers (given the older way, as rope_scaling)
    "gemma3: 6 layers, linear factor 8 on the global layers (4B and up)": ("Gemma3Text", {
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
        "query_pre_attn_scalar": 24, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    "gemma3: yarn on the global layers, linear 2 on the local ones, alternating": ("Gemma3Text", {
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 44,
        "layer_types": [S, F, S, F], "rope_parameters": {
            S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0},
            F: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0,
                "rope_theta": 5e4}}}),
}


def reference(kind: str, **kw) -> nn.Module:
    kw = {"vocab_size": V, "hidden_size": 48, "head_dim": 16, "sliding_window": WINDOW, "max_position_embeddings": 64,
          "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None, "attn_implementation": "eager", **kw}
    config = getattr(transformers, f"{kind}Config")(**kw)
    model_class = "Gemma3ForCausalLM" if kind == "Gemma3Text" else f"{kind}ForCausalLM"
    return randomize(getattr(transformers, model_class)(config))


def tokens(batch: int = 3, length: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", CASES)
def test_variant_converts_both_ways_and_decodes_as_hf(case):
    """The conformance suite's checks (tests/conformance_checks.py) on each variant: the same logits
    both ways (back in eager attention too), unpadded and padded on either side, on sequences longer
    than the window; every tensor back; the config read and written (layer types included) and the
    class ``to_hf`` picks; tying; cached greedy decoding (local layers keep window - 1 keys) past the
    window, unpadded and left-padded. The windows sit on the local layers."""
    kind, kw = CASES[case]
    hf = reference(kind, **kw)
    model = check_outputs(hf)
    types = hf.config.layer_types
    assert [layer.block.attention.window for layer in model.spec.stack_layers()] == [WINDOW if t == S else None for t in types]
    check_round_trip(hf)
    check_config(hf)
    assert to_hf(model).config.layer_types == types
    assert (model.head.weight is model.tok_emb.weight) == hf.config.tie_word_embeddings
    check_greedy(hf)


def test_gradients_through_the_soft_caps_equal_hf():
    """Training sees the same function: the loss's gradients (through both caps and the scores
    kernel) equal HF's eager ones."""
    hf = reference("Gemma2", **CASES["gemma2: GQA 4/2, caps 3 and 2.5 that bite, query_pre_attn_scalar 24"][1])
    model = from_hf(hf)
    x = tokens()
    torch.nn.functional.cross_entropy(model(x)[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1)).backward()
    hf(x, labels=x).loss.backward()
    ours, theirs = model.stack.blocks[1].attn.qkv.weight.grad, hf.model.layers[1].self_attn.q_proj.weight.grad
    assert max_diff(ours[: theirs.shape[0]], theirs) < 1e-5
    assert max_diff(model.tok_emb.weight.grad, hf.model.embed_tokens.weight.grad) < 1e-5


def test_gemma3_release_configs_read_as_patterns():
    """Gemma 3 1B's layout (26 layers, window 512, global every sixth from layer 5, bases 1e4 and
    1e6) is one pattern; Gemma 2 2B's (alternating, caps 50 and 30) another. Read without building."""
    g3 = hf_spec(transformers.Gemma3TextConfig(vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                                               num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                                               head_dim=256, sliding_window=512, max_position_embeddings=32768))
    assert g3.block.attention.window == 512 and g3.position.base == 10000.0 and g3.block.attention.scale_dim is None
    assert [p.model_dump(mode="json", exclude_none=True) for p in g3.layers] == [
        {"at": "5::6", "block": {"attention": {"window": None}}, "position": {"kind": "rope", "base": 1e6, "fraction": 1.0, "scaling": None, "pairs": "half"}}]
    assert g3.block.attention.qk_norm.unit_offset and g3.block.attention.softcap is None and g3.head.softcap is None
    g2 = hf_spec(transformers.Gemma2Config(num_hidden_layers=26, hidden_size=2304, intermediate_size=9216))
    assert (g2.block.attention.softcap, g2.head.softcap, g2.layers[0].at) == (50.0, 30.0, "1::2")


@pytest.mark.parametrize("rope", [
    {"rope_type": "dynamic", "factor": 3.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0],
     "long_factor": [1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0, 20.0], "original_max_position_embeddings": 16},
], ids=lambda rope: rope["rope_type"])
def test_gemma3_each_scaling_on_the_global_layers_equals_hf(rope):
    """The other scalings on Gemma 3's global layers (max_position_embeddings 16): a 24-token pass
    past it, then a 9-token one (dynamic back to its plain frequencies, longrope to its short
    factors), and greedy decoding through the cache from 9 to 24 tokens."""
    hf = reference("Gemma3Text", num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, intermediate_size=40,
                   max_position_embeddings=16, layer_types=[S, F, S, F],
                   rope_parameters={S: {"rope_type": "default", "rope_theta": 100.0}, F: {**rope, "rope_theta": 1e4}})
    model = from_hf(hf)
    assert model.spec.layers[0].position.scaling.kind == rope["rope_type"]
    x = tokens(2, 24)
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < ATOL
        assert max_diff(model(x[:, :9]), hf(x[:, :9]).logits) < ATOL
    hf.generation_config.eos_token_id = None
    ours = zoo.generate(model, x[:, :9], max_new_tokens=15).tokens
    assert torch.equal(ours, hf.generate(x[:, :9], max_new_tokens=15, do_sample=False, pad_token_id=0)[:, 9:])


def test_gemma3_4b_config_reads_its_scaled_global_rope_into_the_pattern():
    """Gemma 3 4B's layout (34 layers, window 1024, rope_scaling linear 8 on the global layers, which
    Gemma3TextConfig puts in rope_parameters.full_attention): the local rope is the model's position,
    the global layers' pattern carries base 1e6 and the scaling; written back, each layer type's
    rope_parameters is HF's own."""
    config = transformers.Gemma3TextConfig(vocab_size=262208, hidden_size=2560, intermediate_size=10240,
                                           num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
                                           head_dim=256, sliding_window=1024, max_position_embeddings=131072,
                                           rope_scaling={"rope_type": "linear", "factor": 8.0})
    spec = hf_spec(config)
    assert spec.position.model_dump(mode="json") == {"kind": "rope", "base": 10000.0, "fraction": 1.0, "scaling": None,
                                                     "pairs": "half"}
    assert [p.model_dump(mode="json", exclude_none=True) for p in spec.layers] == [
        {"at": "5::6", "block": {"attention": {"window": None}},
         "position": {"kind": "rope", "base": 1e6, "fraction": 1.0, "scaling": {"kind": "linear", "factor": 8.0},
                      "pairs": "half"}}]
    assert [i for i, layer in enumerate(spec.stack_layers()) if layer.position is not None] == [5, 11, 17, 23, 29]
    back = hf_config(spec)
    assert type(back).__name__ == "Gemma3TextConfig" and back.rope_parameters == config.rope_parameters
    assert back.layer_types == config.layer_types and hf_spec(back) == spec


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("gemma3")])
def test_gemma3_rope_parameters_round_trip_per_layer_type(case):
    """Each layer type's rope_parameters, base and scaling, reads into zoo (the local rope as the
    model's position, the global one in the pattern where it differs) and is written back as HF
    reads it (a rope_scaling given the older way comes back as rope_parameters.full_attention)."""
    kind, kw = CASES[case]
    config = reference(kind, **kw).config
    spec = hf_spec(config)
    for layer, t in zip(spec.stack_layers(), config.layer_types, strict=True):
        position, params = layer.position or spec.position, dict(config.rope_parameters[t])
        kind, base = params.pop("rope_type"), params.pop("rope_theta")
        assert position.base == base
        assert position.scaling == (None if kind == "default" else SCALINGS[kind](**params))
    assert spec.layers[0].position is not None  # the global layers' rope differs in every case
    assert hf_config(spec).rope_parameters == config.rope_parameters


# ------------------------------------------------------------------------------------ the options
SPEC = {
    "family": "decoder", "vocab_size": V, "max_seq_len": 32, "d_model": 24, "n_layers": 2, "head": {"kind": "lm"},
    "position": {"kind": "rope"},
    "block": {"kind": "sandwich", "attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "v_head_dim": 8,
                            "bias": False},
              "ffn": {"kind": "geglu", "hidden": 40, "bias": False}, "norm": {"kind": "rmsnorm"}},
}


def build(*overrides: str) -> nn.Module:
    """A model of SPEC with ``overrides``, its weights the same random ones (large enough that the
    scores and logits reach the caps) whatever the overrides."""
    model = zoo.build(zoo.load_spec(SPEC, list(overrides)), seed=0)
    weights = randomize(zoo.build(SPEC, seed=0)).state_dict()
    model.load_state_dict({k: weights.get(k, v) for k, v in model.state_dict().items()})
    return model.eval()


def test_soft_capping_changes_outputs_and_bounds_them():
    x = tokens(2, 9)
    with torch.no_grad():
        plain = build()(x)
        capped = build("block.attention.softcap=0.5")(x)
        wide = build("block.attention.softcap=1e6")(x)  # a cap far above every score: nothing to cap
        head = build("head.softcap=0.3")(x)
    assert max_diff(capped, plain) > 1e-2 and max_diff(wide, plain) < 1e-5
    assert head.abs().max() <= 0.3 < plain.abs().max() and torch.allclose(head, 0.3 * torch.tanh(plain / 0.3), atol=1e-6)


def test_soft_capped_attention_computes_its_formula_on_the_scores_kernel(monkeypatch):
    """The spec declares the kernel: a cap takes kernels.scores_attention (no fused kernel caps),
    which computes softmax(cap * tanh(q k^T * scale / cap) + mask) v; without a cap the fused one."""
    spec = zoo.load_spec(SPEC, ["block.attention.softcap=2.0", "block.attention.scale_dim=12"])
    assert spec.block.attention.kernel == "scores" and zoo.load_spec(SPEC).block.attention.kernel == "fused"
    calls = []
    real = kernels.scores_attention
    monkeypatch.setattr(kernels, "scores_attention", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    model = zoo.build(spec, seed=0).eval()
    with torch.no_grad():
        model(tokens(2, 9))
    assert len(calls) == 2 and calls[0]["softcap"] == 2.0 and calls[0]["scale"] == 12 ** -0.5

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g) * 3 for _ in range(3))
    mask = torch.rand(2, 1, 7, 7, generator=g) > 0.3
    mask[..., 0] = True
    scores = (2.0 * torch.tanh(q @ k.transpose(-2, -1) * 0.3 / 2.0)).masked_fill(~mask, float("-inf"))
    want = scores.softmax(-1) @ v
    assert torch.allclose(real(q, k, v, mask=mask, scale=0.3, softcap=2.0), want, atol=1e-6)
    # without a cap, the scores kernel computes what SDPA computes (causal, GQA, scale)
    kv = k[:, :2], v[:, :2]
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, *kv, is_causal=True, scale=0.3, enable_gqa=True)
    assert torch.allclose(real(q, *kv, is_causal=True, scale=0.3), sdpa, atol=1e-5)


def test_summary_counts_what_the_scores_kernel_keeps():
    """A soft-capped attention keeps three H x T x T tensors per layer (tanh, weights, their cast),
    a capped head its tanh's output; FLOPs and parameters are unchanged."""
    from zoo.summary import summarize

    plain = summarize(zoo.load_spec(SPEC), seq=16)
    capped = summarize(zoo.load_spec(SPEC, ["block.attention.softcap=50", "head.softcap=30"]), seq=16)
    assert (capped.parameters, capped.flops_forward) == (plain.parameters, plain.flops_forward)
    assert capped.activation_bytes - plain.activation_bytes == (2 * 3 * 4 * 16 * 16 + 16 * V) * 4


def test_scale_dim_is_the_score_scale():
    x = tokens(2, 9)
    with torch.no_grad():
        plain, same, other = build()(x), build("block.attention.scale_dim=8")(x), build("block.attention.scale_dim=30")(x)
    assert torch.allclose(plain, same, atol=1e-6) and max_diff(plain, other) > 1e-3


def test_unit_offset_qk_norm_scales_by_one_plus_weight():
    model = build("block.attention.qk_norm={kind: rmsnorm, unit_offset: true, eps: 1.0e-6}")
    norm = model.stack.blocks[0].attn.q_norm
    assert torch.equal(norm.weight, torch.zeros(8))  # (1 + 0): the identity scale at init
    with torch.no_grad():
        norm.weight.fill_(0.5)
        x = torch.randn(3, 8)
        assert torch.allclose(norm(x), 1.5 * x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt(), atol=1e-6)


@pytest.mark.parametrize("override,field", [
    ("block.attention.softcap=0", "block.attention.softcap"),
    ("block.attention.softcap=-50", "block.attention.softcap"),
    ("block.attention.softcap=.inf", "block.attention.softcap"),
    ("head.softcap=0", "head.softcap"),
    ("block.attention.scale_dim=0", "block.attention.scale_dim"),
    ("block.attention.qk_norm={kind: layernorm, unit_offset: true}", "block.attention.qk_norm: unit_offset"),
])
def test_bad_options_are_spec_errors_naming_the_field(override, field):
    with pytest.raises(SpecError, match=f"{field}: "):
        zoo.load_spec(SPEC, [override])


# ------------------------------------------------------------------------------------ refusals
def test_from_hf_refuses_what_zoo_cannot_express():
    small = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8}
    ropes = {  # each layer type's rope: a rope type zoo does not express, a key its type lacks, a partial rope
        r"rope_parameters.full_attention.rope_type='proportional' .*scalings linear, dynamic": {
            S: {"rope_type": "default"}, F: {"rope_type": "proportional", "partial_rotary_factor": 0.5}},
        r"rope_parameters.full_attention.low_freq_factor=1.0 .*rope_type linear has no low_freq_factor": {
            S: {"rope_type": "default"}, F: {"rope_type": "linear", "factor": 8.0, "low_freq_factor": 1.0}},
        r"rope_parameters.sliding_attention.partial_rotary_factor=0.5 .*rotates every dimension": {
            S: {"rope_type": "default", "partial_rotary_factor": 0.5}, F: {"rope_type": "linear", "factor": 8.0}},
    }
    for message, rope in ropes.items():
        with pytest.raises(ConversionError, match=message):
            hf_spec(transformers.Gemma3TextConfig(**small, hidden_size=48, head_dim=16, layer_types=[S, F], rope_parameters=rope))
    with pytest.raises(ConversionError, match="attn_logit_softcapping=50.0 .*never applies it"):
        from_hf(reference("Gemma3Text", **small, attn_logit_softcapping=50.0))
    with pytest.raises(ConversionError, match="layer_types='chunked_attention'"):
        from_hf(reference("Gemma2", **small, layer_types=[S, "chunked_attention"]))


GEMMA2 = ["embedding.scale=true", "embedding.round_scale=true", "block.norm.unit_offset=true", "block.ffn.approximate=tanh"]
GEMMA3 = [*GEMMA2, "block.attention.qk_norm={kind: rmsnorm, eps: 1.0e-5, unit_offset: true}"]
TO_REFUSED = {
    "attention cap to gemma3": (GEMMA3 + ["block.attention.softcap=50"], "Gemma3ForCausalLM", "block.attention.softcap=50.0"),
    "attention cap to gemma": (GEMMA2[:3] + ["block.kind=pre", "block.attention.softcap=50"], "GemmaForCausalLM",
                               "block.attention.softcap=50.0"),
    "scale_dim to llama": (["block.kind=pre", "block.ffn.kind=swiglu", "block.attention.scale_dim=12"], "LlamaForCausalLM",
                           "block.attention.scale_dim=12"),
    "final cap to mistral": (["block.kind=pre", "block.ffn.kind=swiglu", "head.softcap=30"], "MistralForCausalLM",
                             "head.softcap=30.0"),
    "qk-norm without the offset to gemma3": (GEMMA3[:-1] + ["block.attention.qk_norm={kind: rmsnorm, eps: 1.0e-5}"],
                                             "Gemma3ForCausalLM", "block.attention.qk_norm="),
    "qk-norm to gemma2": (GEMMA3, "Gemma2ForCausalLM", "block.attention.qk_norm="),
    "two window sizes to gemma2": (GEMMA2 + ["block.attention.window=3", "layers=[{at: 0, block: {attention: {window: 5}}}]"],
                                   "Gemma2ForCausalLM", r"block.attention.window=\[3, 5\]"),
    "a layer's own rope base to gemma2": (GEMMA2 + ["layers=[{at: 1, position: {kind: rope, base: 100.0}}]"],
                                          "Gemma2ForCausalLM", "layers=\"layer 1's position\""),
    "two rope bases among gemma3's sliding layers": (
        GEMMA3 + ["n_layers=3", "block.attention.window=4", "layers=[{at: 1, position: {kind: rope, base: 100.0}}]"],
        "Gemma3ForCausalLM", "layers=\"layer 1's rope base 100\""),
    "two scalings among gemma3's global layers": (
        GEMMA3 + ["n_layers=4", "block.attention.window=4", ("layers=[{at: '1::2', block: {attention: {window: null}}, "
                  "position: {kind: rope, base: 1.0e6, scaling: {kind: linear, factor: 8.0}}}, {at: 3, position: "
                  "{kind: rope, base: 1.0e6, scaling: {kind: dynamic, factor: 8.0}}}]")],
        "Gemma3ForCausalLM", ("layers=\"layer 3's rope base 1e\\+06 with dynamic scaling {'factor': 8.0}\" .*its "
        "full_attention layers .* have rope base 1e\\+06 with linear scaling")),
    "a layer without positions to gemma3": (GEMMA3 + ["layers=[{at: 1, position: {kind: none}}]"], "Gemma3ForCausalLM",
                                            "layers=\"layer 1's position"),
    "another ffn on a layer to gemma2": (GEMMA2 + ["layers=[{at: -1, block: {ffn: {hidden: 16}}}]"], "Gemma2ForCausalLM",
                                         "layers=\"layer 1's block\""),
    "pre-norm to gemma2": (GEMMA2 + ["block.kind=pre"], "Gemma2ForCausalLM", "block.kind='pre'"),
}


@pytest.mark.parametrize("case", TO_REFUSED)
def test_to_hf_refuses_what_it_cannot_express(case):
    overrides, architecture, message = TO_REFUSED[case]
    model = zoo.build(zoo.load_spec(SPEC, overrides), device="meta")
    with pytest.raises(ConversionError, match=message):
        to_hf(model, architecture)
