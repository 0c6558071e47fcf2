"""The ViT recipe (recipes/imagenet.py): tiny runs alone and under torchrun (gloo), an image folder
with a corrupt file, exact resume after SIGKILL, and the embedded dataset's loader."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from zoo.data import images
from zoo.train import read_metrics
from conftest import child_env, launch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "imagenet.py"
HAVE_FMNIST = all((images.FASHION_MNIST_DIR / f).is_file() for f in images._FILES.values())
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="dataset-fashion-mnist is not installed")
TINY = ["model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=2,block.ffn.hidden=64]", "schedule.warmup=2",
        "run.plot=false"]


def _recipe():
    spec = importlib.util.spec_from_file_location("imagenet_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the config's annotations through it
    spec.loader.exec_module(module)
    return module


def _run(args: list[str], *, torchrun: int = 1) -> subprocess.CompletedProcess:
    return launch(RECIPE, args, torchrun)


def _train_records(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "images_per_s"} for r in read_metrics(out / "metrics.jsonl")]


# ---------------------------------------------------------------------------------- data
def test_missing_dataset_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(images, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(images.DatasetMissing, match=r"apt-get install dataset-fashion-mnist"):
        images.load_fashion_mnist(cache_dir=tmp_path / "cache")
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as e:
        _recipe().main([f"run.out_dir={tmp_path / 'run'}"])
    assert e.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "apt-get install dataset-fashion-mnist" in err


@needs_fmnist
def test_fashion_mnist_is_cached_as_tensors(tmp_path):
    data = images.load_fashion_mnist(cache_dir=tmp_path)
    assert data["train_x"].shape == (60000, 1, 28, 28) and data["train_x"].dtype == torch.uint8
    assert data["test_x"].shape == (10000, 1, 28, 28) and set(data["test_y"].tolist()) == set(range(10))
    assert (tmp_path / "fashion-mnist-v1.pt").is_file()
    again = images.load_fashion_mnist(root=tmp_path / "gone", cache_dir=tmp_path)  # from the cache alone
    assert torch.equal(again["train_y"], data["train_y"])


def test_augment_batch_is_reproducible():
    x = torch.randint(0, 256, (16, 1, 28, 28), dtype=torch.uint8)
    a = images.augment_batch(x, generator=torch.Generator().manual_seed(3), padding=2)
    b = images.augment_batch(x, generator=torch.Generator().manual_seed(3), padding=2)
    assert torch.equal(a, b) and a.shape == x.shape and not torch.equal(a, x)
    same = images.augment_batch(x, generator=torch.Generator().manual_seed(3), padding=0, flip=False)
    assert torch.equal(same, x)


# ---------------------------------------------------------------------------------- runs
@pytest.mark.recipe
@needs_fmnist
def test_single_process_run(tmp_path):
    out = tmp_path / "run"
    res = _recipe().main([f"run.out_dir={out}", "data.train_limit=1024", "data.valid_limit=500", "data.batch_size=64",
                          "train.max_steps=12", "run.log_every=4", "run.eval_every=6", "run.plot=true", *TINY[:2]])
    assert res["steps"] == 12 and res["valid_images"] == 500 and res["world_size"] == 1
    assert 0 <= res["top1"] <= res["top5"] <= 100 and res["reloaded_top1"] == res["top1"]
    assert res["ema_top1"] is not None and res["reloaded_ema_top1"] == res["ema_top1"]
    for name in ("metrics.jsonl", "curves.png", "model.safetensors", "model-ema.safetensors", "results.json",
                 "ckpt-0000012.pt"):
        assert (out / name).is_file(), name
    valid = [r for r in read_metrics(out / "metrics.jsonl") if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [6, 12] and {"top1", "top5", "ema_top1"} <= set(valid[0])


@pytest.mark.slow
@needs_fmnist
def test_naflexvit_tiny_preset_trains(tmp_path):
    out = tmp_path / "run"
    res = _recipe().main([f"run.out_dir={out}", "model=naflexvit-tiny", "data.train_limit=1024", "data.valid_limit=200",
                          "data.batch_size=64", "train.max_steps=16", "run.log_every=4", "run.eval_every=16", *TINY[1:]])
    assert res["steps"] == 16 and res["reloaded_top1"] == res["top1"]
    losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"]
    assert losses[-1] < losses[0]


@pytest.mark.torchrun
@needs_fmnist
def test_torchrun_two_processes_gloo(tmp_path):
    out = tmp_path / "ddp"
    _run([f"run.out_dir={out}", "data.train_limit=1024", "data.valid_limit=500", "data.batch_size=64",
          "train.max_steps=8", "run.log_every=4", *TINY], torchrun=2)
    res = json.loads((out / "results.json").read_text())
    assert res["world_size"] == 2 and res["steps"] == 8 and res["valid_images"] == 500
    # The export is rank 0's model: every rank must have evaluated rank 0's BatchNorm statistics too
    # (the default model's conv stem), for the model and its EMA.
    assert res["reloaded_top1"] == res["top1"] and res["reloaded_loss"] == pytest.approx(res["loss"], rel=1e-6, abs=0)
    assert res["reloaded_ema_top1"] == res["ema_top1"]
    assert res["reloaded_ema_loss"] == pytest.approx(res["ema_loss"], rel=1e-6, abs=0)


@pytest.mark.recipe
@needs_fmnist
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    common = ["data.train_limit=1024", "data.valid_limit=300", "data.batch_size=64", "train.max_steps=40",
              "run.log_every=2", "run.checkpoint_every=4", "run.threads=1", *TINY]
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run([f"run.out_dir={full}", *common])

    proc = subprocess.Popen([sys.executable, str(RECIPE), f"run.out_dir={cut}", *common], cwd=ROOT,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    while not (cut / "ckpt-0000008.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (cut / "results.json").exists()
    _run([f"run.out_dir={cut}", *common, "--resume"])

    a, b = load_file(str(full / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    ea, eb = load_file(str(full / "model-ema.safetensors")), load_file(str(cut / "model-ema.safetensors"))
    assert all(torch.equal(ea[k], eb[k]) for k in ea)
    assert _train_records(full) == _train_records(cut)  # the same loss curve, step by step
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (full, cut))
    assert (ra["top1"], ra["loss"], ra["ema_top1"]) == (rb["top1"], rb["loss"], rb["ema_top1"])


def _image_folder(root: Path) -> None:
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split, per_class in (("train", 6), ("val", 2)):
        for c, cls in enumerate(("ant", "bee")):
            (root / split / cls).mkdir(parents=True)
            for i in range(per_class):
                pixels = (torch.rand(20, 20, 3, generator=g) * 80 + 120 * c).byte().numpy()
                Image.fromarray(pixels).save(root / split / cls / f"{i}.JPEG")
    # one corrupt file in each split: skipped and counted, never fatal
    (root / "train" / "ant" / "5.JPEG").write_bytes(b"not a jpeg at all")
    (root / "val" / "bee" / "broken.JPEG").write_bytes(b"\xff\xd8\xff\xe0 truncated")


@pytest.mark.recipe
def test_image_folder_skips_corrupt_images(tmp_path):
    _image_folder(tmp_path / "data")
    res = _recipe().main([
        f"run.out_dir={tmp_path / 'run'}", f"data.path={tmp_path / 'data'}", "data.batch_size=4", "data.workers=1",
        "data.mixup=0.8", "data.cutmix=1.0", "train.epochs=1", "run.log_every=1",
        "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2,block.ffn.hidden=32,image_size=16,patch_size=8]",
        "run.plot=false", "run.ema=null",
    ])
    assert res["steps"] == 3  # 12 training files, batch 4
    assert res["skipped_train_images"] == 1 and res["skipped_valid_images"] == 1
    assert res["valid_images"] == 4 and res["reloaded_top1"] == res["top1"]


def test_a_step_is_the_global_batch_whatever_the_split_but_not_another_batch_size():
    """Resuming on other processes or grad_accum continues at the same step (a step is data.batch_size
    images); another data.batch_size inside an epoch is refused."""
    from zoo.train import Dist, TrainError

    recipe = _recipe()
    cfg = recipe.RecipeConfig(data={"batch_size": 64})
    task = recipe.ImageTask(cfg, Dist(), data=None, accum=1)
    task.load_state_dict({"skipped": 0, "batch_size": 64})
    assert task.resume_at(0, 5, 2, 2, (1, 1)) == 5
    task.load_state_dict(recipe.ImageTask(recipe.RecipeConfig(data={"batch_size": 32}), Dist(), None, 1).state_dict())
    with pytest.raises(TrainError, match=r"data.batch_size: the checkpoint stopped inside epoch 0 with batches of 32, this "
                                         r"run's are 64; resume with data.batch_size=32"):
        task.resume_at(0, 5, 1, 1, (1, 1))
