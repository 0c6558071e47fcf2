"""timm's NaFlexVit against zoo's ViT: images of any size and NaFlex patch lists.

Each NaFlexVit is built at small, odd sizes with every parameter random, converted to zoo and back:
logits agree within 1e-4 (fp32) on images at the trained grid and at other, non-square sizes (the
position grid resampled as timm does), with timm's linear patch embedding over (row, column, channel)
or (channel, row, column) patches or its convolution. A NaFlex batch (images of three sizes cut by
timm's ``Patchify`` and padded by its ``NaFlexCollator``) gives timm's logits as a zoo
:class:`PatchBatch`, which also equals each image run alone. What zoo cannot express is refused by
name; bad patch batches fail naming the field. The presets are the timm models they name.
"""

from __future__ import annotations

import pytest
import torch
from conformance_table import build_reference
from conftest import max_diff, randomize

import zoo
from zoo.interop import ConversionError, from_timm, timm_spec, to_timm
from zoo.models.patches import PatchBatch

timm = pytest.importorskip("timm")

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
ENTRIES = ["NaFlexVit", "NaFlexVit:gap"]  # tests/conformance_table.py: map pool + class token; mean pool + fc_norm
SMALL = dict(patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5, pos_embed_grid_size=(4, 4))


def naflex(**kw) -> torch.nn.Module:
    from timm.models.naflexvit import NaFlexVit

    return randomize(NaFlexVit(**{**SMALL, **kw}), seed=1)


def images(*sizes: tuple[int, int], seed: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g) for h, w in sizes]


def logits(model: torch.nn.Module, x) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("name", ENTRIES)
def test_images_of_other_sizes_both_ways(name):
    ref = build_reference(name)
    model = from_timm(ref)
    back = to_timm(model, "NaFlexVit").eval()
    for h, w in ((32, 32), (24, 40), (48, 16)):
        x = torch.stack(images((h, w), (h, w)))
        theirs = logits(ref, x)
        assert max_diff(logits(model, x), theirs) < ATOL and max_diff(logits(back, x), theirs) < ATOL


@pytest.mark.parametrize("kw", [{"embed_proj_type": "conv"}, {"patchify_channels_last": False},
                                {"pre_norm": True, "embed_norm_layer": "layernorm", "global_pool": "token", "class_token": True,
                                 "qk_norm": True}], ids=["conv", "channels first", "pre-norm, patch norm, qk-norm"])
def test_patch_embedding_layouts_convert(kw):
    ref = naflex(**kw)
    model = from_timm(ref)
    x = torch.stack(images((24, 40), (24, 40)))
    assert max_diff(logits(model, x), logits(ref, x)) < ATOL
    if "embed_proj_type" not in kw and "patchify_channels_last" not in kw:  # zoo writes timm's default layout
        assert not [k for k, t in ref.state_dict().items() if not torch.equal(t, to_timm(model, "NaFlexVit").state_dict()[k])]


@pytest.mark.parametrize("name", ENTRIES)
def test_patch_batch_equals_timms_naflex_dict(name):
    from timm.data.naflex_dataset import NaFlexCollator
    from timm.data.naflex_transforms import Patchify

    ref = build_reference(name)
    model = from_timm(ref)
    pics = images((32, 32), (24, 40), (16, 8))
    cut = Patchify(8)
    batch, _ = NaFlexCollator(max_seq_len=20)([(cut(im), 0) for im in pics])
    ours = PatchBatch(batch["patches"], batch["patch_coord"], batch["patch_valid"])
    theirs = logits(ref, batch)
    assert max_diff(logits(model, ours), theirs) < ATOL
    made = PatchBatch.from_images(pics, 8, length=20)
    assert all(torch.equal(getattr(made, f), batch[k]) for f, k in (("patches", "patches"), ("coords", "patch_coord"),
                                                                      ("valid", "patch_valid")))
    alone = torch.cat([logits(model, im[None]) for im in pics])  # each image at its own size
    assert max_diff(alone, theirs) < ATOL
    assert max_diff(logits(to_timm(model, "NaFlexVit").eval(), batch), theirs) < ATOL


@pytest.mark.parametrize("kw,option", [
    ({"pos_embed": "factorized"}, "pos_embed"),
    ({"pos_embed_interp_mode": "bilinear"}, "pos_embed_interp_mode"),
    ({"pos_embed_antialias": False}, "pos_embed_antialias"),
    ({"pos_embed_align_corners": True}, "pos_embed_align_corners"),
    ({"pos_embed_ar_preserving": True}, "pos_embed_ar_preserving"),
    ({"pos_embed_use_grid_sample": True}, "pos_embed_use_grid_sample"),
    ({"pos_embed_grid_size": (4, 5)}, "pos_embed_grid_size"),
    ({"rope_type": "axial", "pos_embed": "none"}, "rope_type"),
    ({"patch_drop_rate": 0.1}, "patch_drop_rate"),
    ({"global_pool": "max"}, "global_pool"),
    ({"global_pool": "avg", "pool_include_prefix": True, "reg_tokens": 1}, "pool_include_prefix"),
    ({"final_norm": False}, "final_norm"),
    ({"drop_rate": 0.1}, "drop_rate"),
    ({"dynamic_img_pad": True}, "dynamic_img_pad"),
    ({"enable_patch_interpolator": True}, "enable_patch_interpolator"),
    ({"swiglu_mlp": True}, "block_fn"),
    ({"drop_path_rate": 0.1}, "drop_path_rate"),
])
def test_what_zoo_lacks_is_refused_by_name(kw, option):
    with pytest.raises(ConversionError, match=rf"timm NaFlexVit -> zoo: (blocks\.\d+: )?{option}="):
        from_timm(naflex(**kw))


def test_zoo_specs_naflexvit_cannot_hold_are_refused_by_name():
    model = from_timm(build_reference("NaFlexVit"))
    with pytest.raises(ConversionError, match=r"NaFlexVit: prefix_positions=True .*patches only"):
        to_timm(zoo.build(model.spec.model_copy(update={"prefix_positions": True}), device="meta"), "NaFlexVit")
    with pytest.raises(ConversionError, match=r"dynamic_size"):
        to_timm(zoo.build(model.spec.model_copy(update={"dynamic_size": False}), device="meta"), "NaFlexVit")


def test_bad_patch_batches_name_the_field():
    model = from_timm(build_reference("NaFlexVit:gap"))
    good = PatchBatch.from_images(images((16, 16), (8, 24)), 8)
    bad = [
        (PatchBatch(good.patches[..., :-1], good.coords, good.valid), r"patches: expected a float tensor \[batch, patches, 192\]"),
        (PatchBatch(good.patches, good.coords.float(), good.valid), r"coords: expected integer"),
        (PatchBatch(good.patches, good.coords[:, :-1], good.valid), r"coords: expected integer .*\[2, 4, 2\]"),
        (PatchBatch(good.patches, good.coords, good.valid.long()), r"valid: expected a bool tensor"),
        (PatchBatch(good.patches, good.coords, torch.zeros_like(good.valid)), r"valid: image 0 has no valid patch"),
        (PatchBatch(good.patches, -good.coords - 1, good.valid), r"coords: a valid patch has a negative row"),
    ]
    for batch, message in bad:
        with pytest.raises(ValueError, match=message):
            model(batch)
    with pytest.raises(ValueError, match=r"images\[1\]: expected a tensor \[C, H, W\] with H and W multiples of patch_size"):
        PatchBatch.from_images(images((16, 16), (8, 20)), 8)
    with pytest.raises(ValueError, match=r"patches: patch lists take positions added to the tokens"):
        zoo.build("eva02-mini", seed=0)(PatchBatch.from_images(images((16, 16)), 8))
    fixed = zoo.build(model.spec.model_copy(update={"dynamic_size": False}), seed=0)
    with pytest.raises(ValueError, match=r"patches: an image's grid \(2, 2\) is not the model's \(4, 4\)"):
        fixed(good)


@pytest.mark.parametrize("overrides", [["position.kind=learned"], ["position.kind=sincos2d"], ["pool=map"], ["position.kind=none"]])
def test_a_patch_batch_equals_each_image_alone(overrides):
    """Any zoo ViT whose positions are added to the tokens (here with a class token that has its own
    position row: prefix_positions) gives each image of a mixed batch what it gives the image alone."""
    spec = zoo.load_spec("vit-tiny-16", ["image_size=32", "patch_size=8", "d_model=48", "n_layers=2", "block.attention.n_heads=3",
                                         "block.ffn.hidden=96", "dynamic_size=true", "reg_tokens=2", *overrides])
    model = randomize(zoo.build(spec, seed=0))
    pics = images((32, 32), (8, 40), (24, 16))
    batch = PatchBatch.from_images(pics, 8, length=22)
    alone = torch.cat([logits(model, im[None]) for im in pics])
    assert max_diff(logits(model, batch), alone) < ATOL


def test_patch_batches_train():
    """A few AdamW steps on patch lists of mixed sizes: the loss falls, and the padding patches' pixels
    get no gradient (they are hidden from every token)."""
    torch.manual_seed(0)
    model = zoo.build("naflexvit-tiny", seed=0).train()
    batch = PatchBatch.from_images([torch.randn(1, 4 * h, 4 * w) for h, w in ((7, 7), (5, 9), (3, 4), (8, 6))], 4)
    patches = batch.patches.clone().requires_grad_()
    labels = torch.tensor([1, 3, 5, 7])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(12):
        loss = torch.nn.functional.cross_entropy(model(PatchBatch(patches, batch.coords, batch.valid)), labels)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            assert patches.grad[~batch.valid].abs().max() == 0 and patches.grad[batch.valid].abs().max() > 0
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_presets_are_the_timm_models_they_name():
    with torch.device("meta"):
        ref = timm.create_model("naflexvit_base_patch16_gap")
    assert timm_spec(ref) == zoo.load_spec("naflexvit-base-16-gap").model_copy(update={"name": None})
    model = zoo.build("naflexvit-base-16-gap", device="meta")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters()) == 86_633_704
    tiny = randomize(zoo.build("naflexvit-tiny", seed=0))
    ours = to_timm(tiny, "NaFlexVit").eval()
    theirs = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, patch_size=4, embed_dim=48, depth=2, num_heads=3,
                               in_chans=1, num_classes=10, pos_embed_grid_size=(7, 7)).eval()
    theirs.load_state_dict(ours.state_dict())  # strict: the same tensors, names and shapes
    x = torch.randn(2, 1, 20, 36, generator=torch.Generator().manual_seed(3))
    assert max_diff(logits(theirs, x), logits(tiny, x)) < ATOL
