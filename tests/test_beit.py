"""BEiT against timm's Beit: the 2-D relative position bias of each layer's own (zoo's
``relative_bias2d``, :mod:`zoo.components.relbias2d`), layer scale, q and v biases without a k bias,
patch-mean pooling through fc_norm or the class token.

The bias's table lookup is checked against timm's own index; each timm model is built at small, odd
sizes with every parameter random, converted to zoo and back and through zoo's files: logits agree
within 1e-4 (fp32), the round trip returns every tensor bit for bit. The preset is timm's
beit_base_patch16_224, spec and parameter count; what zoo cannot express is refused by name.
"""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, randomize

import zoo
from zoo.components.relbias2d import GridRelativeBias
from zoo.components.rope2d import grid_positions
from zoo.interop import ConversionError, from_timm, timm_spec, to_timm
from zoo.spec import SpecError

timm = pytest.importorskip("timm")
beit = pytest.importorskip("timm.models.beit")

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
SMALL = dict(img_size=(24, 24), patch_size=8, embed_dim=30, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=4)  # 3 x 3, heads of 10
BEIT = "beit_base_patch16_224"

VARIANTS = {
    "beit: relative bias, layer scale, avg + fc_norm": {},
    "beit with absolute positions too, token pool": {"use_abs_pos_emb": True, "global_pool": "token"},
    "no qkv bias, no layer scale, backbone": {"qkv_bias": False, "init_values": None, "num_classes": 0},
    "swiglu with its norm, absolute positions only": {"swiglu_mlp": True, "scale_mlp": True, "use_rel_pos_bias": False,
                                                      "use_abs_pos_emb": True},
}


def images(batch: int = 2, seed: int = 5) -> torch.Tensor:
    return torch.randn(batch, 3, 24, 24, generator=torch.Generator().manual_seed(seed))


def timm_beit(**kw) -> torch.nn.Module:
    return randomize(timm.create_model(BEIT, pretrained=False, **{**SMALL, **kw}))


@pytest.mark.parametrize("grid", [(3, 3), (2, 5)])
def test_bias_is_timms_table_lookup(grid):
    """zoo's lookup equals timm's ``_get_rel_pos_bias`` (its index and table) on a square and a
    non-square grid, class token first."""
    attn = beit.Attention(12, num_heads=3, window_size=grid)
    torch.nn.init.normal_(attn.relative_position_bias_table)
    ours = GridRelativeBias(3, grid)
    ours.weight.data.copy_(attn.relative_position_bias_table)
    places = grid_positions(grid, 1)
    assert torch.equal(ours.bias(3, places, places), attn._get_rel_pos_bias())
    assert ours.bias(3, torch.arange(len(places)), torch.arange(len(places))) is None  # no grid: the ViT asks again


@pytest.mark.parametrize("kw", VARIANTS.values(), ids=VARIANTS)
def test_beit_converts_both_ways_and_through_files(kw, tmp_path):
    ref = timm_beit(**kw).eval()
    model = from_timm(ref).eval()
    back = to_timm(model, "Beit").eval()  # without the relative bias, Eva (tried first) expresses it too
    x = images()
    with torch.no_grad():
        want = ref(x)
        assert max_diff(model(x), want) < ATOL and max_diff(back(x), want) < ATOL
    sa, sb = ref.state_dict(), back.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    zoo.save(model, tmp_path / "beit.safetensors")
    loaded = zoo.load(tmp_path / "beit.safetensors").eval()
    with torch.no_grad():
        assert loaded.spec == model.spec and torch.equal(loaded(x), model(x))


def test_the_spec_says_what_timm_says():
    s = timm_spec(timm_beit(use_abs_pos_emb=True))
    att, (layer, *_) = s.block.attention, s.stack_layers()
    assert (att.bias, att.key_bias, s.position.kind, layer.position.kind, s.pool.kind, s.fc_norm) == (
        True, False, "learned", "relative_bias2d", "mean", True)
    assert s.block.layer_scale == 0.1


def test_preset_is_timms_beit_base():
    with torch.device("meta"):
        ref = timm.create_model(BEIT)
    assert timm_spec(ref) == zoo.load_spec("beit-base-16").model_copy(update={"name": None})
    model = zoo.build("beit-base-16", device="meta")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())


def test_what_zoo_lacks_is_refused_by_name():
    with pytest.raises(ConversionError, match="use_shared_rel_pos_bias"):
        from_timm(timm.create_model(BEIT, pretrained=False, **SMALL, use_rel_pos_bias=False, use_shared_rel_pos_bias=True))
    with pytest.raises(SpecError, match="dynamic_size"):
        zoo.load_spec("beit-base-16", ["dynamic_size=true"])
    model = zoo.build("beit-base-16", ["image_size=32", "patch_size=8", "d_model=24", "n_layers=1", "block.attention.n_heads=3",
                                       "block.ffn.hidden=48"], seed=0)
    with pytest.raises(ValueError, match="relative_bias2d: the table is sized for the 4 x 4 patch grid"):
        model.stack.positions[0].bias(3, grid_positions((5, 4), 1), grid_positions((5, 4), 1))
    with pytest.raises(ConversionError, match="zoo -> timm Beit: .*reg_tokens"):
        to_timm(zoo.build("beit-base-16", ["image_size=32", "patch_size=8", "d_model=24", "n_layers=1",
                                           "block.attention.n_heads=3", "block.ffn.hidden=48", "reg_tokens=2"], seed=0))
