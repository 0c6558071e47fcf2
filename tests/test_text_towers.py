"""Text towers people embed with: CLIP's (causal, pooled at the end-of-text token, projected without a
bias) and SigLIP's (pooled at the last slot, projected with a bias), against HF at random init.

The pools against hand computation (the end-of-text slot, the row's highest id, the real tokens'
mean, the refusals of a padding token), the causal encoder against the invariant that no token sees
a later one, ``zoo.embed(..., pooling="pooler")`` against HF's ``text_embeds`` and ``pooler_output``
padded or not, the spec rules' messages, the presets of the releases (counted against HF's classes
on the meta device, written back to the same configs) and the tiny preset converting with the same
pooled output. The conformance suite (tests/test_conformance.py) runs the four classes too.
"""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, positions, randomize

import zoo
from zoo.components.pool import EosPool, LastPool, MeanPool
from zoo.interop import from_hf, hf_config, hf_spec, to_hf
from zoo.spec import SpecError, parse_spec

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("aten_linears")
ATOL = 1e-4
V = 61
TOWER = dict(vocab_size=V, hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
             max_position_embeddings=16, bos_token_id=None)


# ------------------------------------------------------------------------------------------ the pools
def test_eos_pool_takes_the_first_end_of_text_slot_or_the_highest_id():
    x = torch.randn(3, 5, 4)
    ids = torch.tensor([[5, 9, 2, 9, 1], [9, 3, 3, 3, 3], [4, 4, 4, 4, 4]])
    by_id = EosPool(9)(x, 0, tokens=ids)
    assert torch.equal(by_id, torch.stack([x[0, 1], x[1, 0], x[2, 0]]))  # no 9 in row 2: its first slot, as HF
    highest = EosPool(None)(x, 0, tokens=ids)
    assert torch.equal(highest, torch.stack([x[0, 1], x[1, 0], x[2, 0]]))
    with pytest.raises(ValueError, match="pool: eos finds the end-of-text token in the token ids"):
        EosPool(9)(x, 0)


def test_pools_refuse_a_padding_token_and_mean_leaves_padding_out():
    x = torch.randn(2, 4, 3)
    right = torch.tensor([[True, True, False, False], [True, True, True, True]])
    with pytest.raises(ValueError, match="padding_mask: pool last would pool a padding token in row 0"):
        LastPool()(x, 0, padding_mask=right)
    assert torch.equal(LastPool()(x, 0, padding_mask=right.flip(1)), x[:, -1])
    ids = torch.tensor([[3, 7, 7, 7], [3, 4, 5, 7]])  # padded with the end-of-text id, on the left
    with pytest.raises(ValueError, match="pool eos would pool a padding token in row 0"):
        EosPool(7)(x, 0, tokens=ids.flip(1), padding_mask=right.flip(1))
    mean = MeanPool()(x, 0, padding_mask=right)
    assert torch.allclose(mean, torch.stack([x[0, :2].mean(0), x[1].mean(0)]))


# ------------------------------------------------------------------------------------ the encoder
def _tower(**kw) -> torch.nn.Module:
    spec = {"family": "encoder", "vocab_size": V, "max_seq_len": 16, "d_model": 24, "n_layers": 2, "head": "none",
            "block": {"kind": "pre", "attention": {"kind": "mha", "n_heads": 3}, "ffn": {"kind": "quick_gelu", "hidden": 40}},
            "position": {"kind": "learned"}, **kw}
    return zoo.build(spec, seed=0).eval()


def test_causal_encoder_never_sees_later_tokens():
    model = _tower(causal=True)
    x = torch.randint(3, V, (2, 9), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:, 6:] = 5
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[:, :6], b[:, :6]) and not torch.equal(a[:, 6:], b[:, 6:])
    bidirectional = _tower()
    with torch.no_grad():
        assert not torch.equal(bidirectional(x)[:, :6], bidirectional(y)[:, :6])


def test_pool_and_projection_flops_and_parameters():
    model = _tower(causal=True, pool={"kind": "eos", "token": 7}, projection={"dim": 10, "bias": False})
    assert model.projection.weight.shape == (10, 24) and model.projection.bias is None
    plain = _tower(causal=True, pool={"kind": "eos", "token": 7})
    assert model.flops(9) - plain.flops(9) == 2 * 24 * 10
    x = torch.randint(3, V, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert model.pool(x).shape == (2, 10)


@pytest.mark.parametrize("fields,message", [
    ({"pool": "eos", "pooler": True}, "pool: BERT's pooler (pooler: true) and pool: eos both make model.pool's output"),
    ({"projection": {"dim": 8}}, "projection: maps the pooled vector, but the encoder has none"),
    ({"pool": "map"}, "pool: map would read padding tokens as real ones"),
    ({"pool": {"kind": "eos", "token": V}}, f"pool.token: {V} is no id of the vocabulary"),
])
def test_spec_rules_name_the_field(fields, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec({"family": "encoder", "vocab_size": V, "head": "none", **fields})


def test_a_vit_refuses_the_eos_pool():
    with pytest.raises(SpecError, match="pool: eos reads token ids, which a vit has none of"):
        parse_spec({"family": "vit", "pool": "eos"})


# ------------------------------------------------------------------------------------------ vs HF
def _reference(name: str, config: str, **kw) -> torch.nn.Module:
    return randomize(getattr(transformers, name)(getattr(transformers, config)(**{**TOWER, **kw})))


@pytest.mark.reference
@pytest.mark.parametrize("name,config,kw", [
    ("CLIPTextModelWithProjection", "CLIPTextConfig", dict(eos_token_id=2, projection_dim=20)),  # legacy: highest id
    ("CLIPTextModel", "CLIPTextConfig", dict(eos_token_id=9, hidden_act="gelu")),
    ("SiglipTextModel", "SiglipTextConfig", dict(projection_size=20)),
    ("Siglip2TextModel", "Siglip2TextConfig", dict()),
])
def test_embed_gives_hf_pooled_output_padded_or_not(name, config, kw):
    ref = _reference(name, config, **kw)
    model = from_hf(ref).eval()
    x = torch.randint(3, V, (3, 11), generator=torch.Generator().manual_seed(2))
    m = torch.ones(3, 11, dtype=torch.bool)
    m[1, 8:], m[2, 3:] = False, False
    for mask in (None, m.flip(1), m):
        xp = x if mask is None else x.masked_fill(~mask, 1)
        if model.spec.pool.kind == "eos" and model.spec.pool.token is not None:  # the end-of-text at each row's end
            real = torch.ones_like(m) if mask is None else mask
            xp = xp.clone()
            xp[torch.arange(3), (torch.arange(11) * real).argmax(1)] = 9
        kw = {} if mask is None else {"attention_mask": mask.long(), "position_ids": positions(mask)}
        with torch.no_grad():
            out = ref(input_ids=xp, **kw)
            theirs = out.text_embeds if hasattr(out, "text_embeds") else out.pooler_output
            if model.spec.pool.kind == "last" and mask is not None and not mask[:, -1].all():
                with pytest.raises(ValueError, match="padding_mask: pool last"):
                    zoo.embed(model, xp, mask, pooling="pooler")
                continue
            ours = zoo.embed(model, xp, mask, pooling="pooler")
            normalized = zoo.embed(model, xp, mask, pooling="pooler", normalize=True)
        assert theirs.abs().max() > 0.1 and max_diff(ours, theirs) < ATOL
        assert max_diff(normalized, torch.nn.functional.normalize(theirs, dim=-1)) < ATOL


def test_embed_pooler_refuses_a_model_without_a_pooled_output():
    with pytest.raises(ValueError, match="pool: this encoder has no pooled output"):
        zoo.embed(_tower(), torch.tensor([[3, 4]]), pooling="pooler")
    decoder = zoo.build("llama-tiny", ["head=none", "n_layers=1"], seed=0)
    with pytest.raises(ValueError, match="pooling: pooler: a decoder model has no pooled output"):
        zoo.embed(decoder, torch.tensor([[3, 4]]), pooling="pooler")


@pytest.mark.reference
def test_clip_refuses_what_its_config_cannot_say():
    from zoo.interop import ConversionError

    model = _tower(causal=True, pool={"kind": "eos", "token": 2}, block={"kind": "pre", "attention": {"kind": "mha", "n_heads": 3},
                                                                           "ffn": {"kind": "quick_gelu", "hidden": 40}})
    with pytest.raises(ConversionError, match="pool.token=2"):
        hf_config(model.spec, "CLIPTextModel")
    model = _tower(causal=True, pool={"kind": "eos", "token": 7})
    with pytest.raises(ConversionError, match="eos_token_id"):
        hf_config(model.spec, "CLIPTextModel", eos_token_id=8)
    with pytest.raises(ConversionError, match="causal"):
        hf_config(_tower(pool="last", projection={"dim": 8, "bias": True}).spec.model_copy(update={"causal": True}),
                  "SiglipTextModel")


# ------------------------------------------------------------------------------------------ presets
RELEASES = {  # the released text_config's architecture fields, as HF config arguments
    "clip-vit-base-patch32-text": ("CLIPTextModelWithProjection", "CLIPTextConfig", 63_428_096, {  # openai/clip-vit-base-patch32
        "vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
        "projection_dim": 512, "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": 0,
        "eos_token_id": 2, "pad_token_id": 1, "architectures": ["CLIPTextModelWithProjection"]}),
    "siglip-base-patch16-224-text": ("SiglipTextModel", "SiglipTextConfig", 110_271_744, {  # google/siglip-base-patch16-224
        "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6, "projection_size": 768, "attention_dropout": 0.0}),
}


@pytest.mark.reference
@pytest.mark.parametrize("name", RELEASES)
def test_release_presets_are_the_hf_configs(name):
    architecture, config_class, count, fields = RELEASES[name]
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        ref = getattr(transformers, architecture)(config)
    model = zoo.build(name, device="meta")
    assert zoo.count_parameters(model) == sum(p.numel() for p in ref.parameters()) == count
    assert model.spec.model_dump(exclude={"name"}) == hf_spec(config).model_dump(exclude={"name"})
    ids = {k: getattr(config, k) for k in ("bos_token_id", "pad_token_id", "eos_token_id")}  # what the spec does not say
    back = hf_config(model.spec, architecture, **ids)
    assert all(back.to_dict()[k] == v for k, v in config.to_dict().items() if k not in ("architectures", "transformers_version"))


@pytest.mark.reference
def test_tiny_preset_converts_with_the_same_pooled_output():
    release, tiny = zoo.load_spec("clip-vit-base-patch32-text"), zoo.load_spec("clip-text-tiny")
    sizes = {"name", "vocab_size", "d_model", "n_layers", "block", "projection"}
    assert tiny.model_dump(exclude=sizes) == release.model_dump(exclude=sizes)
    model = randomize(zoo.build("clip-text-tiny", seed=0))
    hf = to_hf(model).eval()
    assert type(hf).__name__ == "CLIPTextModelWithProjection"
    x = torch.randint(3, model.spec.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert max_diff(model.pool(x), hf(input_ids=x).text_embeds) < ATOL


@pytest.mark.reference
def test_zoo_convert_records_the_pooled_output_for_zoo_embed(tmp_path):
    from zoo.embed import stored_settings
    from zoo.interop.files import convert
    from zoo.io import read_header

    ref = _reference("CLIPTextModelWithProjection", "CLIPTextConfig", eos_token_id=2, projection_dim=20)
    ref.save_pretrained(tmp_path / "hf")
    done = convert(tmp_path / "hf", tmp_path / "clip.safetensors")
    settings = stored_settings(read_header(done.path).metadata)
    assert done.reference == "CLIPTextModelWithProjection" and settings.pooling == "pooler"
    model = zoo.load(done.path).eval()
    x = torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert max_diff(zoo.embed(model, x, pooling=settings.pooling), ref(input_ids=x).text_embeds) < ATOL
