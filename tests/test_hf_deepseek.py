"""DeepSeek-V3 beside the conformance table's config: a variant with one query projection (DeepSeek-V2-Lite's
``q_lora_rank: null``), rope in halves (``rope_interleave: false``), attention biases, plain rope, no dense
layer and one group goes through the suite's checks (logits both ways padded or not, every tensor back, greedy
decoding as HF's ``generate``); checkpoints in the released layout (each expert's matrices apart) convert both
ways, streaming; what zoo cannot express is refused by name. DeepSeek-V2 (and a V2-Lite-shaped variant) likewise;
a checkpoint holding a multi-token-prediction module (DeepSeek-V3's layer past the last, Qwen3-Next's mtp.*) is refused
naming it, or converts without it and lists it when the caller skips it."""

from __future__ import annotations

import json

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


# ---------------------------------------------------------------------------------- multi-token prediction
def with_mtp(directory, state: dict, n: int, d: int, vocab: int, *, prefix: str = "model.") -> list[str]:
    """Add to the checkpoint in ``directory`` (``state``, as written) a DeepSeek-V3 multi-token-prediction
    layer past its ``n`` layers, named and shaped as the release's ``model.layers.61.*`` (a decoder layer
    as the last one, enorm, hnorm, eh_proj, shared_head, embed_tokens), in a shard of its own: the folder
    becomes two shards and their index."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    last, new = f"{prefix}layers.{n - 1}.", f"{prefix}layers.{n}."
    mtp = {k.replace(last, new): torch.randn(t.shape, generator=g) for k, t in state.items() if k.startswith(last)}
    mtp |= {new + k: torch.randn(shape, generator=g) for k, shape in [
        ("enorm.weight", (d,)), ("hnorm.weight", (d,)), ("eh_proj.weight", (d, 2 * d)), ("shared_head.norm.weight", (d,)),
        ("shared_head.head.weight", (vocab, d)), ("embed_tokens.weight", (vocab, d))]}
    (directory / "model.safetensors").rename(directory / "model-00001-of-00002.safetensors")
    save_file(mtp, str(directory / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in state} | {k: "model-00002-of-00002.safetensors" for k in mtp}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return sorted(mtp)


@pytest.mark.parametrize("name", [NAME, "DeepseekV3Model"])
def test_a_checkpoint_with_an_mtp_layer_is_refused_by_name_or_converts_without_it_when_asked(name, tmp_path):
    hf = build_reference(name, seed=1)
    c = hf.config
    prefix = "model." if name == NAME else ""
    mtp = with_mtp(tmp_path / "hf", write_checkpoint(hf, tmp_path / "hf"), c.num_hidden_layers, c.hidden_size,
                   c.vocab_size, prefix=prefix)
    assert any(k.endswith(".eh_proj.weight") for k in mtp) and any(".experts.0." in k for k in mtp)
    with pytest.raises(ConversionError, match=rf"multi-token-prediction.*{prefix}layers\.3\..*skip_mtp"):
        convert(tmp_path / "hf", tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()
    done = convert(tmp_path / "hf", tmp_path / "m.safetensors", skip_mtp=True)
    assert sorted(done.ignored) == mtp  # every one left out is listed, and nothing else
    x = tokens(2, 9, seed=1)
    assert max_diff(output(zoo.load(done.path).eval(), x), output(hf, x)) < 1e-4
    back = convert(done.path, tmp_path / "back")
    assert back.reference == name and not any(f"layers.{c.num_hidden_layers}." in k for k in hf_names(tmp_path / "back"))
    assert json.loads((tmp_path / "back" / "config.json").read_text())["num_nextn_predict_layers"] == 0  # none written


@pytest.mark.slow
def test_an_mtp_layer_in_a_pytorch_bin_checkpoint_is_refused_or_skipped(tmp_path):
    """Read whole by from_pretrained, whose report of unexpected tensors leaves the release's layer 61 out:
    the names come from the file itself."""
    hf = build_reference(NAME, seed=1, num_hidden_layers=61, n_routed_experts=3, num_experts_per_tok=1, n_group=1,
                         topk_group=1, first_k_dense_replace=60)
    state = write_checkpoint(hf, tmp_path / "hf")
    mtp = with_mtp(tmp_path / "hf", state, 61, hf.config.hidden_size, hf.config.vocab_size)
    from safetensors.torch import load_file

    merged = {**load_file(str(tmp_path / "hf" / "model-00001-of-00002.safetensors")),
              **load_file(str(tmp_path / "hf" / "model-00002-of-00002.safetensors"))}
    for f in tmp_path.glob("hf/model*"):
        f.unlink()
    torch.save(merged, tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(ConversionError, match=r"multi-token-prediction.*model\.layers\.61\..*skip_mtp"):
        convert(tmp_path / "hf", tmp_path / "m.safetensors")
    done = convert(tmp_path / "hf", tmp_path / "m.safetensors", skip_mtp=True)
    assert sorted(done.ignored) == mtp


def test_the_cli_refuses_an_mtp_layer_and_skips_it_when_asked(tmp_path, capsys):
    from zoo.cli import main

    hf = build_reference(NAME, seed=1)
    mtp = with_mtp(tmp_path / "hf", write_checkpoint(hf, tmp_path / "hf"), 3, hf.config.hidden_size, hf.config.vocab_size)
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "m.safetensors")]) == 2
    assert "--skip-mtp" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "m.safetensors"), "--skip-mtp"]) == 0
    assert f"left out {len(mtp)} tensors" in capsys.readouterr().out


def test_qwen3_next_mtp_tensors_are_named_by_the_converter():
    from zoo.interop.hf import ARCHS

    names = ["model.layers.0.input_layernorm.weight", "mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "lm_head.weight"]
    assert ARCHS["Qwen3NextForCausalLM"].mtp_names(None, names) == names[1:3]
    assert ARCHS["Qwen3NextModel"].mtp_names(None, names) == names[1:3]


@pytest.mark.slow
def test_a_qwen3_next_checkpoint_s_mtp_tensors_are_refused_or_listed_when_skipped(tmp_path):
    """HF's Qwen3-Next drops ``mtp.*`` on loading without a word (its keys to ignore); zoo names them."""
    from safetensors.torch import save_file

    hf = build_reference("Qwen3NextForCausalLM", seed=1)
    state = write_checkpoint(hf, tmp_path / "hf")
    d = hf.config.hidden_size
    mtp = {"mtp.fc.weight": torch.randn(d, 2 * d), "mtp.norm.weight": torch.ones(d), "mtp.pre_fc_norm_hidden.weight": torch.ones(d)}
    save_file({**state, **mtp}, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=r"multi-token-prediction.*mtp\.fc\.weight.*skip_mtp"):
        convert(tmp_path / "hf", tmp_path / "m.safetensors")
    done = convert(tmp_path / "hf", tmp_path / "m.safetensors", skip_mtp=True)
    assert sorted(done.ignored) == sorted(mtp)
