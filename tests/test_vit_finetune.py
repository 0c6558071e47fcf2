"""Fine-tuning a ViT in the image recipe: layer-wise lr decay (optim.layer_decay), a linear probe
(train.probe), and init= from a timm-converted ViT at a new image size against training from scratch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import zoo
from zoo.data import images
from zoo.train import OptimConfig, TrainError, build_optimizer, build_scheduler, param_groups, read_metrics
from zoo.train.config import ScheduleConfig

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "imagenet.py"
HAVE_FMNIST = all((images.FASHION_MNIST_DIR / f).is_file() for f in images._FILES.values())
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="dataset-fashion-mnist is not installed")
VIT = ["image_size=32", "patch_size=8", "d_model=32", "n_layers=2", "block.attention.n_heads=2", "block.ffn.hidden=40",
       "head.num_classes=10"]
# a plain patch-7 ViT (timm expresses it; the default recipe model's conv stem it does not)
SMALL_VIT = "[patch_size=7,d_model=64,n_layers=2,block.attention.n_heads=2,block.ffn.hidden=128]"


def _recipe():
    spec = importlib.util.spec_from_file_location("imagenet_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the config's annotations through it
    spec.loader.exec_module(module)
    return module


def _lrs(model, optimizer) -> dict[str, float]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["lr"] for g in optimizer.param_groups for p in g["params"]}


# ---------------------------------------------------------------------------- layer decay
def test_layer_decay_lrs_of_a_vit_by_hand():
    model = zoo.build("vit-tiny-16", VIT, seed=0)
    opt = build_optimizer(model, OptimConfig(lr=1e-3, layer_decay=0.5))
    lrs = _lrs(model, opt)
    assert set(lrs) == {n for n, _ in model.named_parameters()}
    for name, lr in lrs.items():  # 2 blocks: embeddings 0.5^3, block 0 0.5^2, block 1 0.5, final norm and head 1
        if name.startswith(("cls_token", "patch_embed.", "position.")):
            want = 1e-3 * 0.125
        elif name.startswith("stack.blocks.0."):
            want = 1e-3 * 0.25
        elif name.startswith("stack.blocks.1."):
            want = 1e-3 * 0.5
        else:
            assert name.startswith(("stack.norm.", "head.")), name
            want = 1e-3
        assert lr == pytest.approx(want, rel=1e-12), name
    params = dict(model.named_parameters())
    decay = {n for g in opt.param_groups if g["weight_decay"] for n, p in params.items()
             if any(p is q for q in g["params"])}
    assert decay == {n for n, p in params.items() if p.ndim >= 2 and n not in ("cls_token", "position.weight")}
    sched = build_scheduler(opt, ScheduleConfig(warmup=4), 10)  # the schedule scales every layer alike
    opt.step()
    sched.step()
    assert _lrs(model, opt)["stack.blocks.0.attn.qkv.weight"] == pytest.approx(0.25 * 1e-3 * 2 / 4)
    assert _lrs(model, opt)["head.weight"] == pytest.approx(1e-3 * 2 / 4)


def test_layer_decay_agrees_with_timm_but_for_the_final_norm():
    """timm's param_groups_layer_decay on the same ViT converted (each tensor found by its values):
    the same scale and weight decay for every parameter, except that timm gives the final norm the
    last block's lr where BEiT (and zoo) give it the head's."""
    timm_optim = pytest.importorskip("timm.optim")
    from zoo.interop.timm import to_timm

    model = zoo.build("vit-tiny-16", VIT, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # distinct values: each tensor has one twin in the timm model
    ref = to_timm(model)
    theirs = {}
    for g in timm_optim.param_groups_layer_decay(ref, 0.05, layer_decay=0.5,
                                                 no_weight_decay_list=ref.no_weight_decay()):
        theirs.update({id(p): (g["lr_scale"], g["weight_decay"]) for p in g["params"]})
    twins = {n: [q for q in ref.parameters() if q.numel() == p.numel() and torch.equal(q.reshape(p.shape), p)]
             for n, p in model.named_parameters()}
    ours = {}
    for g in param_groups(model, 0.05, layer_decay=0.5):
        ours.update({id(p): (g["lr_scale"], g["weight_decay"]) for p in g["params"]})
    for name, p in model.named_parameters():
        assert len(twins[name]) == 1, name
        scale, decay = theirs[id(twins[name][0])]
        if name.startswith("stack.norm."):
            scale = 1.0
        assert ours[id(p)] == (pytest.approx(scale), decay), name


def test_layer_decay_lrs_of_a_decoder_by_hand():
    model = zoo.build("llama-tiny", ["d_model=32", "n_layers=3", "block.attention.n_heads=2",
                                     "block.attention.n_kv_heads=1", "block.ffn.hidden=40", "vocab_size=50"], seed=0)
    lrs = _lrs(model, build_optimizer(model, OptimConfig(lr=1.0, layer_decay=0.8)))
    for name, lr in lrs.items():  # 3 blocks: the embedding 0.8^4, block i 0.8^(3 - i), the final norm 1
        if name.startswith("stack.blocks."):
            want = 0.8 ** (3 - int(name.split(".")[2]))
        else:
            want = {"tok_emb.weight": 0.8 ** 4, "stack.norm.weight": 1.0}[name]
        assert lr == pytest.approx(want, rel=1e-12), name


def test_without_layer_decay_two_groups_as_before():
    model = zoo.build("vit-tiny-16", VIT, seed=0)
    groups = param_groups(model, 0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0] and all("lr_scale" not in g for g in groups)
    with pytest.raises(ValueError, match="layer_decay"):
        OptimConfig(layer_decay=1.5)


def test_layer_decay_on_a_model_without_blocks_names_the_setting():
    with pytest.raises(ValueError, match=r"optim\.layer_decay: Linear has no stack"):
        build_optimizer(torch.nn.Linear(3, 4), OptimConfig(layer_decay=0.7))


# ---------------------------------------------------------------------------- probe
def test_probe_freezes_all_but_the_head_and_the_optimizer_holds_the_head_alone():
    model = zoo.build("vit-tiny-16", VIT, seed=0)
    n = _recipe().freeze_all_but_head(model)
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {"head.weight", "head.bias"} and n == 32 * 10 + 10
    opt = build_optimizer(model, OptimConfig(layer_decay=0.5))
    assert set(_lrs(model, opt)) == trained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == trained


def test_probe_without_a_head_is_refused():
    model = zoo.build("vit-tiny-16", [*VIT, "head=none"], seed=0)
    with pytest.raises(TrainError, match=r"train\.probe: the model has no head"):
        _recipe().freeze_all_but_head(model)


# ---------------------------------------------------------------------------- init= runs
def _rgb_timm_dir(zoo_file: Path, out: Path) -> Path:
    """The recipe's gray model as an RGB one (its patch weights spread over three channels, so a gray
    image summed back gives the same), written as a timm directory by ``zoo convert``'s code."""
    from zoo.interop.files import convert

    gray = zoo.load(zoo_file)
    rgb = zoo.build(zoo.load_spec(gray.spec, ["in_channels=3"]))
    state = gray.state_dict()
    state["patch_embed.proj.weight"] = state["patch_embed.proj.weight"].repeat(1, 3, 1, 1) / 3
    rgb.load_state_dict(state)
    zoo.save(rgb, out / "rgb.safetensors")
    convert(out / "rgb.safetensors", out / "timm")
    return out / "timm"


@pytest.mark.recipe
@needs_fmnist
def test_finetune_from_a_timm_vit_at_a_new_image_size_beats_scratch(tmp_path):
    recipe = _recipe()
    # run.threads=1: two threads on a busy 2-core machine ran 40x slower
    common = ["data.train_limit=4096", "data.valid_limit=500", "data.batch_size=64", "run.ema=null", "run.plot=false",
              "run.log_every=100", "schedule.warmup=5", "run.threads=1"]
    pre = recipe.main([f"run.out_dir={tmp_path / 'pre'}", "model=vit-tiny-16", f"model_overrides={SMALL_VIT}",
                       "train.max_steps=300", *common])
    timm_dir = _rgb_timm_dir(tmp_path / "pre" / "model.safetensors", tmp_path)
    assert (timm_dir / "config.json").is_file()

    tune = ["data.image_size=42", "train.max_steps=40", "optim.layer_decay=0.75", *common]
    ft = recipe.main([f"run.out_dir={tmp_path / 'ft'}", f"init={timm_dir}", *tune])
    scratch = recipe.main([f"run.out_dir={tmp_path / 'scratch'}", "model=vit-tiny-16", f"model_overrides={SMALL_VIT}",
                           *tune])
    init = ft["init"]
    assert set(init["resized"]) == {"position.weight", "patch_embed.proj.weight"} and init["dropped"] == []
    assert ft["parameters"] == scratch["parameters"] and ft["steps"] == scratch["steps"] == 40
    # seeds 0-2: pretrained 73-75% at 28 px; at 42 px after 40 steps fine-tuned 60-65%, from scratch 32-34%
    assert ft["top1"] > scratch["top1"] + 15, (pre["top1"], ft["top1"], scratch["top1"])

    probe = recipe.main([f"run.out_dir={tmp_path / 'probe'}", f"init={timm_dir}", "train.probe=true",
                         "data.image_size=42", "train.max_steps=40", *common])  # seeds 0-2: 43-51%
    assert probe["trained_parameters"] == 64 * 10 + 10 and probe["top1"] > scratch["top1"]


@pytest.mark.torchrun
@needs_fmnist
def test_probe_and_layer_decay_under_torchrun_keep_the_backbone(tmp_path):
    """Two processes (gloo, DDP): frozen parameters have no gradient to reduce; the exported backbone
    is the init file's, bit for bit, its head trained; a layer-decayed fine-tune runs alike."""
    from safetensors.torch import load_file

    from conftest import launch

    model = zoo.build("vit-tiny-16", ["image_size=28", "patch_size=7", "in_channels=1", "d_model=32", "n_layers=2",
                                      "block.attention.n_heads=2", "block.ffn.hidden=48", "head.num_classes=10"], seed=1)
    zoo.save(model, tmp_path / "init.safetensors")
    common = [f"init={tmp_path / 'init.safetensors'}", "data.train_limit=512", "data.valid_limit=200",
              "data.batch_size=64", "train.max_steps=4", "run.plot=false", "run.log_every=2", "optim.layer_decay=0.7"]
    launch(RECIPE, [f"run.out_dir={tmp_path / 'probe'}", "train.probe=true", *common], 2)
    before = load_file(str(tmp_path / "init.safetensors"))
    after = load_file(str(tmp_path / "probe" / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"head.weight", "head.bias"}
    launch(RECIPE, [f"run.out_dir={tmp_path / 'tune'}", *common], 2)
    tuned = load_file(str(tmp_path / "tune" / "model.safetensors"))
    assert not torch.equal(tuned["patch_embed.proj.weight"], before["patch_embed.proj.weight"])


@needs_fmnist
def test_init_whose_patches_do_not_tile_the_images_names_data_image_size(tmp_path, capsys):
    zoo.save(zoo.build("vit-tiny-16", VIT, seed=0), tmp_path / "p8.safetensors")  # 8-px patches; Fashion-MNIST is 28 px
    with pytest.raises(SystemExit):
        _recipe().main([f"run.out_dir={tmp_path / 'run'}", f"init={tmp_path / 'p8.safetensors'}"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.image_size: 28-px images are not tiled by the 8-px patches" in err
    assert "multiple of 8 (the model's own: 32)" in err


@pytest.mark.recipe
@needs_fmnist
def test_probe_resumes_exactly_from_a_checkpoint(tmp_path):
    """A probe's checkpoint holds the head's optimizer state alone; resumed from its middle, the run
    ends with the weights of the one that never stopped."""
    from safetensors.torch import load_file

    zoo.save(zoo.build("vit-tiny-16", ["image_size=28", "patch_size=7", "in_channels=1", "d_model=32", "n_layers=1",
                                       "block.attention.n_heads=2", "block.ffn.hidden=48"], seed=1), tmp_path / "i.safetensors")
    common = [f"init={tmp_path / 'i.safetensors'}", "train.probe=true", "optim.layer_decay=0.5",
              "data.train_limit=512", "data.valid_limit=100", "data.batch_size=64", "train.max_steps=8", "run.checkpoint_every=4",
              "run.plot=false", "run.threads=1", "run.log_every=2"]
    recipe = _recipe()
    recipe.main([f"run.out_dir={tmp_path / 'full'}", *common])
    before = load_file(str(tmp_path / "i.safetensors"))
    recipe.main([f"run.out_dir={tmp_path / 'cut'}", *common, "--resume", str(tmp_path / "full" / "ckpt-0000004.pt")])
    steps = [r["step"] for r in read_metrics(tmp_path / "cut" / "metrics.jsonl") if r["split"] == "train"]
    assert steps and min(steps) > 4  # it went on from step 4
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("full", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["head.weight"], before["head.weight"])
    ea, eb = (load_file(str(tmp_path / d / "model-ema.safetensors")) for d in ("full", "cut"))
    assert all(torch.equal(ea[k], eb[k]) for k in ea)


@pytest.mark.recipe
@needs_fmnist
def test_lora_trains_adapters_and_the_head_and_exports_both_models_merged(tmp_path, capsys):
    from safetensors.torch import load_file

    zoo.save(zoo.build("vit-tiny-16", ["image_size=28", "patch_size=7", "in_channels=1", "d_model=32", "n_layers=1",
                                       "block.attention.n_heads=2", "block.ffn.hidden=48"], seed=1), tmp_path / "i.safetensors")
    common = [f"init={tmp_path / 'i.safetensors'}", "data.train_limit=256", "data.valid_limit=100", "data.batch_size=64",
              "train.max_steps=4", "run.plot=false", "run.threads=1", "run.log_every=2"]
    recipe = _recipe()
    recipe.main([f"run.out_dir={tmp_path / 'run'}", *common, "finetune.lora={rank: 2, targets: [q, v]}"])
    assert "(+ head in full)" in capsys.readouterr().out
    for name in ("adapters.safetensors", "adapters-ema.safetensors"):
        assert (tmp_path / "run" / name).is_file()
    before, after = load_file(str(tmp_path / "i.safetensors")), load_file(str(tmp_path / "run" / "model.safetensors"))
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"stack.blocks.0.attn.qkv.weight", "head.weight", "head.bias"}, changed
    with pytest.raises(SystemExit):
        recipe.main([f"run.out_dir={tmp_path / 'both'}", *common, "train.probe=true", "finetune.lora={rank: 2}"])
    assert "train.probe and finetune.lora" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder", "vit"])
def test_layer_decay_covers_every_family(family):
    """Every parameter in one group; block i of a stack (both of an encoder-decoder's) at decay^(n - i)."""
    from conftest import tiny_model
    from zoo.train.optim import layer_ids

    model = tiny_model(family)
    groups = param_groups(model, 0.05, layer_decay=0.5)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    assert len(scale) == len(list(model.parameters()))
    ids, n = layer_ids(model)
    assert n == 2 and set(ids.values()) <= set(range(n + 2)) and 0 in ids.values()
    for name, p in model.named_parameters():
        block = name.split("blocks.")[1].split(".")[0] if "blocks." in name else None
        if block is not None:
            assert scale[id(p)] == 0.5 ** (n - int(block)), name
