"""Spec files and bad input: every rule fails with a message naming the field and the fix."""

from __future__ import annotations

import json

import pytest

import zoo
from zoo.spec import SpecError, apply_overrides, load_spec, to_yaml


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["d_model=770"], r"block.attention.n_heads: d_model \(770\) must be divisible by n_heads \(12\); choose n_heads from"),
        (["block.attention.kind=gqa", "block.attention.n_kv_heads=5"],
         r"block.attention: n_heads \(12\) must be divisible by n_kv_heads \(5\); choose n_kv_heads from \[1, 2, 3, 4, 6, 12\]"),
        (["block.attention.kind=gqa"], "kind gqa needs n_kv_heads"),
        (["block.attention.n_kv_heads=4"], "kind mha has n_kv_heads == n_heads .*use kind: gqa"),
        (["block.attention.kind=mqa", "block.attention.n_kv_heads=2"], "kind mqa has one key/value head.*use kind: gqa"),
        (["position.kind=rope", "block.attention.head_dim=63"], "position.kind: rope rotates pairs .* must be even, got 63"),
        (["position.kind=sincos2d"], "position.kind: 'sincos2d' does not apply to family decoder; use one of"),
        (["d_model=0"], "d_model: Input should be greater than 0"),
        (["n_layers=-2"], "n_layers: Input should be greater than 0"),
        (["block.ffn.hidden=0"], "block.ffn.hidden: Input should be greater than 0"),
        (["dropout.residual=1.0"], "dropout.residual: Input should be less than 1"),
        (["dropout.attention=-0.1"], "dropout.attention: Input should be greater than or equal to 0"),
        (["block.ffn.kind=swigluu"], r"block.ffn: unknown ffn kind 'swigluu'; did you mean 'swiglu'\? \(known: geglu, gelu, moe, quick_gelu, relu, relu2, silu, swiglu\)"),
        (["position.kind=rotary"], "position: unknown position kind 'rotary'.*known: alibi, learned, none, relative_bias, relative_bias2d, relative_embedding, rope"),
        (["block.norm.kind=rms_norm"], "did you mean 'rmsnorm'"),
        (["block.kind=middle"], r"block: unknown block kind 'middle' \(known: parallel, post, post_sublayer, pre"),
        (["block.shared_norm=true"], "block.shared_norm: unknown key"),
        (["block.attention.window=0"], r"block.attention.window: a sliding window covers at least the token itself, so window >= 1, got 0"),
        (["layers=[{at: 12, block: {attention: {window: 4}}}]"], r"layers.0.at: layer 12 is not among the 12 layers \(0 to 11"),
        (["layers=[{at: '1:2:0'}]"], "layers.0.at: '1:2:0': a slice step cannot be zero"),
        (["layers=[{at: '20:'}]"], "layers.0.at: '20:' selects no layer of 12"),
        (["layers=[{at: 'every 2'}]"], "layers.0.at: .*'every 2' is no slice; write start:stop:step"),
        (["layers=[{at: []}]"], "layers.0.at: .*an empty list selects no layer"),
        (["layers=[{at: 0, block: {ffn: {hidden: 0}}}]"], "layers.0.block.ffn.hidden: Input should be greater than 0"),
        (["layers=[{at: 0, block: {attention: {n_head: 4}}}]"], "layers.0.block.attention.n_head: unknown key"),
        (["layers=[{at: 0, block: {attention: {n_heads: 7}}}]"], r"layers.0.block.attention.n_heads: d_model \(768\) must be divisible by n_heads \(7\)"),
        (["layers=[{at: 0, block: {kind: postt}}]"], "layers.0.block.kind: unknown block kind 'postt'; did you mean 'post'"),
        (["layers=[{at: 0, position: {kind: learned}}]"], "layers.0.position: 'learned' is added to the embeddings once, not per layer"),
        (["layers=[{at: 0, stack: decoder}]"], "layers.0.stack: decoder has the stacks stack, not 'decoder'"),
        (["layers=[{at: -1, block: {kind: post}}]"], "layers: the last layer's block kind .* disagree on the final norm"),
        (["position.kind=rope", "layers=[{at: 0, block: {attention: {head_dim: 63, v_head_dim: 63}}}]"],
         "position.kind: rope rotates pairs of dimensions, so the query/key head size must be even, got 63"),
        (["position.kind=rope", "position.fraction=0.3"], r"position.fraction: .* int\(64 \* 0.3\) = 19"),
        (["position.kind=rope", "position.fraction=0"], "position.fraction: Input should be greater than 0"),
        (["embedding.round_scale=true"], r"embedding: round_scale: rounds the sqrt\(d_model\) scale, so it needs scale: true"),
        (["vocab_sizee=10"], "vocab_sizee: unknown key .* remove it or check its spelling"),
        (["block.attention.n_head=4"], "block.attention.n_head: unknown key"),
        (["block.ffn={hidden: 3}"], "block.ffn: missing 'kind'"),
        (["block.ffn=3"], "block.ffn: expected a mapping such as"),
        (["family=gpt"], "family: unknown family kind 'gpt'"),
        (["d_model=abc"], "d_model: Input should be a valid integer"),
        (["block.layer_scale=0"], r"block.layer_scale: .* must be a positive number, got 0.0; use a small value such as 1e-5"),
        (["block.layer_scale=-1e-5"], "block.layer_scale: .* or null for no layer scale"),
        (["block.residual_scale=0"], r"block.residual_scale: .* a positive finite number, got 0.0; use e.g. 0.22"),
        (["block.attention.scale=-0.1"], r"block.attention.scale: .* a positive finite number, got -0.1"),
        (["block.attention.scale=0.1", "block.attention.scale_dim=64"],
         r"block.attention: scale \(0.1\) and scale_dim \(64\) both set the scores' factor; give one of them"),
        (["embedding.multiplier=0"], r"embedding.multiplier: .* a positive finite number, got 0.0; use e.g. 12.0"),
        (["head.scale=0"], r"head.scale: scale is the logits' factor, a positive finite number, got 0.0"),
        (["head.divisor=-16"], r"head.divisor: .* got -16.0; use e.g. 16.0 \(Granite's logits_scaling\)"),
        (["position.kind=rope", "position.pairs=odd"], "position.pairs: Input should be 'half' or 'interleaved'"),
        (["block.attention.qk_norm={scope: heads}"], "block.attention.qk_norm.scope: Input should be 'head' or 'all'"),
        (["block.attention.qk_norm={kind: batchnorm}"], "block.attention.qk_norm.kind: Input should be 'layernorm' or 'rmsnorm'"),
        (["block.attention.qk_norm.eps=0"], "block.attention.qk_norm.eps: Input should be greater than 0"),
    ],
)
def test_rules_name_the_field_and_fix(overrides, message):
    with pytest.raises(SpecError, match=message):
        load_spec("gpt2-small", overrides)


@pytest.mark.parametrize(
    "preset,overrides,message",
    [
        ("vit-tiny-16", ["patch_size=15"], r"image_size \(224\) must be divisible by patch_size \(15\)"),
        ("vit-tiny-16", ["position.kind=rope"], "position.kind: 'rope' does not apply to family vit; use one of learned, none, relative_bias2d, rope2d, rope2d_mixed, sincos2d"),
        ("vit-tiny-16", ["position.kind=sincos2d", "d_model=198", "block.attention.n_heads=3"], "sincos2d .* d_model \\(198\\) must be divisible by 4"),
        ("vit-tiny-16", ["class_token=false"], "pool: cls needs class_token: true"),
        ("vit-tiny-16", ["stem.channels=[24, 48]", "stem.strides=[2]"], "stem.strides: one stride per conv layer, got 1 strides for 2"),
        ("vit-tiny-16", ["stem.channels=[24, 48]", "stem.strides=[4, 8]"], r"stem.strides: their product \(32\) must divide patch_size \(16\)"),
        ("vit-tiny-16", ["stem.channels=[]"], "stem.channels"),
        ("gpt2-small", ["block.cross_attention={kind: mha, n_heads: 4}"], "block.cross_attention: family decoder has no cross-attention"),
        ("gpt2-small", ["init.scheme=xavier"], "init.scaled_residual: applies to scheme normal or trunc_normal"),
        ("vit-tiny-16", ["position.padding_idx=1"], "position.padding_idx: fairseq's padding-aware positions are for token sequences"),
        ("transformer-base", ["block.kind=parallel", "block.shared_norm=false"],
         "block.kind: a parallel block has no cross-attention, which family encoder_decoder's decoder needs"),
        ("transformer-base", ["layers=[{at: 0, stack: decoder, block: {attention: {window: 2}}}]"],
         "layers.0.block.attention.window: sliding-window attention is self-attention of a decoder or an encoder, which "
         "family encoder_decoder"),
        ("vit-tiny-16", ["layers=[{at: 0, position: {kind: rope}}]"],
         "layers.0.position: 'rope' does not apply to family vit; a layer's own position is one of none, relative_bias2d, rope2d, rope2d_mixed"),
        ("vit-tiny-16", ["layers=[{at: 1, position: {kind: alibi}}]"], "layers.0.position: 'alibi' does not apply to family vit"),
        ("gpt2-small", ["position.kind=rope", "layers=[{at: 0, position: {kind: rope2d}}]"],
         "layers.0.position: 'rope2d' does not apply to family decoder; a layer's own position is one of alibi, none, "),
        ("gpt2-small", ["init.std=.inf"], r"init.std: must be a finite number, got inf; write a number \(not .inf or .nan\)"),
        ("gpt2-small", ["dropout.attention=.nan"], "dropout.attention: must be a finite number, got nan"),
        ("llama-tiny", ["position.scaling={kind: linear, factor: .inf}"], "position.scaling.factor: must be a finite number, got inf"),
        ("transformer-base", ["src_vocab_size=100"], r"share_embeddings: .* src_vocab_size \(100\) != vocab_size \(37000\)"),
        ("gpt2-small", ["embedding.dim=128"], r"head.tied: the lm head projects d_model \(768\) wide states, but the "
         r"embedding is embedding.dim \(128\) wide; set head.tied: false"),
        ("bert-mini", ["embedding.dim=64", "head.transform=false"], r"head.tied: the mlm head projects d_model"),
        ("transformer-base", ["embedding.dim=64"], "embedding.dim: factorised embeddings are a one-stack family's"),
        ("transformer-base", ["shared_layers=1"], "shared_layers: unknown key"),
        ("gpt2-small", ["shared_layers=12"], r"shared_layers: 12 blocks for 12 layers shares nothing; choose fewer than n_layers"),
        ("llama-tiny", ["shared_layers=2", "layers=[{at: 1, block: {attention: {window: 4}}}]"],
         r"layers: layer 1 differs from layer 0, whose weights it shares \(shared_layers: 2\)"),
    ],
)
def test_family_rules(preset, overrides, message):
    with pytest.raises(SpecError, match=message):
        load_spec(preset, overrides)


def test_all_problems_are_listed_together():
    with pytest.raises(SpecError) as err:
        load_spec("gpt2-small", ["dropout.residual=2", "foo=1", "block.ffn.hidden=-1"])
    text = str(err.value)
    assert "(3 problems)" in text and "dropout.residual" in text and "foo" in text and "block.ffn.hidden" in text
    assert "preset 'gpt2-small'" in text


def test_unknown_preset_and_missing_file_suggest(tmp_path):
    with pytest.raises(SpecError, match="unknown preset 'gpt2-smal'; did you mean 'gpt2-small'"):
        load_spec("gpt2-smal")
    with pytest.raises(SpecError, match="no spec file at"):
        load_spec(str(tmp_path / "nope.yaml"))


def test_yaml_files(tmp_path):
    good = tmp_path / "m.yaml"
    good.write_text("family: decoder\nd_model: 64\nblock:\n  attention: {kind: mqa, n_heads: 4}\n")
    spec = load_spec(good)
    assert spec.block.attention.n_kv_heads == 1 and spec.d_model == 64
    dup = tmp_path / "dup.yaml"
    dup.write_text("family: decoder\nd_model: 64\nd_model: 128\n")
    with pytest.raises(SpecError, match="duplicate key 'd_model'"):
        load_spec(dup)
    broken = tmp_path / "broken.yaml"
    broken.write_text("family: decoder\nblock: {attention: [\n")
    with pytest.raises(SpecError, match="cannot parse file .*broken.yaml.* as YAML"):
        load_spec(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="must hold a mapping"):
        load_spec(listed)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("family: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(SpecError, match="cannot parse"):
        load_spec(unsafe)
    no_family = tmp_path / "nofam.yaml"
    no_family.write_text("d_model: 64\n")
    with pytest.raises(SpecError, match="missing 'family'"):
        load_spec(no_family)


def test_overrides_parse_yaml_values_and_changing_kind_drops_foreign_keys():
    spec = load_spec(
        "gpt2-small",
        ["block.attention.kind=gqa", "block.attention.n_kv_heads=4", "position.kind=rope", "block.ffn.kind=swiglu",
         "block.norm.eps=1e-6", "head.tied=false"],
    )
    assert spec.block.attention.kind == "gqa" and spec.block.attention.n_kv_heads == 4
    assert spec.position.kind == "rope" and spec.block.ffn.kind == "swiglu"
    assert spec.block.ffn.hidden == 3072 and spec.block.ffn.bias is True  # kept: swiglu knows them
    assert spec.block.norm.eps == 1e-6 and spec.head.tied is False
    data = apply_overrides({"family": "encoder_decoder", "position": {"kind": "sinusoidal", "layout": "concat"}},
                           ["position.kind=rope"])
    assert data["position"] == {"kind": "rope"}
    for bad in ["d_model", "=3", "a..b=1"]:
        with pytest.raises(SpecError, match="override"):
            load_spec("gpt2-small", [bad])
    with pytest.raises(SpecError, match="d_model is 768, not a mapping"):
        load_spec("gpt2-small", ["d_model.x=1"])


def test_specs_are_immutable_and_round_trip():
    spec = load_spec("transformer-base")
    with pytest.raises(Exception):
        spec.d_model = 3
    for name in zoo.preset_names():
        spec = load_spec(name)
        assert load_spec(zoo.spec.read_yaml(to_yaml(spec), "dump")) == spec
        assert zoo.parse_spec(json.loads(spec.model_dump_json())) == spec


def test_derived_sizes_are_properties_not_rewrites():
    spec = load_spec("transformer-base", ["block.attention.head_dim=16"])
    att = spec.block.attention
    assert att.head_dim == 16 and att.v_head_dim is None
    assert att.qk_size(512) == 16 and att.v_size(512) == 64
    swiglu = load_spec("llama-small", ["block.ffn.hidden=null"]).block.ffn
    assert swiglu.hidden is None and swiglu.hidden_size(768) == 2048


def test_json_schema_lists_every_kind():
    schema = zoo.json_schema()
    text = json.dumps(schema)
    for part in ("attention", "position", "ffn", "norm", "family"):
        for kind in zoo.registry(part).names():
            assert f'"const": "{kind}"' in text or f'"{kind}"' in text, (part, kind)
    assert schema["title"] == "zoo model spec"


@pytest.mark.parametrize("source", [42, None, ["gpt2-small"], 2.5, b"gpt2-small"])
def test_a_source_of_the_wrong_type_says_what_a_spec_comes_from(source):
    what = "a preset name, a YAML file path, a mapping or a FamilySpec"
    with pytest.raises(SpecError, match=f"a spec comes from {what}, not {type(source).__name__} "):
        load_spec(source)
    with pytest.raises(SpecError, match=f"a spec comes from {what}"):
        zoo.build(source, device="meta")


def test_a_path_object_is_a_source(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(to_yaml(load_spec("gpt2-small", ["n_layers=2"])))
    assert load_spec(path).n_layers == 2 and zoo.build(path, device="meta").spec.n_layers == 2
