"""DeepSeek-V3 beside the conformance table's config: a variant with one query projection (DeepSeek-V2-Lite's
``q_lora_rank: null``), rope in halves (``rope_interleave: false``), attention biases, plain rope, no dense
layer and one group goes through the suite's checks (logits both ways padded or not, every tensor back, greedy
decoding as HF's ``generate``); checkpoints in the released layout (each expert's matrices apart) convert both
ways, streaming; what zoo cannot express is refused by name."""

from __future__ import annotations

import pytest
import torch
from conformance_checks import check_greedy, check_outputs, check_round_trip, tokens
from conformance_table import build_reference, hf_config
from conftest import max_diff
from test_hf_moe import hf_names, output, write_checkpoint

import zoo
from zoo.interop import ConversionError, hf_spec
from zoo.interop.files import convert
from zoo.spec import apply_overrides, parse_spec

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
NAME = "DeepseekV3ForCausalLM"
VARIANT = dict(q_lora_rank=None, rope_interleave=False, attention_bias=True, first_k_dense_replace=0, n_group=1,
               topk_group=1, rope_parameters={"rope_type": "default", "rope_theta": 500.0})


@pytest.mark.slow
def test_a_variant_converts_both_ways_with_the_same_logits_and_decoding():
    ref = build_reference(NAME, seed=2, **VARIANT)
    check_round_trip(ref)
    model = check_outputs(ref)
    att = model.spec.block.attention
    assert (att.q_lora_rank, att.scale, model.spec.position.pairs, model.spec.layers) == (None, None, "half", [])
    check_greedy(ref)


@pytest.mark.parametrize("name", [NAME, "DeepseekV3Model"])
def test_checkpoints_in_the_released_layout_convert_both_ways(name, tmp_path):
    hf = build_reference(name, seed=1)
    state = write_checkpoint(hf, tmp_path / "hf")
    assert any(".experts.0.gate_proj" in key for key in state) and not any(".experts.0." in k for k in state if ".layers.0." in k)
    x = tokens(2, 9, seed=1)
    ref = output(hf, x)
    done = convert(tmp_path / "hf", tmp_path / "m.safetensors")
    assert done.reference == name and done.ignored == ()
    assert max_diff(output(zoo.load(done.path).eval(), x), ref) < 1e-4
    written = convert(done.path, tmp_path / "back", max_shard_size="16KB")
    assert written.reference == name and hf_names(tmp_path / "back") == set(state)
    loaded = getattr(transformers, name).from_pretrained(str(tmp_path / "back")).eval()
    assert all(torch.equal(t, loaded.state_dict()[k]) for k, t in hf.state_dict().items())


@pytest.mark.parametrize("fields,option", [
    ({"num_key_value_heads": 2}, "num_key_value_heads"), ({"first_k_dense_replace": 3}, "first_k_dense_replace"),
    ({"n_shared_experts": 0}, "n_shared_experts"), ({"hidden_act": "relu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}}, "rope_type"),
])
def test_configs_zoo_cannot_express_are_refused_by_name(fields, option):
    with pytest.raises(ConversionError, match=option):
        hf_spec(hf_config(NAME, **fields))


def test_specs_the_class_cannot_express_are_refused_by_name():
    spec = hf_spec(hf_config(NAME))
    for override, field in (("block.ffn.router.bias_update=0.01", "bias_update"), ("block.attention.scale=0.5", "scale"),
                            ("block.ffn.shared_gate=true", "shared_gate"), ("block.ffn.router.scoring=softmax", "scoring")):
        with pytest.raises(ConversionError, match=field):
            zoo.interop.hf_config(parse_spec(apply_overrides(spec.model_dump(mode="json"), [override])), NAME)


V2 = "DeepseekV2ForCausalLM"
V2_LITE = dict(q_lora_rank=None, topk_method="greedy", n_group=1, topk_group=1, attention_bias=True,
               rope_parameters={"rope_type": "default", "rope_theta": 500.0})


@pytest.mark.slow
def test_a_v2_lite_shaped_variant_converts_both_ways_with_the_same_logits_and_decoding():
    """DeepSeek-V2-Lite's layout: one query projection, greedy routing over all experts (no groups)."""
    ref = build_reference(V2, seed=2, **V2_LITE)
    check_round_trip(ref)
    model = check_outputs(ref)
    att, router = model.spec.block.attention, model.spec.block.ffn.router
    assert (att.q_lora_rank, att.scale, model.spec.position.pairs) == (None, None, "interleaved")
    assert (router.scoring, router.n_groups, router.norm_topk_prob, router.routed_scale) == ("softmax", 1, False, 1.7)
    check_greedy(ref)


@pytest.mark.parametrize("name", [V2, "DeepseekV2Model"])
def test_v2_checkpoints_in_the_released_layout_convert_both_ways(name, tmp_path):
    hf = build_reference(name, seed=1, **V2_LITE)
    state = write_checkpoint(hf, tmp_path / "hf")
    assert any(".experts.0.gate_proj" in key for key in state)
    x = tokens(2, 9, seed=1)
    done = convert(tmp_path / "hf", tmp_path / "m.safetensors")
    assert done.reference == name and done.ignored == ()
    assert max_diff(output(zoo.load(done.path).eval(), x), output(hf, x)) < 1e-4
    convert(done.path, tmp_path / "back", max_shard_size="16KB")
    loaded = getattr(transformers, name).from_pretrained(str(tmp_path / "back")).eval()
    assert all(torch.equal(t, loaded.state_dict()[k]) for k, t in hf.state_dict().items())


@pytest.mark.parametrize("fields,option", [
    ({"topk_method": "noaux_tc"}, "topk_method"), ({"norm_topk_prob": True}, "norm_topk_prob"),
    ({"mlp_bias": True}, "mlp_bias"), ({"moe_layer_freq": 2}, "moe_layer_freq"), ({"scoring_func": "sigmoid"}, "scoring_func"),
    ({"n_group": 4}, "n_group"), ({"topk_group": 4}, "topk_group"), ({"first_k_dense_replace": 3}, "first_k_dense_replace"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"), ({"n_shared_experts": 0}, "n_shared_experts"),
])
def test_v2_configs_zoo_cannot_express_are_refused_by_name(fields, option):
    with pytest.raises(ConversionError, match=option):
        hf_spec(hf_config(V2, **fields))


def test_v2_specs_the_class_cannot_express_are_refused_by_name():
    spec = hf_spec(hf_config(V2))
    for override, field in (("block.ffn.router.group_top=2", "group_top"), ("block.ffn.router.scoring=sigmoid", "scoring"),
                            ("block.ffn.router.norm_topk_prob=true", "norm_topk_prob"), ("block.attention.n_heads=5", "n_heads"),
                            ("block.ffn.router.score_bias=true", "score_bias")):
        with pytest.raises(ConversionError, match=field):
            zoo.interop.hf_config(parse_spec(apply_overrides(spec.model_dump(mode="json"), [override])), V2)
