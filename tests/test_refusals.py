"""What cannot take effect is refused in one line that names it, on every path: the counted options
of the zoo command and the translate command, ``run.*`` options on one process, on CPU and under
torchrun, and checkpoints (``.pt`` files, sharded ``.dcp`` folders) missing a part, found before
anything reads them; an incomplete newest checkpoint stops ``--resume``, never skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_scale import Tokens, cfg, model, tiny

from zoo.cli import main as zoo_main
from zoo.train import (
    CheckpointError,
    Config,
    Dist,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrainError,
    average_checkpoints,
    checkpoint_spec,
    fit,
    list_checkpoints,
    resolve_device,
    resolve_resume,
)
from zoo.train.config import ConfigError, load_config
from zoo.train.distributed import distributed
from zoo.train.loop import refuse_what_cannot_apply
from conftest import launch

ROOT = Path(__file__).resolve().parents[1]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# ---------------------------------------------------------------------------- command lines
@pytest.mark.parametrize("argv, option, got", [
    (["summary", "gpt2-small", "--shard", "0"], "--shard", "must be at least 1, got 0"),
    (["summary", "gpt2-small", "--shard", "-2"], "--shard", "must be at least 1, got -2"),
    (["summary", "gpt2-small", "--batch", "0"], "--batch", "must be at least 1, got 0"),
    (["summary", "gpt2-small", "--seq", "0"], "--seq", "must be at least 1, got 0"),
    (["summary", "gpt2-small", "--seq", "1.5"], "--seq", "expected a whole number of at least 1, got '1.5'"),
    (["ablate", "grid.yaml", "--jobs", "0"], "--jobs", "must be at least 1, got 0"),
])
def test_counted_options_of_the_zoo_command_are_at_least_one(capsys, argv, option, got):
    assert zoo_main(argv) == 2
    assert one_error_line(capsys).startswith(f"zoo: error: argument {option}: {got} (see 'zoo ")


def test_one_shard_is_one_process(capsys):
    assert zoo_main(["summary", "gpt2-small", "--shard", "1"]) == 0
    assert "training memory per process: ddp on 1 process" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--batch", "--beams"])
def test_counted_options_of_the_translate_command_are_at_least_one(capsys, option):
    from translate_eval import translate_stdin

    with pytest.raises(SystemExit) as e:
        translate_stdin(["--model", "nowhere", option, "0"], prog="translate.py translate")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"translate.py translate: error: argument {option}: must be at least 1, got 0"


# ------------------------------------------------------------------------------- run options
def test_offload_on_one_process_is_refused(tmp_path):
    with pytest.raises(TrainError) as e:  # on CPU: nothing to offload to
        fit(model(), Tokens(), **cfg(tmp_path, strategy="fsdp", offload=True), total_steps=1)
    assert str(e.value) == ("run.offload: moves sharded state from GPU to CPU memory, but this run is on cpu; "
                            "set run.offload=false")
    with pytest.raises(TrainError) as e:  # one GPU process: no shards
        refuse_what_cannot_apply(RunConfig(strategy="fsdp", offload=True), Dist(device=torch.device("cuda")))
    assert str(e.value) == ("run.offload: offloads FSDP's shards, but one process trains the whole model unsharded; "
                            "run under torchrun with several processes, or set run.offload=false")
    assert not list(tmp_path.glob("ckpt-*"))  # refused before a step


@pytest.mark.torchrun
def test_offload_in_the_recipe_is_one_line_on_one_process_and_under_torchrun(tmp_path, capsys):
    from test_lm_recipes import fake_wordnet, lm
    from test_torchrun_loss import lm_args

    wordnet = fake_wordnet(tmp_path / "wordnet")
    args = lm_args(wordnet, tmp_path / "one", "run.strategy=fsdp", "run.offload=true", "run.device=cpu", "train.steps=1")
    assert lm.main(args) == 2
    message = ("lm.py: error: run.offload: moves sharded state from GPU to CPU memory, but this run is on cpu; "
               "set run.offload=false")
    assert capsys.readouterr().err.strip().splitlines()[-1] == message
    args = lm_args(wordnet, tmp_path / "two", "run.strategy=fsdp", "run.offload=true", "run.device=cpu", "train.steps=1")
    proc = launch(ROOT / "recipes" / "lm.py", args, 2, check=False)
    assert proc.returncode != 0 and proc.stderr.count(message) == 2, proc.stderr[-3000:]


def test_attention_kernels_torch_cannot_run_are_refused(tmp_path):
    with pytest.raises(TrainError) as e:
        fit(model(), Tokens(), **cfg(tmp_path / "efficient", attention="efficient"), total_steps=1)
    assert str(e.value) == ("run.attention: efficient is a CUDA kernel, but this run is on cpu; use run.attention=default, "
                            "math or flash")
    with pytest.raises(TrainError, match=r"^run.attention: flex trains on CUDA only .*use run.attention=blocked"):
        fit(model(), Tokens(), **cfg(tmp_path / "flex", attention="flex"), total_steps=1)
    # flash runs on CPU, but not with attention dropout: named when torch finds no kernel, not a traceback
    fit(model(tiny("decoder", "dropout.attention=0.0")), Tokens(), **cfg(tmp_path / "flash", attention="flash"),
        total_steps=1)
    with pytest.raises(TrainError, match=r"^run.attention: torch has no flash attention kernel for this model on cpu in "
                                         r"(bf16|fp32) \(dropout and masks count too\); use run.attention=default or math$"):
        fit(model(tiny("decoder", "dropout.attention=0.1")), Tokens(), **cfg(tmp_path / "dropout", attention="flash"),
            total_steps=1)


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.raises(TrainError) as e:
        refuse_what_cannot_apply(RunConfig(precision="bf16"), Dist(device=torch.device("cuda", 0)))
    assert str(e.value) == "run.precision: bf16, but Tesla T4 has no bf16; use run.precision=fp32 (or auto)"
    refuse_what_cannot_apply(RunConfig(precision="auto"), Dist(device=torch.device("cuda", 0)))  # auto picks fp32


def test_infinite_nan_and_out_of_range_settings_are_refused_by_name():
    """YAML reads .inf and .nan as floats: an infinite learning rate trains to NaN, so every float
    a recipe config declares is finite; Adam's decays are below 1, a cosine ends at most at lr."""
    Run = type("Run", (Config,), {"__annotations__": {"optim": OptimConfig, "schedule": ScheduleConfig},
                                  "optim": OptimConfig(), "schedule": ScheduleConfig()})
    for override, line in (("optim.lr=.inf", "optim.lr: must be a finite number, got inf; write a number (not .inf or .nan)"),
                           ("schedule.min_lr_ratio=.nan", "schedule.min_lr_ratio: must be a finite number, got nan; "
                                                          "write a number (not .inf or .nan)"),
                           # values torch's Adam refuses only when the run builds it, or a cosine that rises
                           ("optim.betas=[0.9, 1.0]", "optim.betas.1: Input should be less than 1 (got 1.0)"),
                           ("schedule.min_lr_ratio=2", "schedule.min_lr_ratio: Input should be less than or equal to 1 (got 2)")):
        with pytest.raises(ConfigError) as e:
            load_config(Run, None, [override])
        assert str(e.value).splitlines()[-1] == "  " + line
    assert load_config(Run, None, ["optim.lr=0.5"]).optim.lr == 0.5


def test_devices_that_cannot_be_had_are_named(monkeypatch):
    Run = type("Run", (Config,), {"__annotations__": {"run": RunConfig}})
    with pytest.raises(ConfigError) as e:
        load_config(Run, None, ["run.device=gpu"])
    assert str(e.value).splitlines()[-1] == "  run.device: 'gpu' is not a device zoo trains on; use auto, cpu, cuda or cuda:N"
    if not torch.cuda.is_available():
        with pytest.raises(TrainError) as e:
            resolve_device("cuda")
        assert str(e.value) == "run.device: 'cuda' asked for, but CUDA is not available here; use run.device=cpu (or auto)"
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(TrainError) as e, distributed("cuda:1"):
        pass
    assert str(e.value) == ("run.device: cuda:1 puts all 2 processes on one GPU; use run.device=cuda (each process "
                            "takes its LOCAL_RANK's GPU; CUDA_VISIBLE_DEVICES picks which GPUs)")


# ------------------------------------------------------------------------------- checkpoints
def _cut(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


DAMAGE = {  # what is done to the newest checkpoint -> what the error says is missing
    "no .metadata": (lambda p: (p / ".metadata").unlink(), "it is incomplete: no .metadata in the folder"),
    "no train state": (lambda p: (p / "train_state.pt").unlink(), "it is incomplete: no train_state.pt in the folder"),
    "no shard": (lambda p: (p / "__0_0.distcp").unlink(), "it is incomplete: shard file __0_0.distcp missing"),
    "cut shard": (lambda p: _cut(p / "__0_0.distcp"), "it is incomplete: shard file __0_0.distcp is cut short (100 of "),
    "cut .metadata": (lambda p: _cut(p / ".metadata"), "its .metadata cannot be read (UnpicklingError"),
    "cut train state": (lambda p: _cut(p / "train_state.pt"),
                        "train_state.pt is cut short or not a torch.save file (100 bytes, no zip directory at its end)"),
    "cut .pt": (_cut, "ckpt-0000002.pt is cut short or not a torch.save file (100 bytes, no zip directory at its end)"),
    "empty .pt": (lambda p: p.write_bytes(b""), "ckpt-0000002.pt is cut short or not a torch.save file (0 bytes"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_an_incomplete_checkpoint_is_named_before_it_is_read(tmp_path, damage):
    do, missing = DAMAGE[damage]
    strategy = "ddp" if damage.endswith(".pt") else "fsdp"
    fit(model(), Tokens(), **cfg(tmp_path, strategy=strategy, checkpoint_every=1, keep_checkpoints=5), total_steps=2)
    older, newest = list_checkpoints(tmp_path)
    do(newest)
    assert list_checkpoints(tmp_path) == [older, newest]  # listed, never skipped
    with pytest.raises(CheckpointError) as e:
        resolve_resume("latest", tmp_path)
    assert str(e.value).startswith(f"--resume: cannot read the newest checkpoint, {newest}: {missing}")
    assert str(e.value).endswith(f"; delete it, or resume from the newest whole one: --resume {older}")
    for read in (lambda: resolve_resume(str(newest), tmp_path), lambda: average_checkpoints([newest]),
                 lambda: checkpoint_spec(newest),
                 lambda: fit(model(), Tokens(), **cfg(tmp_path, strategy=strategy), total_steps=3, resume=newest)):
        with pytest.raises(CheckpointError) as e:
            read()
        assert str(e.value).startswith(f"cannot read checkpoint {str(newest)!r}: {missing}"), str(e.value)
        assert str(e.value).endswith("; delete it, or use another checkpoint")
    assert resolve_resume(str(older), tmp_path) == older


def test_a_lone_incomplete_checkpoint_says_to_start_afresh(tmp_path):
    fit(model(), Tokens(), **cfg(tmp_path, strategy="fsdp"), total_steps=1)
    (only,) = list_checkpoints(tmp_path)
    (only / ".metadata").unlink()
    with pytest.raises(CheckpointError, match=r": it is incomplete: no .metadata in the folder; delete it, or start "
                                              r"without --resume$"):
        resolve_resume("latest", tmp_path)


def test_resuming_the_recipe_from_an_incomplete_checkpoint_is_one_line(tmp_path, capsys):
    from test_lm_recipes import fake_wordnet, lm
    from test_torchrun_loss import lm_args

    out = tmp_path / "run"
    args = lm_args(fake_wordnet(tmp_path / "wordnet"), out, "run.strategy=fsdp", "train.steps=2", "run.checkpoint_every=1")
    assert lm.main(args) == 0
    older, newest = list_checkpoints(out)
    (newest / ".metadata").unlink()
    capsys.readouterr()
    assert lm.main(args + ["--resume"]) == 2
    assert one_error_line(capsys) == (f"lm.py: error: --resume: cannot read the newest checkpoint, {newest}: it is "
                                      f"incomplete: no .metadata in the folder; delete it, or resume from the newest "
                                      f"whole one: --resume {older}")
    assert lm.main(args + ["--resume", str(newest)]) == 2  # the traceback of issue 30: FileNotFoundError
    assert one_error_line(capsys) == (f"lm.py: error: cannot read checkpoint {str(newest)!r}: it is incomplete: no "
                                      ".metadata in the folder; delete it, or use another checkpoint")
    assert zoo_main(["average", str(older), str(newest), "-o", str(tmp_path / "avg.safetensors")]) == 2
    assert one_error_line(capsys).startswith(f"zoo: error: cannot read checkpoint {str(newest)!r}: it is incomplete: "
                                             "no .metadata")
