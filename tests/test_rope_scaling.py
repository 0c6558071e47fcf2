"""RoPE scaling (``position.scaling``) against HF transformers: the frequencies and attention factor
of each kind equal ``ROPE_INIT_FUNCTIONS``'s bit for bit; tiny random-init LLaMA models (and the
other decoders HF scales) with each kind give zoo's logits past their original context; cached
decoding and greedy generation follow HF's dynamic and longrope updates step by step; configs
round-trip; per-layer scalings (Gemma 3's local and global layers) build one rope per distinct
position; malformed blocks are SpecErrors and unknown rope types ConversionErrors, by name.

The original context is 16 tokens and the sequences 40, so every kind runs past it."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_greedy_equals_hf, max_diff, positions, randomize

import zoo
from zoo.components.rope import RotaryPosition, scaled_frequencies
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf
from zoo.spec import SpecError

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
V, ORIGINAL, LONG, ATOL = 61, 16, 40, 1e-4

# HF rope_parameters (rope_theta aside) of each kind and variant; 6 rotated pairs (head size 12)
SHORT, LONG_F = [1.0, 1.1, 1.4, 2.0, 2.5, 3.0], [1.0, 1.7, 3.0, 5.0, 8.0, 12.0]
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn ramp, mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                          "beta_fast": 2.0, "beta_slow": 0.05, "mscale": 0.9, "mscale_all_dim": 0.6, "truncate": False},
    "yarn attention_factor": {"rope_type": "yarn", "factor": 6.0, "original_max_position_embeddings": ORIGINAL,
                              "attention_factor": 1.3},
    "longrope": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG_F,
                 "original_max_position_embeddings": ORIGINAL},
    "longrope factor": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG_F,
                        "original_max_position_embeddings": ORIGINAL, "factor": 3.0},
}
THETA = {"llama3": 10000.0}  # enough bands for llama3's three; the others turn faster at 500


def llama_config(name: str, **kw):
    rope = SCALINGS[name]
    # HF's dynamic scaling starts past max_position_embeddings; the others read their original length
    max_len = ORIGINAL if rope["rope_type"] == "dynamic" else 64
    fields = {"vocab_size": V, "hidden_size": 36, "num_attention_heads": 3, "num_key_value_heads": 1,
              "intermediate_size": 40, "num_hidden_layers": 2, "max_position_embeddings": max_len, "bos_token_id": 0,
              "eos_token_id": 0, "rope_parameters": {**rope, "rope_theta": THETA.get(rope["rope_type"], 500.0)}}
    return transformers.LlamaConfig(**{**fields, **kw})


def llama(name: str, seed: int = 0, **kw):
    return randomize(transformers.LlamaForCausalLM(llama_config(name, **kw)), seed)


def tokens(batch: int = 2, length: int = LONG, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ frequencies
def _partial_config(name: str):
    """GPT-NeoX with half of each 12-wide head rotating (3 pairs)."""
    rope = dict(SCALINGS[name])
    for key in ("short_factor", "long_factor"):
        if key in rope:
            rope[key] = rope[key][:3]
    max_len = ORIGINAL if rope["rope_type"] == "dynamic" else 64
    return transformers.GPTNeoXConfig(vocab_size=V, hidden_size=36, num_attention_heads=3, intermediate_size=40,
                                      num_hidden_layers=1, max_position_embeddings=max_len,
                                      rope_parameters={**rope, "rope_theta": 500.0, "partial_rotary_factor": 0.5})


@pytest.mark.parametrize("partial", [False, True], ids=["whole head", "partial rotary"])
@pytest.mark.parametrize("name", SCALINGS)
def test_frequencies_and_attention_factor_equal_hf(name, partial):
    """zoo's inv_freq and attention factor are HF's ROPE_INIT_FUNCTIONS output, bit for bit: at
    build time, and for a 40-token pass (dynamic's grown base, longrope's long factors)."""
    config = _partial_config(name) if partial else llama_config(name)
    spec = hf_spec(config)
    rope, R = spec.position, spec.position.rotary_dims(12)
    assert rope.scaling.kind == config.rope_parameters["rope_type"]
    init = ROPE_INIT_FUNCTIONS[rope.scaling.kind]
    for seq_len in (None, LONG):
        theirs, their_factor = init(config, None, seq_len=None if seq_len is None else torch.tensor(seq_len))
        ours, our_factor = scaled_frequencies(R, rope.base, rope.scaling, max_len=spec.max_seq_len, seq_len=seq_len)
        assert torch.equal(ours, theirs), (seq_len, ours, theirs)
        assert our_factor == their_factor
    if rope.scaling.kind in ("dynamic", "longrope"):  # past the original length they do change
        assert not torch.equal(scaled_frequencies(R, rope.base, rope.scaling, max_len=spec.max_seq_len)[0], ours)


def test_phi3_long_context_picks_long_factors_past_the_original_length():
    """Phi-3's rotary module (original_max_position_embeddings outside rope_parameters, factor from
    max_position_embeddings): cos and sin for sequences within and past the original length."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    config = transformers.Phi3Config(hidden_size=36, num_attention_heads=3, max_position_embeddings=64,
                                     original_max_position_embeddings=ORIGINAL,
                                     rope_parameters={"rope_type": "longrope", "short_factor": SHORT,
                                                      "long_factor": LONG_F, "rope_theta": 500.0})
    hf = Phi3RotaryEmbedding(config)
    spec = zoo.spec.LongRopeScalingSpec(short_factor=SHORT, long_factor=LONG_F, original_max_position_embeddings=ORIGINAL)
    ours = RotaryPosition(12, base=500.0, scaling=spec, max_len=64)
    q, k = torch.randn(2, 3, LONG, 12), torch.randn(2, 1, LONG, 12)
    for length in (ORIGINAL, ORIGINAL + 1, LONG, 9):
        pos = torch.arange(length)
        cos, sin = hf(q, pos[None])
        assert hf.attention_scaling == ours.attention_factor
        for a, b in zip(ours.rotate(q[..., :length, :], k[..., :length, :], pos),
                        apply_rotary_pos_emb(q[..., :length, :], k[..., :length, :], cos, sin)):
            assert max_diff(a, b) < 1e-6, length


# ------------------------------------------------------------------------------ LLaMA
@pytest.mark.parametrize("name", SCALINGS)
def test_llama_logits_equal_hf_past_the_original_length(name):
    """A 40-token pass (past the original 16), a 9-token one after it (dynamic returns to the plain
    frequencies, longrope to its short factors), and a left-padded batch."""
    hf = llama(name)
    model = from_hf(hf)
    x = tokens()
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, :7] = False
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < ATOL
        assert max_diff(model(x[:, :9]), hf(x[:, :9]).logits) < ATOL
        ref = hf(x, attention_mask=mask, position_ids=positions(mask)).logits
        assert max_diff(model(x, mask), ref, mask.unsqueeze(-1).expand_as(ref)) < ATOL


@pytest.mark.parametrize("name", SCALINGS)
def test_llama_round_trip_keeps_the_rope_parameters(name):
    hf = llama(name)
    model = from_hf(hf)
    back = to_hf(model)
    assert back.config.rope_parameters == hf.config.rope_parameters
    assert back.config.max_position_embeddings == hf.config.max_position_embeddings
    assert from_hf(back).spec == model.spec
    assert torch.equal(back.model.rotary_emb.inv_freq, hf.model.rotary_emb.inv_freq)


def test_the_older_spelling_reads_as_rope_parameters():
    """transformers 4's config.json: rope_theta beside rope_scaling, whose kind is `type`."""
    config = transformers.LlamaConfig(hidden_size=36, num_attention_heads=3, max_position_embeddings=ORIGINAL,
                                      rope_theta=500.0, rope_scaling={"type": "dynamic", "factor": 3.0})
    spec = hf_spec(config)
    assert spec.position == zoo.spec.RopeSpec(base=500.0, scaling={"kind": "dynamic", "factor": 3.0})
    assert hf_config(spec).rope_parameters == {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 3.0}


@pytest.mark.parametrize("name", ["dynamic", "longrope", "yarn", "llama3"])
def test_cached_decoding_follows_hf_step_by_step(name):
    """Prefill 10 tokens, then one at a time to 40 through the KV cache, in zoo and in HF: every
    step's logits agree. For dynamic and longrope the keys keep the rotation of the step that made
    them, as in HF, so the last step differs from a full 40-token pass."""
    hf = llama(name)
    model = from_hf(hf)
    x = tokens()
    with torch.no_grad():
        out = hf(x[:, :10], use_cache=True)
        past, theirs = out.past_key_values, [out.logits]
        cache = model.new_cache(LONG)
        ours = [model(x[:, :10], cache=cache)]
        for t in range(10, LONG):
            out = hf(x[:, t : t + 1], cache=past, use_cache=True)
            past = out.past_key_values
            theirs.append(out.logits)
            ours.append(model(x[:, t : t + 1], cache=cache))
        ours, theirs = torch.cat(ours, dim=1), torch.cat(theirs, dim=1)
        assert max_diff(ours, theirs) < ATOL
        full = model(x)
    path_dependent = name in ("dynamic", "longrope")
    assert (max_diff(ours[:, -1], full[:, -1]) > 1e-3) == path_dependent


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("name", ["dynamic", "longrope", "yarn"])
def test_greedy_generation_equals_hf_past_the_original_length(name, padded):
    hf = llama(name, seed=2)
    prompt = tokens(2, 8, seed=3)
    mask = None
    if padded:
        mask = torch.ones_like(prompt, dtype=torch.bool)
        mask[0, :3] = False
    assert_greedy_equals_hf(from_hf(hf), hf, prompt, mask, LONG - 8)


# ------------------------------------------------------------------------------ other decoders
OTHERS = {
    "Mistral": {"num_key_value_heads": 1, "sliding_window": None},
    "Qwen2": {"num_key_value_heads": 1},
    "Olmo2": {"num_key_value_heads": 1},
    "Gemma": {"num_key_value_heads": 1, "head_dim": 12},
    "GPTNeoX": {"rotary_pct": 1.0},
    "StableLm": {"num_key_value_heads": 1, "partial_rotary_factor": 1.0},
    "Cohere": {"num_key_value_heads": 1},  # each scaling in the interleaved layout
    "Olmo": {"num_key_value_heads": 1},
    "Nemotron": {"num_key_value_heads": 1, "partial_rotary_factor": 1.0},
}


@pytest.mark.parametrize("name", ["linear", "dynamic", "llama3", "yarn ramp, mscale", "longrope"])
@pytest.mark.parametrize("arch", OTHERS)
def test_other_decoders_convert_each_scaling(arch, name):
    rope = SCALINGS[name]
    max_len = ORIGINAL if rope["rope_type"] == "dynamic" else 64
    config = getattr(transformers, f"{arch}Config")(
        vocab_size=V, hidden_size=36, num_attention_heads=3, intermediate_size=40, num_hidden_layers=2,
        max_position_embeddings=max_len, rope_parameters={**rope, "rope_theta": THETA.get(rope["rope_type"], 500.0)},
        **OTHERS[arch])
    hf = randomize(getattr(transformers, f"{arch}ForCausalLM")(config))
    model = from_hf(hf)
    x = tokens()
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < ATOL
    back = to_hf(model, f"{arch}ForCausalLM")
    assert {k: v for k, v in back.config.rope_parameters.items() if k != "partial_rotary_factor"} == \
        {k: v for k, v in hf.config.rope_parameters.items() if k != "partial_rotary_factor"}


@pytest.mark.parametrize("arch", ["Llama", "GPTNeoX"])
def test_a_rope_type_zoo_does_not_express_is_refused_by_name(arch):
    config = getattr(transformers, f"{arch}Config")(
        vocab_size=V, hidden_size=36, num_attention_heads=3, intermediate_size=40, num_hidden_layers=1,
        rope_parameters={"rope_type": "proportional", "rope_theta": 500.0, "partial_rotary_factor": 0.5})
    hf = getattr(transformers, f"{arch}ForCausalLM")(config)
    with pytest.raises(ConversionError, match=r"rope_parameters\.rope_type='proportional' is not supported"):
        from_hf(hf)
    with pytest.raises(ConversionError, match=r"rope_parameters\.rope_type='su'"):
        hf_spec(llama_config("linear", rope_parameters={"rope_type": "su", "rope_theta": 500.0}))
    with pytest.raises(ConversionError, match=r"rope_parameters\.low_freq_factor=1.0 is not supported: rope_type yarn"):
        hf_spec(llama_config("yarn", rope_parameters={**SCALINGS["yarn"], "low_freq_factor": 1.0}))


# ------------------------------------------------------------------------------ per-layer scalings
GEMMA3 = {"family": "decoder", "vocab_size": V, "d_model": 32, "n_layers": 12, "max_seq_len": 64,
          "block": {"kind": "sandwich", "attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                                                      "v_head_dim": 16, "window": 8},
                    "ffn": {"kind": "geglu", "approximate": "tanh", "hidden": 48}, "norm": {"kind": "rmsnorm"}},
          "position": {"kind": "rope", "base": 10000.0},
          "layers": [{"at": "5::6", "block": {"attention": {"window": None}},
                      "position": {"kind": "rope", "base": 1.0e6, "scaling": {"kind": "linear", "factor": 8.0}}}]}


def test_gemma3_local_and_global_layers_turn_as_hf():
    """Gemma 3: base 10k on the local layers, 1M with linear scaling on the global ones (5, 11):
    each layer's rotation equals HF Gemma3's rotary module for its layer type, and the two global
    layers share one rope module."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding, apply_rotary_pos_emb

    model = zoo.build(GEMMA3, seed=0).eval()
    config = transformers.Gemma3TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           num_hidden_layers=12, max_position_embeddings=64,
                                           rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                            "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                               "rope_theta": 1e6}})
    hf = Gemma3RotaryEmbedding(config)
    x = tokens(1, LONG)
    ctx = model.stack.context(model.position, x, None, causal=True)
    assert len(model.stack.positions) == 1  # one module for layers 5 and 11
    q, k = torch.randn(1, 4, LONG, 16), torch.randn(1, 2, LONG, 16)
    for i, layer_type in enumerate(config.layer_types):
        pos = ctx.layers[i].pos
        assert pos is (model.stack.positions[0] if i in (5, 11) else model.position)
        assert torch.equal(pos.inv_freq, getattr(hf, f"{layer_type}_inv_freq"))
        cos, sin = hf(q, torch.arange(LONG)[None], layer_type)
        for a, b in zip(pos.rotate(q, k, torch.arange(LONG)), apply_rotary_pos_emb(q, k, cos, sin)):
            assert max_diff(a, b) < 1e-6


def test_the_stack_builds_one_rope_per_distinct_layer_position():
    spec = {**GEMMA3, "layers": [
        {"at": 5, "position": {"kind": "rope", "base": 1e6, "scaling": {"kind": "linear", "factor": 8.0}}},
        {"at": 11, "block": {"ffn": {"hidden": 40}}, "position": {"kind": "rope", "base": 1e6,
                                                                 "scaling": {"kind": "linear", "factor": 8.0}}},
        {"at": [2, 8], "position": {"kind": "rope", "base": 1e6, "scaling": {"kind": "yarn", "factor": 4.0,
                                                                           "original_max_position_embeddings": 16}}},
    ]}
    model = zoo.build(spec, seed=0)
    own = model.stack.positions
    assert len(own) == 2 and {p.scaling.kind for p in own} == {"linear", "yarn"}
    ctx = model.stack.context(model.position, tokens(1, 5), None, causal=True)
    assert ctx.layers[5].pos is ctx.layers[11].pos is not model.position  # another block, the same position
    assert ctx.layers[2].pos is ctx.layers[8].pos and ctx.layers[2].pos.attention_factor > 1


def test_a_layers_own_dynamic_scaling_computes_as_the_models():
    """Dynamic scaling given to every layer by a pattern computes what the model-wide one does: the
    stack updates a layer's own rope as it does the model's (through cached decoding too)."""
    dynamic = {"kind": "rope", "base": 500.0, "scaling": {"kind": "dynamic", "factor": 3.0}}
    base = {"family": "decoder", "vocab_size": V, "d_model": 24, "n_layers": 2, "max_seq_len": ORIGINAL,
            "block": {"attention": {"kind": "mha", "n_heads": 2}}}
    whole = zoo.build({**base, "position": dynamic}, seed=0).eval()
    layered = zoo.build({**base, "position": {"kind": "rope", "base": 500.0}, "layers": [{"at": "0:", "position": dynamic}]})
    layered.load_state_dict(whole.state_dict())
    layered.eval()
    x = tokens(2, LONG)
    with torch.no_grad():
        assert torch.equal(layered(x), whole(x))
        caches = [m.new_cache(LONG) for m in (whole, layered)]
        steps = [[m(x[:, :4], cache=c)] + [m(x[:, t : t + 1], cache=c) for t in range(4, LONG)]
                 for m, c in zip((whole, layered), caches)]
    assert torch.equal(torch.cat(steps[0], dim=1), torch.cat(steps[1], dim=1))


def test_files_carry_the_scaling_and_recompute_its_frequencies(tmp_path):
    hf = llama("longrope")
    model = from_hf(hf)
    zoo.save(model, tmp_path / "m.safetensors")
    loaded = zoo.load(tmp_path / "m.safetensors").eval()
    assert loaded.spec == model.spec
    for name in ("inv_freq", "long_inv_freq"):
        assert torch.equal(getattr(loaded.position, name), getattr(model.position, name))
    x = tokens()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


# ------------------------------------------------------------------------------ spec errors
def _spec(scaling, **position):
    return {"family": "decoder", "d_model": 32, "block": {"attention": {"kind": "mha", "n_heads": 4}},
            "position": {"kind": "rope", **position, "scaling": scaling}}


BAD = {
    "unknown kind": ({"kind": "ntk"}, r"position\.scaling: unknown rope scaling kind 'ntk'.*known: linear, dynamic, llama3, yarn, longrope"),
    "no kind": ({"factor": 2.0}, r"position\.scaling: missing 'kind': one of linear"),
    "a bare name": ("linear", r"position\.scaling: expected a mapping such as \{kind: linear, \.\.\.\}"),
    "no factor": ({"kind": "linear"}, r"position\.scaling\.factor: Field required"),
    "factor below 1": ({"kind": "dynamic", "factor": 0.5}, r"position\.scaling\.factor: Input should be greater than or equal to 1"),
    "another kind's field": ({"kind": "linear", "factor": 2.0, "low_freq_factor": 1.0},
                             r"position\.scaling\.low_freq_factor: unknown key"),
    "llama3 without its lengths": ({"kind": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
                                   r"position\.scaling\.original_max_position_embeddings: Field required"),
    "llama3 bands reversed": ({"kind": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                               "original_max_position_embeddings": 16},
                              r"position\.scaling\.high_freq_factor: must be at least low_freq_factor \(4\.0\)"),
    "yarn betas reversed": ({"kind": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 1.0,
                             "beta_slow": 2.0}, r"position\.scaling\.beta_slow: must be at most beta_fast \(1\.0\)"),
    "yarn mscale alone": ({"kind": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0},
                          r"position\.scaling\.mscale_all_dim: mscale is given without mscale_all_dim.*give both or neither"),
    "longrope lists too short": ({"kind": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 4,
                                  "original_max_position_embeddings": 16},
                                 (r"position\.scaling\.short_factor: longrope has one factor per rotated pair of "
                                  r"dimensions, 4 here \(8 rotated dimensions / 2\), got 3; give 4 factors")),
    "longrope negative factor": ({"kind": "longrope", "short_factor": [1.0, -1.0, 1.0, 1.0], "long_factor": [2.0] * 4,
                                  "original_max_position_embeddings": 16}, r"position\.scaling\.short_factor\.1: Input should be greater than 0"),
}


@pytest.mark.parametrize("case", BAD)
def test_malformed_scalings_name_the_field_and_the_fix(case):
    scaling, message = BAD[case]
    with pytest.raises(SpecError, match=message):
        zoo.parse_spec(_spec(scaling))


def test_scaling_problems_name_the_layer_and_follow_the_rotated_dimensions():
    longrope = {"kind": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "original_max_position_embeddings": 16}
    zoo.parse_spec(_spec(longrope))  # 8-wide heads: 4 pairs
    with pytest.raises(SpecError, match=r"position\.scaling\.long_factor: .* 2 here \(4 rotated dimensions / 2\), got 4"):
        zoo.parse_spec(_spec(longrope, fraction=0.5))
    with pytest.raises(SpecError, match=r"position\.scaling\.kind: dynamic .* needs R >= 4, got 2"):
        zoo.parse_spec(_spec({"kind": "dynamic", "factor": 2.0}, fraction=0.25))
    layered = {**_spec(None), "n_layers": 3, "layers": [{"at": 1, "position": {"kind": "rope", "scaling": {**longrope, "short_factor": [1.0]}}}]}
    with pytest.raises(SpecError, match=r"layers\.0\.position\.scaling\.short_factor: .* 4 here"):
        zoo.parse_spec(layered)


def test_overrides_switch_the_scaling_kind_keeping_what_the_new_kind_knows():
    llama3 = "{kind: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64}"
    spec = zoo.load_spec("llama-tiny", [f"position.scaling={llama3}", "position.scaling.kind=dynamic"])
    assert spec.position.scaling == zoo.spec.DynamicScalingSpec(factor=8.0)
    spec = zoo.load_spec("llama-tiny", ["position.scaling.kind=linear", "position.scaling.factor=4"])
    assert spec.position.scaling == zoo.spec.LinearScalingSpec(factor=4.0)
    assert zoo.load_spec("llama-tiny", ["position.scaling=null"]).position.scaling is None
