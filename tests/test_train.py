"""Shared recipe machinery: checkpoints (atomic, exact RNG, averaging), schedules, parameter groups,
metrics log, configs."""

from __future__ import annotations

import json
import math
import random
import re

import pytest
import torch

import zoo
import zoo.train as T
from conftest import tiny_model


def test_average_is_the_arithmetic_mean(tmp_path):
    models = [tiny_model("decoder", seed=s) for s in range(3)]
    paths = [T.save_checkpoint(tmp_path / T.checkpoint_name(i), model=m, step=i) for i, m in enumerate(models)]
    averaged = T.average_checkpoints(paths)
    for name, tensor in models[0].state_dict().items():
        by_hand = sum(m.state_dict()[name].double() for m in models) / 3
        torch.testing.assert_close(averaged[name], by_hand.to(tensor.dtype), rtol=0, atol=1e-7)
    # averaging one checkpoint gives it back; averaging safetensors files agrees with checkpoints
    torch.testing.assert_close(T.average_checkpoints(paths[:1])["tok_emb.weight"], models[0].tok_emb.weight.detach())
    files = [zoo.save(m, tmp_path / f"m{i}.safetensors") for i, m in enumerate(models)]
    from_files = T.average_checkpoints(files)
    torch.testing.assert_close(from_files["tok_emb.weight"], averaged["tok_emb.weight"])


def test_average_refuses_mismatched_checkpoints(tmp_path):
    a = T.save_checkpoint(tmp_path / "a.pt", model=tiny_model("decoder"), step=1)
    b = T.save_checkpoint(tmp_path / "b.pt", model=tiny_model("decoder", ["n_layers=1"]), step=1)
    with pytest.raises(ValueError, match=r"b.pt holds other tensors than .*a.pt \(missing \[.stack.blocks.1"):
        T.average_checkpoints([a, b])
    with pytest.raises(ValueError, match="nothing to average"):
        T.average_checkpoints([])


def test_checkpoint_restores_rng_and_optimizer_exactly(tmp_path):
    model = tiny_model("decoder")
    opt = T.build_optimizer(model, T.OptimConfig(lr=1e-3))
    tokens = torch.randint(0, model.spec.vocab_size, (2, 8))
    model(tokens).float().mean().backward()
    opt.step()
    path = T.save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, step=1, state={"epoch": 3})
    expected = (torch.rand(4), random.random())
    ckpt = T.load_checkpoint(path)
    T.restore_rng(ckpt)
    assert torch.equal(torch.rand(4), expected[0]) and random.random() == expected[1]
    assert ckpt["state"] == {"epoch": 3} and ckpt["step"] == 1
    fresh = T.build_optimizer(tiny_model("decoder"), T.OptimConfig(lr=1e-3))
    fresh.load_state_dict(ckpt["optimizer"])
    for a, b in zip(fresh.state_dict()["state"].values(), opt.state_dict()["state"].values()):
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"], rtol=0, atol=0)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    model = tiny_model("decoder")
    path = T.save_checkpoint(tmp_path / "ckpt-0000001.pt", model=model, step=1)
    before = path.read_bytes()

    def crash(obj, f):
        f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        T.save_checkpoint(path, model=model, step=2)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_bad_checkpoints_are_named(tmp_path):
    with pytest.raises(T.CheckpointError, match="no checkpoint"):
        T.load_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage")
    with pytest.raises(T.CheckpointError, match="bad.pt"):
        T.load_checkpoint(bad)
    torch.save({"weights": torch.ones(1)}, tmp_path / "other.pt")
    with pytest.raises(T.CheckpointError, match="not a zoo training checkpoint"):
        T.load_checkpoint(tmp_path / "other.pt")


def test_listing_and_pruning(tmp_path):
    model = tiny_model("decoder")
    for step in (30, 100, 7):
        T.save_checkpoint(tmp_path / T.checkpoint_name(step), model=model, step=step)
    (tmp_path / "final.pt").write_bytes(b"")
    assert [p.name for p in T.list_checkpoints(tmp_path)] == [T.checkpoint_name(s) for s in (7, 30, 100)]
    assert T.latest_checkpoint(tmp_path).name == T.checkpoint_name(100)
    T.prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in T.list_checkpoints(tmp_path)] == [T.checkpoint_name(s) for s in (30, 100)]


def test_inverse_sqrt_is_the_papers_formula():
    cfg = T.ScheduleConfig(kind="inverse_sqrt", warmup=4000)
    for step_number in (1, 100, 4000, 4001, 100_000):
        by_hand = 512 ** -0.5 * min(step_number ** -0.5, step_number * 4000 ** -1.5)
        assert T.lr_factor(cfg, step_number - 1, 10**6, d_model=512) == pytest.approx(by_hand, rel=1e-12)
    peak = max(T.lr_factor(cfg, s, 10**6, d_model=512) for s in range(8000))
    assert peak == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # ~7e-4 at the end of warmup


def test_cosine_warmup_and_floor():
    cfg = T.ScheduleConfig(kind="cosine", warmup=10, min_lr_ratio=0.1)
    factors = [T.lr_factor(cfg, s, 110) for s in range(110)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[59] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factors[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:]))


def test_cosine_under_a_time_budget_follows_the_clock():
    """With a time budget (``done``: the fraction of it spent) the cosine decays by whichever of time
    and steps is further along: half the time spent is the cosine's middle, all of it the floor."""
    cfg = T.ScheduleConfig(kind="cosine", warmup=10, min_lr_ratio=0.1)
    middle = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))
    assert T.lr_factor(cfg, 20, 10**6, done=0.5) == pytest.approx(middle)
    assert T.lr_factor(cfg, 20, 10**6, done=1.0) == pytest.approx(0.1)
    assert T.lr_factor(cfg, 20, 10**6, done=0.0) == pytest.approx(T.lr_factor(cfg, 20, 10**6))
    assert T.lr_factor(cfg, 59, 110, done=0.1) == pytest.approx(middle)  # the steps are further along
    assert T.lr_factor(cfg, 3, 10**6, done=0.9) == pytest.approx(0.4)  # warmup is by steps


def test_cooldown_anneals_the_last_fraction_by_steps_or_by_the_clock():
    plain = T.ScheduleConfig(kind="inverse_sqrt", warmup=100)
    cfg = T.ScheduleConfig(kind="inverse_sqrt", warmup=100, cooldown=0.25)
    base = [T.lr_factor(plain, s, 1000, d_model=256) for s in range(1000)]
    cooled = [T.lr_factor(cfg, s, 1000, d_model=256) for s in range(1000)]
    assert cooled[:750] == base[:750]  # untouched before the last quarter
    for s in (750, 800, 900, 999):  # then the paper's factor times (1 - s/1000) / 0.25, by hand
        assert cooled[s] == pytest.approx(base[s] * (1 - s / 1000) / 0.25, rel=1e-12)
    # a time budget that runs out first: 90% of the clock spent at step 100 leaves 0.1 / 0.25 of the lr
    assert T.lr_factor(cfg, 100, 1000, d_model=256, done=0.9) == pytest.approx(base[100] * 0.4)
    assert T.lr_factor(cfg, 100, 1000, d_model=256, done=1.2) == 0.0  # past the budget: never negative
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    clock = {"done": 0.0}
    sched = T.build_scheduler(opt, cfg, 1000, d_model=256, done=lambda s: clock["done"])
    clock["done"] = 0.95
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(2.0 * base[1] * 0.2)
    with pytest.raises(ValueError, match="cooldown"):
        T.ScheduleConfig(cooldown=1.5)


def test_no_decay_on_norms_biases_tables_and_tokens():
    model = zoo.build("vit-tiny-16", ["n_layers=1"], seed=0)
    decay, no_decay = T.param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    no = {names[id(p)] for p in no_decay["params"]}
    yes = {names[id(p)] for p in decay["params"]}
    assert {"cls_token", "position.weight", "stack.blocks.0.attn_norm.weight", "stack.blocks.0.attn.qkv.bias"} <= no
    assert {"stack.blocks.0.attn.qkv.weight", "patch_embed.proj.weight", "head.weight"} <= yes
    assert len(no) + len(yes) == len(list(model.parameters()))


def test_adam_with_weight_decay_is_refused():
    with pytest.raises(ValueError, match="optim.weight_decay"):
        T.build_optimizer(tiny_model("decoder"), T.OptimConfig(name="adam", weight_decay=0.1))


def test_metrics_log_resumes_without_the_lost_tail(tmp_path):
    log = T.MetricsLog(tmp_path / "m.jsonl")
    for step in (10, 20, 30):
        log.write(step=step, loss=1.0 / step)
    log = T.MetricsLog(tmp_path / "m.jsonl", resume_step=20)  # the checkpoint was at step 20
    log.write(step=30, loss=0.5, split="valid")
    records = T.read_metrics(tmp_path / "m.jsonl")
    assert [(r["step"], r["split"]) for r in records] == [(10, "train"), (20, "train"), (30, "valid")]
    with open(tmp_path / "m.jsonl", "a") as f:
        f.write('{"step": 40, "lo')  # a torn line from a crash
    assert len(T.read_metrics(tmp_path / "m.jsonl")) == 3
    png = T.plot_metrics(tmp_path / "m.jsonl", tmp_path / "m.png", [("loss", ["train/loss", "valid/loss"])])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    off = T.MetricsLog(tmp_path / "other.jsonl", enabled=False)
    off.write(step=1, loss=1.0)
    assert not (tmp_path / "other.jsonl").exists()
    assert json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])["loss"] == pytest.approx(0.1)


def test_curves_give_a_split_one_colour_in_every_panel():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    splits = ["train", "valid", "valid_ding", "valid_messages"]
    panels = [("loss", ["train/loss", "valid/loss"]),  # the translation recipe's panels, and two metrics of one split
              ("perplexity", ["train/ppl", "valid/ppl", "valid_ding/ppl", "valid_messages/ppl"]),
              ("valid BLEU", ["valid/bleu", "valid_ding/bleu", "valid_messages/bleu"]),
              ("accuracy", ["valid/top1", "valid/top5"])]
    records = [{"step": step, "split": split, "loss": 1 / step, "ppl": 9 / step, "bleu": step, "top1": step, "top5": step}
               for step in (1, 2, 3) for split in splits]
    fig = T.metrics_figure(records, panels)
    drawn = [{line.get_label(): (to_hex(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}
             for ax in fig.axes]
    plt.close(fig)
    assert [sorted(d) for d in drawn] == [sorted(keys) for _, keys in panels]
    colours = {split: {c for d in drawn for key, (c, _) in d.items() if key.split("/")[0] == split} for split in splits}
    assert all(len(c) == 1 for c in colours.values()), colours  # each split in one colour, whatever the panel
    assert len(set.union(*colours.values())) == len(splits)  # and the splits in different colours
    assert drawn[1]["valid_ding/ppl"] == drawn[2]["valid_ding/bleu"]
    assert drawn[3]["valid/top1"][0] == drawn[3]["valid/top5"][0] and drawn[3]["valid/top1"][1] != drawn[3]["valid/top5"][1]


def test_config_errors_name_the_field(tmp_path):
    class Cfg(T.Config):
        optim: T.OptimConfig = T.OptimConfig()
        run: T.RunConfig = T.RunConfig()

    cfg = T.load_config(Cfg, None, ["optim.lr=3e-4", "run.seed=7"])
    assert cfg.optim.lr == 3e-4 and cfg.run.seed == 7
    with pytest.raises(T.ConfigError, match=r"optim\.lrr: unknown key"):
        T.load_config(Cfg, None, ["optim.lrr=1"])
    with pytest.raises(T.ConfigError, match=r"run\.precision"):
        T.load_config(Cfg, None, ["run.precision=fp8"])
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1\n  lr: 2\n")
    with pytest.raises(T.ConfigError, match="duplicate"):
        T.load_config(Cfg, path)
    assert T.load_config(Cfg, None).model_dump() == Cfg.model_validate(
        __import__("yaml").safe_load(T.config_to_yaml(Cfg()))).model_dump()


def test_config_and_spec_errors_read_alike():
    class Cfg(T.Config):
        optim: T.OptimConfig = T.OptimConfig()

    with pytest.raises(T.ConfigError) as config_error:
        T.load_config(Cfg, None, ["optim.lrr=1", "optim.lr=-1"])
    assert str(config_error.value) == (
        "invalid config (defaults) with optim.lrr=1 optim.lr=-1 (2 problems):\n"
        "  optim.lr: Input should be greater than 0 (got -1)\n"
        "  optim.lrr: unknown key (got 1); remove it or check its spelling")
    with pytest.raises(zoo.SpecError) as spec_error:
        zoo.load_spec("gpt2-small", ["n_layerz=1"])
    assert str(spec_error.value).endswith(
        " (1 problem):\n  n_layerz: unknown key (got 1); remove it or check its spelling")
    assert str(spec_error.value).startswith("invalid spec ")


def test_auto_precision_is_bf16_only_where_bf16_matmuls_are_native(monkeypatch):
    cpu = torch.device("cpu")
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert T.resolve_precision("auto", cpu) == ("bf16" if native else "fp32")
    assert T.resolve_precision("fp32", cpu) == "fp32" and T.resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="auto, bf16 or fp32"):
        T.resolve_precision("fp16", cpu)
    # a CPU without AVX-512/AMX bf16 kernels (torch would fall back to a scalar GEMM): fp32, no autocast
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert T.resolve_precision("auto", cpu) == "fp32"
    with T.autocast(cpu, "auto"):
        assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.float32
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    with T.autocast(cpu, "auto"):
        assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.bfloat16
    assert T.RunConfig().precision == "auto"


def test_ema_tracks_the_average():
    model = torch.nn.Linear(2, 2, bias=False)
    ema = T.EMA(model, decay=0.5)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    torch.testing.assert_close(ema.module.weight, start + 0.5)


def test_config_files_layer_over_the_recipe_defaults(tmp_path, capsys):
    class Cfg(T.Config):
        optim: T.OptimConfig = T.OptimConfig()
        run: T.RunConfig = T.RunConfig()

    recipe, mine = tmp_path / "recipe.yaml", tmp_path / "mine.yaml"
    recipe.write_text("optim:\n  lr: 2.0e-3\n  betas: [0.9, 0.95]\nrun:\n  seed: 5\n  log_every: 7\n")
    mine.write_text("optim:\n  lr: 5.0e-4\nrun: {seed: 9}\n")
    cfg, _ = T.parse_args(Cfg, ["--config", str(mine), "run.log_every=3"], default=recipe)
    # mine.yaml changes lr and seed only: betas stay the recipe's, log_every comes from the command line
    assert (cfg.optim.lr, cfg.optim.betas, cfg.run.seed, cfg.run.log_every) == (5e-4, (0.9, 0.95), 9, 3)
    assert cfg.optim.weight_decay == T.OptimConfig().weight_decay  # in no file: the class default

    with pytest.raises(SystemExit) as done:
        T.parse_args(Cfg, ["--config", str(mine), "run.log_every=3", "--print-config", "--sources"], default=recipe)
    assert done.value.code == 0
    shown = capsys.readouterr().out
    origin = dict(re.findall(r"^\s*(\w+): .*# (.+)$", shown, flags=re.M))
    assert origin["lr"] == str(mine) and origin["seed"] == str(mine)
    assert origin["betas"] == "recipe.yaml (the recipe's defaults)"
    assert origin["log_every"] == "command line" and origin["weight_decay"] == "default (Cfg)"
    # the annotated YAML still reads back to the same config
    assert Cfg.model_validate(__import__("yaml").safe_load(shown)) == cfg

    with pytest.raises(SystemExit):
        T.parse_args(Cfg, ["--sources"], default=recipe)
    assert "--sources goes with --print-config" in capsys.readouterr().err


def test_resume_before_an_override_resumes_the_latest_and_applies_the_override(tmp_path):
    class Cfg(T.Config):
        run: T.RunConfig = T.RunConfig()

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("run: {seed: 5}\n")
    cfg, args = T.parse_args(Cfg, ["--resume", "run.seed=9", "run.log_every=3"], default=recipe)
    assert args.resume == "latest" and (cfg.run.seed, cfg.run.log_every) == (9, 3)
    ckpt = tmp_path / "ckpt-0000004.pt"
    ckpt.write_bytes(b"x")  # a path given to --resume stays a path, whatever its name holds
    _, args = T.parse_args(Cfg, ["--resume", str(ckpt), "run.seed=9"], default=recipe)
    assert args.resume == str(ckpt)


def test_resume_from_a_model_file_says_what_it_is_and_never_to_delete_it(tmp_path):
    path = zoo.save(tiny_model("decoder"), tmp_path / "model.safetensors")
    with pytest.raises(T.CheckpointError) as e:
        T.resolve_resume(str(path), tmp_path)
    message = str(e.value)
    assert "is a model file (safetensors" in message and "ckpt-*.pt" in message and "delete" not in message
    assert path.is_file()
