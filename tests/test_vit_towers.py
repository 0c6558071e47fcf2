"""Vision towers people download, against timm: CLIP towers (timm's VisionTransformer with ``pre_norm``,
no patch bias, GELU or quick GELU) and EVA-02 (timm's Eva: 2-D RoPE on the patch grid, q and v
biases without a k bias, SwiGLU packed or split, the norm inside the MLP).

Each timm model is built at small, odd sizes with every parameter random, converted to zoo and back,
and saved and loaded through zoo's files: outputs agree within 1e-4 (fp32), the round trip returns
every tensor bit for bit (timm's split q, k, v projections come back fused: zoo writes timm's
default layout). The tiny presets convert to the timm models they name; bad specs fail naming the field.
"""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, randomize

import zoo
from zoo.interop import ConversionError, from_timm, timm_spec, to_timm
from zoo.spec import SpecError

timm = pytest.importorskip("timm")

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
SMALL = dict(embed_dim=48, depth=2, num_heads=3, img_size=32, patch_size=8)  # a 4 x 4 grid, heads of 16
CLIP, EVA, AIMV2 = "vit_base_patch16_clip_224", "eva02_tiny_patch14_224", "aimv2_large_patch14_224"
DINOV3 = "vit_small_patch16_dinov3"
MIXED, MIXED_APE = "vit_small_patch16_rope_mixed_224", "vit_small_patch16_rope_mixed_ape_224"

TOWERS = {  # (timm model, its arguments besides SMALL)
    "clip, head": (CLIP, {"num_classes": 5}),
    "clip quick gelu, backbone, dynamic size": (CLIP, {"num_classes": 0, "act_layer": "quick_gelu", "dynamic_img_size": True}),
    "eva02, backbone": (EVA, {}),
    "eva02, head, token pool, layer scale, dynamic size": (EVA, {"num_classes": 5, "global_pool": "token", "init_values": 0.1,
                                                                 "dynamic_img_size": True}),
    "eva02 base-like: split qkv, SwiGLU with its norm": (EVA, {"qkv_fused": False, "scale_mlp": True}),
    "eva: rope only, registers, gelu mlp with its norm, no qkv bias": (EVA, {"use_abs_pos_emb": False, "num_reg_tokens": 2,
                                                                            "swiglu_mlp": False, "scale_mlp": True, "qkv_bias": False}),
    "eva, pre-norm, no rope": (EVA, {"use_pre_transformer_norm": True, "use_rot_pos_emb": False, "num_classes": 3}),
    "aimv2: RmsNorm in the patch embedding and blocks, SwiGLU, no biases": (AIMV2, {"embed_dim": 30, "num_classes": 4}),
    "aimv2 with biases, token pool, layer scale": (AIMV2, {"class_token": True, "global_pool": "token", "qkv_bias": True,
                                                           "proj_bias": True, "init_values": 0.1, "embed_dim": 30}),
    "dinov3: centered rope2d turning halves, registers, layer scale, dynamic size": (DINOV3, {"num_classes": 4}),
    "dinov3 qkvb, token pool": ("vit_small_patch16_dinov3_qkvb", {"global_pool": "token"}),
    "dinov3 s+: split SwiGLU": ("vit_small_plus_patch16_dinov3", {}),
    "eva02 turning halves (rope_rotate_half)": (EVA, {"rope_rotate_half": True}),
    "rope-mixed: learned frequencies per layer and head, AttentionRope, dynamic size": (MIXED, {"num_classes": 4,
                                                                                              "dynamic_img_size": True}),
    "rope-mixed ape, split q, k, v with their biases, ij indexing": (MIXED_APE, {"qkv_fused": False,
                                                                                 "rope_grid_indexing": "ij"}),
    "eva02 with AttentionRope's grouped-query attention": (EVA, {"attn_type": "rope", "qkv_fused": False, "num_heads": 4,
                                                                 "num_kv_heads": 2}),
}


def images(h: int = 32, w: int = 32, batch: int = 2, seed: int = 5) -> torch.Tensor:
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(seed))


def timm_tower(name: str, **kw) -> torch.nn.Module:
    return randomize(timm.create_model(name, pretrained=False, **{**SMALL, **kw}))


@pytest.mark.parametrize("name,kw", TOWERS.values(), ids=TOWERS)
def test_tower_converts_both_ways_and_through_files(name, kw, tmp_path):
    ref = timm_tower(name, **kw)
    model = from_timm(ref).eval()
    x, sizes = images(), [(48, 24)] if ref.dynamic_img_size else []
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) < ATOL
        for h, w in sizes:
            assert max_diff(model(images(h, w)), ref(images(h, w))) < ATOL
        back = to_timm(model).eval()
        assert type(back) is type(ref) and max_diff(back(x), model(x)) < ATOL
    sa, sb = ref.state_dict(), back.state_dict()
    if kw.get("qkv_fused") is False and "num_kv_heads" not in kw:  # written fused: [q | k | v] rows (GQA: split)
        for i in range(len(ref.blocks)):
            q, k, v = (sa.pop(f"blocks.{i}.attn.{n}_proj.weight") for n in "qkv")
            sa[f"blocks.{i}.attn.qkv.weight"] = torch.cat([q, k, v])
            if f"blocks.{i}.attn.k_proj.bias" in sa:  # AttentionRope's (attn_type='rope'): q, k and v biases
                sa[f"blocks.{i}.attn.qkv.bias"] = torch.cat([sa.pop(f"blocks.{i}.attn.{n}_proj.bias") for n in "qkv"])
            else:
                sa[f"blocks.{i}.attn.q_bias"], sa[f"blocks.{i}.attn.v_bias"] = (sa.pop(f"blocks.{i}.attn.{n}_proj.bias") for n in "qv")
    if type(ref.blocks[0].mlp) is not type(back.blocks[0].mlp):  # Eva's split SwiGLU, written packed: [gate | up]
        for i in range(len(ref.blocks)):
            for p in ("weight", "bias"):
                sa[f"blocks.{i}.mlp.fc1.{p}"] = torch.cat([sa.pop(f"blocks.{i}.mlp.fc1_g.{p}"), sa.pop(f"blocks.{i}.mlp.fc1_x.{p}")])
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    zoo.save(model, tmp_path / "tower.safetensors")
    loaded = zoo.load(tmp_path / "tower.safetensors").eval()
    assert loaded.spec == model.spec
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_the_specs_say_what_timm_says():
    clip = timm_spec(timm_tower(CLIP, act_layer="quick_gelu", num_classes=0))
    assert (clip.pre_norm, clip.patch_bias, clip.block.ffn.kind, clip.head.kind, clip.pool.kind) == (True, False, "quick_gelu", "none", "cls")
    eva = timm_spec(timm_tower(EVA))
    att, (layer, *_) = eva.block.attention, eva.stack_layers()
    assert (att.bias, att.key_bias, eva.block.ffn.kind, eva.pool.kind, eva.fc_norm, eva.position.kind) == (True, False, "swiglu", "mean", True, "learned")
    assert layer.position.model_dump() == {"kind": "rope2d", "base": 10000.0, "ref_grid": 16, "coords": "index", "pairs": "interleaved"}
    dino = timm_spec(timm_tower(DINOV3))
    assert dino.position.model_dump() == {"kind": "rope2d", "base": 100.0, "ref_grid": None, "coords": "centered", "pairs": "half"}
    assert (dino.reg_tokens, dino.block.layer_scale, dino.block.attention.bias, dino.dynamic_size) == (4, 1e-5, False, True)


FEATURES = {"clip": (CLIP, {}), "eva02 with registers": (EVA, {"num_reg_tokens": 1})}


@pytest.mark.parametrize("name,kw", FEATURES.values(), ids=FEATURES)
def test_features_equal_forward_intermediates(name, kw):
    ref = timm_tower(name, **kw)
    model = from_timm(ref)
    x = images()
    with torch.no_grad():
        ours = model.features(x, [0, -1], norm=True)
        theirs = ref.forward_intermediates(x, [0, 1], norm=True, intermediates_only=True, return_prefix_tokens=True)
    for patches, prefix, (t_patches, t_prefix) in zip(ours.patches, ours.prefix, theirs, strict=True):
        assert patches.shape == t_patches.shape == (2, 48, 4, 4)
        assert max_diff(patches, t_patches) < ATOL and max_diff(prefix, t_prefix) < ATOL


TINY_PRESETS = {"vit-clip-tiny": ("vit_base_patch16_clip_quickgelu_224", {"num_classes": 0}), "eva02-mini": (EVA, {})}


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_presets_are_the_timm_models_they_name(preset):
    name, kw = TINY_PRESETS[preset]
    model = randomize(zoo.build(preset, seed=0))
    ours = to_timm(model).eval()
    theirs = timm.create_model(name, pretrained=False, **SMALL, **kw).eval()
    theirs.load_state_dict(ours.state_dict())  # strict: the same tensors, names and shapes
    with torch.no_grad():
        assert max_diff(theirs(images()), model(images())) < ATOL


def test_aimv2_preset_is_timms_aimv2_large():
    with torch.device("meta"):
        ref = timm.create_model(AIMV2)
    assert timm_spec(ref) == zoo.load_spec("aimv2-large-14").model_copy(update={"name": None})
    model = zoo.build("aimv2-large-14", device="meta")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    with pytest.raises(ConversionError, match="block.norm.kind='rmsnorm' is not supported"):
        zoo.interop.files.timm_model_args(model.spec)
    with pytest.raises(ConversionError, match="global_pool"):
        from_timm(timm.create_model(AIMV2, pretrained=False, **SMALL, global_pool="map"))


def test_dinov3_preset_is_timms_vit_small_dinov3():
    with torch.device("meta"):
        ref = timm.create_model(DINOV3)
    assert timm_spec(ref) == zoo.load_spec("vit-small-16-dinov3").model_copy(update={"name": None})
    model = zoo.build("vit-small-16-dinov3", device="meta")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    with pytest.raises(SpecError, match="ref_grid: centered coordinates"):
        zoo.load_spec("vit-small-16-dinov3", ["position.ref_grid=16"])
    with pytest.raises(ConversionError, match="rope_grid_offset"):
        from_timm(timm.create_model(DINOV3, pretrained=False, **SMALL, rope_grid_offset=0.5))
    with pytest.raises(ConversionError, match="rope_type"):
        from_timm(timm.create_model(DINOV3, pretrained=False, **SMALL, rope_type="mrope"))


def test_rope_mixed_preset_is_timms_vit_base_rope_mixed():
    with torch.device("meta"):
        ref = timm.create_model("vit_base_patch16_rope_mixed_224")
        ape = timm.create_model("vit_base_patch16_rope_mixed_ape_224")
    assert timm_spec(ref) == zoo.load_spec("vit-base-16-rope-mixed").model_copy(update={"name": None})
    model = zoo.build("vit-base-16-rope-mixed", device="meta")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    with_ape = zoo.load_spec("vit-base-16-rope-mixed", ["position.kind=learned", "prefix_positions=false",
                                                       'layers=[{at: "0:", position: {kind: rope2d_mixed}}]'])
    assert timm_spec(ape) == with_ape.model_copy(update={"name": None})
    with pytest.raises(ConversionError, match="rope_shift/jitter/rescale_coords"):
        from_timm(timm.create_model(MIXED, pretrained=False, **SMALL, rope_shift_coords=0.5))
    with pytest.raises(ConversionError, match="num_kv_heads"):
        from_timm(timm.create_model(MIXED, pretrained=False, **SMALL, qkv_fused=False, num_kv_heads=1))
    gqa = zoo.build("vit-base-16-rope-mixed", ["n_layers=1", "block.attention.kind=gqa", "block.attention.n_kv_heads=4"],
                    device="meta")
    refused = r"position.kind='rope2d_mixed' is not supported: .* n_kv_heads \(4\) must equal n_heads"
    with pytest.raises(ConversionError, match=refused):
        to_timm(gqa, "Eva")


def test_bad_specs_and_refusals_name_the_field():
    with pytest.raises(SpecError, match=r"position.kind: rope2d .* divisible by 4, got 10"):
        zoo.build("eva02-mini", ["d_model=40", "block.attention.n_heads=4", "position.kind=rope2d", "layers=[]"])
    with pytest.raises(SpecError, match=r"key_bias: false .* bias is false"):
        zoo.load_spec("eva02-mini", ["block.attention.bias=false"])
    model = zoo.build("eva02-mini", seed=0)
    with pytest.raises(ConversionError, match=r"key_bias=False .* timm's VisionTransformer"):
        to_timm(model, "VisionTransformer")
    clip = zoo.build("vit-clip-tiny", ["patch_bias=true"], seed=0)
    with pytest.raises(ConversionError, match=r"patch_bias=True .*\(pre_norm is True\)"):
        to_timm(clip)
    with pytest.raises(ConversionError, match="rope_grid_indexing"):
        from_timm(timm.create_model(EVA, pretrained=False, **SMALL, rope_grid_indexing="xy"))


def test_the_registry_picks_the_first_class_and_lists_each_ones_reason():
    """to_timm writes the first class of ``ARCHS`` that expresses a spec: the plain ViT a
    VisionTransformer (which Eva, with its key bias, does not express), EVA-02 an Eva; a spec no
    class expresses is refused with every class's reason, a model of another class by name."""
    from zoo.interop.timm import ARCHS, timm_architecture

    assert timm_architecture(zoo.load_spec("vit-tiny-16")) == "VisionTransformer"
    assert timm_architecture(zoo.load_spec("eva02-mini")) == "Eva"
    with pytest.raises(ConversionError) as refused:
        to_timm(zoo.build("vit-tiny-16", ["position.kind=sincos2d"], device="meta"))
    reasons = str(refused.value).splitlines()
    assert reasons[0].startswith("to_timm: no timm class expresses this vit")
    assert [r.split(":")[0].strip() for r in reasons[1:]] == [f"zoo -> timm {name}" for name in ARCHS]
    assert all("position.kind='sincos2d'" in r for r in reasons[1:])
    with pytest.raises(ConversionError, match="unknown architecture 'ConvNeXt'; choose from VisionTransformer, Eva, Beit"):
        to_timm(zoo.build("vit-tiny-16", device="meta"), "ConvNeXt")
    from timm.models.deit import VisionTransformerDistilled

    with pytest.raises(ConversionError, match="VisionTransformerDistilled does not convert; supported: timm's VisionTransformer, Eva, Beit"):
        from_timm(VisionTransformerDistilled(**SMALL))
