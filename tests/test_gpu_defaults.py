"""The recipes' GPU layers (recipes/*.gpu.yaml): laid under the user's settings when run.device resolves
to CUDA, never on a CPU; checked here without a GPU by making CUDA look available."""

from __future__ import annotations

import re

import pytest
import torch

import zoo.train as T
from zoo.train.config import ConfigError

import imagenet
import lm
import mlm
import translate

RECIPES = {"translate": translate.TranslateConfig, "lm": lm.LMConfig, "mlm": mlm.MLMConfig,
           "imagenet": imagenet.RecipeConfig}
MODULES = {"translate": translate, "lm": lm, "mlm": mlm, "imagenet": imagenet}


def resolve(name: str, configs=(), overrides=(), **kw) -> T.Resolved:
    module = MODULES[name]
    return T.resolve_config(RECIPES[name], module.DEFAULT_CONFIG, configs, overrides, gpu=module.GPU_CONFIG, **kw)


@pytest.fixture
def cuda(monkeypatch):
    """CUDA looks available; nothing touches a GPU (configs only)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.parametrize("name", list(RECIPES))
def test_on_a_cpu_nothing_changes(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    module = MODULES[name]
    plain = T.load_config(RECIPES[name], module.DEFAULT_CONFIG)
    got = resolve(name)
    assert got.config == plain and got.gpu == {}
    assert not any("gpu-default" in v for v in got.sources.values())
    assert resolve(name, defaults="cpu").config == plain


@pytest.mark.parametrize("name", list(RECIPES))
def test_on_cuda_the_gpu_layer_applies(name, cuda):
    got = resolve(name)
    cfg = got.config
    assert cfg.run.compile is True and got.gpu["run.compile"] is True
    assert all(got.sources[k] == f"gpu-default ({name}.gpu.yaml)" for k in got.gpu)
    # what each recipe's layer is for
    if name == "translate":
        assert (cfg.model, cfg.train.max_tokens, cfg.model_overrides) == ("transformer-base", 25000, [])
    if name == "lm":
        assert (cfg.train.batch_size, cfg.train.block_len, cfg.run.attention) == (16, 1024, "default")
        assert "max_seq_len=1024" in cfg.model_overrides
    if name == "mlm":
        assert (cfg.train.batch_size, cfg.train.max_len, cfg.data.packing, cfg.run.attention) == (32, 512, "documents",
                                                                                                   "default")
    if name == "imagenet":
        assert cfg.data.batch_size == 256
    # a device the user names decides: cpu turns the layer off on a GPU machine
    assert resolve(name, overrides=["run.device=cpu"]).gpu == {}
    assert resolve(name, defaults="cpu").gpu == {}


def test_explicit_cuda_applies_without_cuda_here(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve("lm", overrides=["run.device=cuda:1"]).config.train.block_len == 1024
    assert resolve("lm", defaults="gpu").config.run.compile is True  # --defaults gpu: anywhere
    assert (T.on_cuda("auto"), T.on_cuda("cpu"), T.on_cuda("cuda"), T.on_cuda("cuda:3")) == (False, False, True, True)


def test_what_the_user_sets_wins(cuda, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("train: {block_len: 256}\nrun: {attention: math}\n")
    got = resolve("lm", [mine], ["train.batch_size=4", "run.compile=false"])
    cfg = got.config
    assert (cfg.train.block_len, cfg.run.attention) == (256, "math")
    assert (cfg.train.batch_size, cfg.run.compile) == (4, False)
    assert got.sources["train.block_len"] == str(mine) and got.sources["train.batch_size"] == "command line"
    # only what the layer still decides is reported
    assert set(got.gpu) == {"model_overrides"}
    # a value equal to the layer's, set by the user, is the user's
    assert resolve("lm", overrides=["train.block_len=1024"]).sources["train.block_len"] == "command line"


def test_print_config_sources_and_the_first_line(cuda, capsys):
    with pytest.raises(SystemExit) as done:
        T.parse_args(lm.LMConfig, ["train.steps=3", "--print-config", "--sources"], default=lm.DEFAULT_CONFIG,
                     gpu=lm.GPU_CONFIG)
    assert done.value.code == 0
    origin = dict(re.findall(r"^\s*(\w+): .*# (.+)$", capsys.readouterr().out, flags=re.M))
    assert origin["block_len"] == "gpu-default (lm.gpu.yaml)" and origin["attention"] == "lm.yaml (the recipe's defaults)"
    assert origin["steps"] == "command line" and origin["out_dir"] == "lm.yaml (the recipe's defaults)"

    cfg, args = T.parse_args(lm.LMConfig, ["train.batch_size=2"], default=lm.DEFAULT_CONFIG, gpu=lm.GPU_CONFIG)
    printed = capsys.readouterr().out
    assert printed.startswith("gpu-defaults (lm.gpu.yaml;") and args.gpu_note in printed
    assert "train.block_len=1024" in printed and "run.attention" not in printed and "batch_size" not in printed
    assert cfg.train.batch_size == 2

    _, args = T.parse_args(lm.LMConfig, ["--defaults", "cpu"], default=lm.DEFAULT_CONFIG, gpu=lm.GPU_CONFIG)
    assert args.gpu_note is None and capsys.readouterr().out == ""


def test_a_gpu_layer_cannot_pick_the_device(tmp_path):
    bad = tmp_path / "bad.gpu.yaml"
    bad.write_text("run: {device: cuda}\n")
    with pytest.raises(ConfigError, match="cannot set run.device"):
        T.resolve_config(lm.LMConfig, lm.DEFAULT_CONFIG, gpu=bad, defaults="gpu")
    with pytest.raises(ConfigError, match="--defaults 'gpus'"):
        T.resolve_config(lm.LMConfig, lm.DEFAULT_CONFIG, gpu=lm.GPU_CONFIG, defaults="gpus")
