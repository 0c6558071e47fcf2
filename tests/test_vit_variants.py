"""ViT variants against timm's VisionTransformer: LayerScale, qk-norm, register tokens, positions on
the patches only (``no_embed_class``), attention pooling (MAP), dynamic image sizes, and the
per-block features of ``forward_intermediates``.

Each timm model is built at small, unusual sizes with every parameter random, converted to zoo and
back, and saved and loaded through zoo's files: logits agree within 1e-4 (fp32), the round trip
returns every tensor bit for bit. Bad specs fail naming the field.
"""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, randomize

import zoo
from zoo.interop import ConversionError, from_timm, timm_spec, to_timm
from zoo.spec import SpecError

timm = pytest.importorskip("timm")
VisionTransformer = pytest.importorskip("timm.models.vision_transformer").VisionTransformer

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
BASE = {"img_size": 40, "patch_size": 8, "embed_dim": 20, "depth": 2, "num_heads": 2, "num_classes": 5}  # 5 x 5 patches, heads of 10


def images(h: int = 40, w: int = 40, batch: int = 2, seed: int = 5) -> torch.Tensor:
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(seed))


VARIANTS = {
    "layer scale, patch-only positions (DeiT III)": {"init_values": 1e-5, "no_embed_class": True},
    "layer scale, avg pool, no biases": {"init_values": 0.1, "global_pool": "avg", "qkv_bias": False, "proj_bias": False},
    "qk-norm": {"qk_norm": True},
    "qk-norm, layer scale, 3 heads, gelu-tanh": {"embed_dim": 24, "num_heads": 3, "qk_norm": True,
                                                 "init_values": 1e-6, "act_layer": "gelu_tanh"},
    "no_embed_class alone": {"no_embed_class": True},
    "3 registers, patch-only positions": {"reg_tokens": 3, "no_embed_class": True},
    "registers with positions, no class token, avg": {"reg_tokens": 2, "class_token": False, "global_pool": "avg"},
    "map, no class token, registers": {"global_pool": "map", "class_token": False, "reg_tokens": 2},
    "map, class token, fc_norm, mlp 3x": {"global_pool": "map", "fc_norm": True, "mlp_ratio": 3.0, "act_layer": "relu"},
    "map, no positions": {"global_pool": "map", "class_token": False, "pos_embed": "none"},
    "dynamic size, registers, patch-only positions": {"dynamic_img_size": True, "reg_tokens": 2,
                                                      "no_embed_class": True, "init_values": 1e-5},
    "dynamic size, class token with a position": {"dynamic_img_size": True},
    "dynamic size, map, no positions": {"dynamic_img_size": True, "pos_embed": "none", "global_pool": "map",
                                        "class_token": False},
    "no head (num_classes=0): pooled features": {"num_classes": 0, "reg_tokens": 1},
    "no head, avg pool, fc_norm": {"num_classes": 0, "global_pool": "avg", "fc_norm": True},
}
OTHER_SIZES = [(56, 24), (16, 32), (64, 64)]  # larger, smaller, non-square: positions resampled both ways


def timm_vit(**kw) -> VisionTransformer:
    return randomize(VisionTransformer(**{**BASE, **kw}))


@pytest.mark.parametrize("kw", VARIANTS.values(), ids=VARIANTS)
def test_variant_converts_both_ways_and_through_files(kw, tmp_path):
    ref = timm_vit(**kw)
    model = from_timm(ref)
    x = images()
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) < ATOL
        sizes = OTHER_SIZES if ref.dynamic_img_size else []
        for h, w in sizes:
            assert max_diff(model(images(h, w)), ref(images(h, w))) < ATOL, (h, w)
        back = to_timm(model).eval()
        assert max_diff(back(x), model(x)) < ATOL
    sa, sb = ref.state_dict(), back.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    zoo.save(model, tmp_path / "vit.safetensors")
    loaded = zoo.load(tmp_path / "vit.safetensors").eval()
    assert loaded.spec == model.spec
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
        for h, w in sizes:
            assert torch.equal(loaded(images(h, w)), model(images(h, w)))


def test_the_spec_says_what_timm_says():
    spec = timm_spec(timm_vit(reg_tokens=2, no_embed_class=True, init_values=1e-5, qk_norm=True, global_pool="map",
                              class_token=False, dynamic_img_size=True))
    assert (spec.reg_tokens, spec.prefix_positions, spec.class_token, spec.dynamic_size) == (2, False, False, True)
    assert spec.block.layer_scale == 1e-5 and spec.pool.kind == "map"
    assert spec.block.attention.qk_norm.model_dump() == {"kind": "layernorm", "scope": "head", "eps": 1e-6, "unit_offset": False, "affine": True}


# ----------------------------------------------------------------------------- intermediate features
FEATURES = {
    "class token": {},
    "registers, patch-only positions, avg": {"reg_tokens": 3, "no_embed_class": True, "global_pool": "avg", "depth": 3},
    "no prefix, map, fc_norm": {"class_token": False, "global_pool": "map", "fc_norm": True},
}


@pytest.mark.parametrize("kw", FEATURES.values(), ids=FEATURES)
@pytest.mark.parametrize("layers", [None, 1, [0, -1]], ids=["all", "last", "first-and-last"])
@pytest.mark.parametrize("norm", [False, True], ids=["raw", "norm"])
def test_features_equal_timm_forward_intermediates(kw, layers, norm):
    ref = timm_vit(**kw)
    model = from_timm(ref)
    x = images()
    with torch.no_grad():
        ours = model.features(x, layers, norm=norm)
        theirs = ref.forward_intermediates(x, layers, norm=norm, intermediates_only=True, return_prefix_tokens=True)
        flat = model.features(x, layers, norm=norm, grid=False)
        theirs_flat = ref.forward_intermediates(x, layers, norm=norm, intermediates_only=True, output_fmt="NLC")
    n = len(ref.blocks)
    assert ours.layers == sorted({i % n for i in ([*range(n)] if layers is None else [n - 1] if layers == 1 else layers)})
    assert ours.grid == (5, 5) and len(ours.patches) == len(theirs) == len(ours.layers)
    if not ref.num_prefix_tokens:  # timm then returns the patch tokens alone
        theirs = [(t, None) for t in theirs]
    for patches, prefix, (t_patches, t_prefix) in zip(ours.patches, ours.prefix, theirs):
        assert patches.shape == t_patches.shape == (2, ref.embed_dim, 5, 5)
        assert max_diff(patches, t_patches) < ATOL
        assert prefix.shape == (2, ref.num_prefix_tokens, ref.embed_dim)
        if t_prefix is not None:
            assert max_diff(prefix, t_prefix) < ATOL
    for a, b in zip(flat.patches, theirs_flat):
        assert a.shape == (2, 25, ref.embed_dim) and max_diff(a, b) < ATOL


def test_features_at_another_size_and_bad_layers():
    ref = timm_vit(dynamic_img_size=True, reg_tokens=1)
    model = from_timm(ref)
    x = images(24, 48)
    with torch.no_grad():
        ours = model.features(x, [1])
        (theirs, prefix), = ref.forward_intermediates(x, [1], intermediates_only=True, return_prefix_tokens=True)
    assert ours.grid == (3, 6) and max_diff(ours.patches[0], theirs) < ATOL and max_diff(ours.prefix[0], prefix) < ATOL
    for bad, message in ((3, "the last 3 blocks of 2"), ([2], "2 is no block index of 2 blocks"), ([], "no block chosen")):
        with pytest.raises(ValueError, match=message):
            model.features(x, bad)


# ----------------------------------------------------------------------------- inputs and specs
TINY = ["d_model=24", "n_layers=1", "block.attention.n_heads=3", "block.ffn.hidden=32", "image_size=32", "patch_size=8",
        "head.num_classes=5"]


def test_other_sizes_need_dynamic_size():
    fixed = zoo.build("vit-tiny-16", TINY, seed=0)
    with pytest.raises(ValueError, match=r"got \(1, 3, 48, 48\).* or set dynamic_size: true"):
        fixed(torch.randn(1, 3, 48, 48))
    dynamic = zoo.build("vit-tiny-16", [*TINY, "dynamic_size=true"], seed=0)
    assert dynamic(torch.randn(1, 3, 48, 16)).shape == (1, 5)
    with pytest.raises(ValueError, match=r"multiples of patch_size \(8\), got 30 x 32"):
        dynamic(torch.randn(1, 3, 30, 32))


def test_sincos2d_is_recomputed_for_the_grid():
    """A sincos2d model at another size computes what a model built for that size computes."""
    opts = ["position.kind=sincos2d", "reg_tokens=2", "dynamic_size=true"]
    model = zoo.build("vit-tiny-16", [*TINY, *opts], seed=0).eval()
    other = zoo.build("vit-tiny-16", [*TINY, *opts, "image_size=48"], seed=1).eval()
    other.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), other(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["class_token=false"], r"pool: cls needs class_token: true; set class_token: true or pool: mean \(or map\)"),
        (["pool={kind: map, n_heads: 5}"], r"pool.n_heads: the pooling attention splits d_model \(24\) into 5 heads"),
        (["prefix_positions=false", "position.kind=none"], "prefix_positions: false leaves .* position.kind none adds no table"),
        (["reg_tokens=-1"], "reg_tokens: Input should be greater than or equal to 0"),
        (["pool=max"], r"pool: unknown pool kind 'max'; did you mean 'map'\? \(known: cls, eos, last, map, mean\)"),
        (["block.layer_scale=0"], "block.layer_scale: .* must be a positive number"),
    ],
)
def test_bad_vit_specs_name_the_field(overrides, message):
    with pytest.raises(SpecError, match=message):
        zoo.load_spec("vit-tiny-16", TINY + overrides)


def test_dynamic_size_needs_positions_it_can_fit():
    from typing import ClassVar, Literal

    from zoo.components.position import _learned
    from zoo.registry import REGISTRIES
    from zoo.spec import PositionSpec

    class FixedSpec(PositionSpec):  # a table over the patch grid that cannot be resized
        kind: Literal["fixed_grid"] = "fixed_grid"
        layouts: ClassVar[frozenset[str]] = frozenset({"grid"})

    registry = REGISTRIES["position"]
    saved = dict(registry._specs), dict(registry._builders)
    try:
        zoo.register("position", "fixed_grid", spec=FixedSpec)(_learned)
        assert zoo.build("vit-tiny-16", [*TINY, "position.kind=fixed_grid"], device="meta")
        with pytest.raises(SpecError, match="dynamic_size: positions of kind 'fixed_grid' cannot be fitted to another grid; "
                                            "use position.kind learned, none, rope2d, rope2d_mixed, sincos2d, or set dynamic_size: false"):
            zoo.load_spec("vit-tiny-16", [*TINY, "position.kind=fixed_grid", "dynamic_size=true"])
    finally:
        for current, old in zip((registry._specs, registry._builders), saved):
            current.clear(), current.update(old)


def test_pool_shorthand_and_mapping_are_one_spec():
    a = zoo.load_spec("vit-tiny-16", [*TINY, "pool=mean"])
    b = zoo.load_spec("vit-tiny-16", [*TINY, "pool.kind=mean"])
    assert a == b and a.pool.kind == "mean" and a.model_dump()["pool"] == {"kind": "mean"}
    assert zoo.parse_spec(a.model_dump(mode="json")) == a


# ----------------------------------------------------------------------------- what does not convert
FROM_REFUSED = {
    "max pooling": ({"global_pool": "max"}, "global_pool='max'"),
    "prefix tokens in the pool": ({"global_pool": "avg", "pool_include_prefix": True}, "pool_include_prefix=True"),
    "padded patches": ({"dynamic_img_size": True, "dynamic_img_pad": True}, "dynamic_img_pad=True"),
    "attention output norm": ({"scale_attn_norm": True}, "scale_attn_norm"),
}


@pytest.mark.parametrize("case", FROM_REFUSED)
def test_timm_options_zoo_lacks_are_refused(case):
    kw, message = FROM_REFUSED[case]
    with pytest.raises(ConversionError, match=message):
        from_timm(VisionTransformer(**{**BASE, **kw}))


def test_a_changed_map_pool_is_refused():
    ref = VisionTransformer(**BASE, global_pool="map")
    ref.attn_pool.latent_len = 2
    with pytest.raises(ConversionError, match="attn_pool.latent_len=2"):
        from_timm(ref)


TO_REFUSED = {
    "rmsnorm qk-norm": (["block.attention.qk_norm.kind=rmsnorm"], "block.attention.qk_norm=QKNormSpec"),
    "qk-norm over the whole projection": (["block.attention.qk_norm.scope=all"], "qk-norm is a LayerNorm over each head"),
    "qk-norm eps": (["block.attention.qk_norm.eps=1e-5"], r"with the blocks' eps \(1e-06\)"),
    "map with its own heads": (["pool={kind: map, n_heads: 2}"], "pool.n_heads=2"),
    "map without biases": (["pool={kind: map, bias: false}"], "pool.bias=False"),
    "post-norm layer scale": (["block.kind=post", "block.layer_scale=0.1"], "block.kind='post'"),
}


@pytest.mark.parametrize("case", TO_REFUSED)
def test_zoo_options_timm_lacks_are_refused(case):
    overrides, message = TO_REFUSED[case]
    with pytest.raises(ConversionError, match=message):
        to_timm(zoo.build("vit-tiny-16", TINY + overrides, device="meta"))
