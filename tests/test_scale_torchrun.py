"""FSDP2 under torchrun with two gloo processes, for the three training recipes at tiny sizes:
``run.strategy=fsdp`` with activation checkpointing trains, its first losses match DDP's, a run killed
with SIGKILL (lm) or cut at a checkpoint (translate, imagenet) resumes to exactly the losses of an
uninterrupted run, and its sharded checkpoint resumes on one process. The lm model's second layer is a
mixture of experts with every router option on (tests/test_torchrun_loss.py's MOE_LAYER): its router
losses, token counts and the experts' biases resume exactly too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import zoo
from zoo.train import list_checkpoints, read_metrics
from conftest import child_env, launch, launch_command

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.torchrun
FSDP = ["run.strategy=fsdp", "run.activation_checkpointing=true"]


def run(recipe: str, args: list[str], processes: int = 2) -> str:
    return launch(ROOT / "recipes" / f"{recipe}.py", args, processes).stdout


def losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"]


def cut_at(run_dir: Path, step: int, into: Path) -> Path:
    """A copy of ``run_dir`` as it was when its checkpoint at ``step`` had just been written."""
    into.mkdir()
    ckpt = next(p for p in list_checkpoints(run_dir) if p.stem == f"ckpt-{step:07d}")
    (shutil.copytree if ckpt.is_dir() else shutil.copy)(ckpt, into / ckpt.name)
    for name in os.listdir(run_dir):
        if name.endswith(".json") and name != "results.json" or name in ("tokenizer.json", "data"):
            src = run_dir / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, into / name)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    import json

    (into / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x)["step"] <= step))
    return into / ckpt.name


def check_fsdp_matches_ddp(fsdp: Path, ddp: Path, n: int) -> None:
    """The first ``n`` train losses agree within 0.1% (in bf16, where the CPU runs it natively, FSDP
    computes with bf16 copies of the weights and DDP under autocast: their roundings differ)."""
    a, b = losses(fsdp)[:n], losses(ddp)[:n]
    assert len(a) == len(b) == n and [s for s, _ in a] == [s for s, _ in b]
    for (_, x), (_, y) in zip(a, b):
        assert abs(x - y) < 1e-3 * abs(y), (a, b)


# --------------------------------------------------------------------------------------- lm
@pytest.fixture(scope="module")
def wordnet(tmp_path_factory) -> Path:
    from test_lm_recipes import fake_wordnet

    return fake_wordnet(tmp_path_factory.mktemp("wordnet"))


def lm_args(wordnet: Path, out: Path, *extra: str) -> list[str]:
    from test_torchrun_loss import LM_MODEL

    return [f"data.wordnet_dir={wordnet}", "data.vocab_size=300", "data.valid_fraction=0.1", f"run.out_dir={out}", LM_MODEL,
            "train.batch_size=4", "train.block_len=16", "schedule.warmup=2", "run.log_every=1", "run.eval_every=1000",
            "run.checkpoint_every=4", "run.keep_checkpoints=100", "run.progress=false", "run.plot=false",
            "run.threads=1", "sample.max_new_tokens=4", "sample.prompts=[a]", *extra]


def test_lm_fsdp_killed_and_resumed_equals_uninterrupted_and_reshards(wordnet, tmp_path):
    steps = "train.steps=24"  # the kill lands at step 8, well before the end
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    out = run("lm", lm_args(wordnet, whole, steps, *FSDP))
    assert "2 process(es)" in out

    proc = subprocess.Popen(launch_command(ROOT / "recipes" / "lm.py", lm_args(wordnet, killed, steps, *FSDP), 2), cwd=ROOT, env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while not (killed / "ckpt-0000008.dcp").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "model").exists(), "the run ended before it could be killed"
    run("lm", lm_args(wordnet, killed, steps, *FSDP) + ["--resume"])
    assert losses(killed) == losses(whole)
    logged = [[r for r in read_metrics(out / "metrics.jsonl") if r["split"] in ("train", "experts")] for out in (killed, whole)]
    strip = [[{k: v for k, v in r.items() if not k.endswith("_per_s")} for r in log] for log in logged]
    assert strip[0] == strip[1] and any("aux_loss" in r for r in strip[0])  # router losses and loads as well
    import zoo

    biases = [zoo.load(out / "model" / "model.safetensors").stack.blocks[1].ffn.expert_bias for out in (killed, whole)]
    assert torch.equal(*biases) and biases[0].abs().sum() > 0

    # the first losses of DDP on the same data
    ddp = tmp_path / "ddp"
    run("lm", lm_args(wordnet, ddp, "train.steps=8"))
    check_fsdp_matches_ddp(whole, ddp, 3)

    # a ddp run's one-file checkpoint resumes sharded: its losses go on as ddp's do
    from_file = tmp_path / "from_file"
    ckpt = cut_at(ddp, 4, from_file)
    run("lm", lm_args(wordnet, from_file, "train.steps=8", *FSDP) + ["--resume", str(ckpt)])
    assert [s for s, _ in losses(from_file)] == [s for s, _ in losses(ddp)]
    for (_, x), (_, y) in zip(losses(from_file)[4:], losses(ddp)[4:]):
        assert abs(x - y) < 1e-3 * abs(y), (losses(from_file), losses(ddp))

    # the two-process sharded checkpoint resumes on one process
    one = tmp_path / "one"
    ckpt = cut_at(whole, 8, one)
    out = run("lm", lm_args(wordnet, one, steps, *FSDP) + ["--resume", str(ckpt)], processes=1)
    assert "resuming a run of 2 process(es) on 1" in out
    assert losses(one)[-1][0] == 24 and all(loss == loss for _, loss in losses(one))


# -------------------------------------------------------------------------------- translate
from test_translate_recipe import data  # noqa: E402,F401 (its fixture: a slice of the Ding default as TSV files)


def translate_args(pairs: Path, out: Path, *extra: str) -> list[str]:
    return [f"data.path={pairs}", "data.vocab_size=300", f"run.out_dir={out}",
            "model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=4,block.ffn.hidden=64]",
            "train.max_tokens=400", "train.minutes=null", "train.average_last=2", "train.steps=8", "schedule.warmup=4",
            "run.log_every=1", "run.eval_every=4", "run.checkpoint_every=4", "run.keep_checkpoints=10",
            "run.progress=false", "run.plot=false", "run.threads=1", "decode.beams=1", "decode.max_len_b=4",
            "decode.samples=1", "decode.final_splits=[test]", *extra]


def test_translate_fsdp_resumes_exactly_and_matches_ddp(data, tmp_path):  # noqa: F811 (the fixture)
    whole = tmp_path / "whole"
    out = run("translate", translate_args(data, whole, *FSDP))
    assert "2 process(es)" in out and "sacreBLEU signature" in out
    assert (whole / "model" / "model.safetensors").is_file()  # exported from the sharded run, averaged from shards
    assert "test/averaged" in json.loads((whole / "results.json").read_text())
    cut = tmp_path / "cut"
    ckpt = cut_at(whole, 4, cut)
    run("translate", translate_args(data, cut, *FSDP) + ["--resume", str(ckpt)])
    assert losses(cut) == losses(whole)
    ddp = tmp_path / "ddp"
    out = run("translate", translate_args(data, ddp, "train.steps=3"))
    assert "2 process(es)" in out and "sacreBLEU signature" in out  # DDP: one report, rank 0 exports
    assert json.loads((ddp / "results.json").read_text())["step"] == 3
    assert zoo.load(ddp / "model" / "model.safetensors").spec.d_model == 32
    check_fsdp_matches_ddp(whole, ddp, 3)
    one = tmp_path / "one"
    ckpt = cut_at(whole, 4, one)
    assert "resuming a run of 2 process(es) on 1" in run("translate", translate_args(data, one, *FSDP) + ["--resume", str(ckpt)], processes=1)


# --------------------------------------------------------------------------------- imagenet
sys.path.insert(0, str(ROOT / "tests"))
from test_imagenet_recipe import needs_fmnist  # noqa: E402 (the same skip as the recipe's own tests)


def image_args(out: Path, *extra: str) -> list[str]:
    return [f"run.out_dir={out}", "data.train_limit=512", "data.valid_limit=64", "data.batch_size=32",
            "train.max_steps=8", "run.log_every=1", "run.checkpoint_every=4", "run.keep_checkpoints=10",
            "run.threads=1", "run.plot=false",
            "model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=2,block.ffn.hidden=64]",
            "schedule.warmup=2", *extra]


@needs_fmnist
def test_imagenet_fsdp_resumes_exactly_and_matches_ddp(tmp_path):
    whole = tmp_path / "whole"
    run("imagenet", image_args(whole, *FSDP))
    cut = tmp_path / "cut"
    ckpt = cut_at(whole, 4, cut)
    run("imagenet", image_args(cut, *FSDP) + ["--resume", str(ckpt)])
    assert losses(cut) == losses(whole)
    ddp = tmp_path / "ddp"
    run("imagenet", image_args(ddp, "train.max_steps=3"))
    check_fsdp_matches_ddp(whole, ddp, 3)


# ------------------------------------------------------------------------------------ mlm
def test_mlm_fsdp_pretrains_and_finetunes_a_wrapped_encoder(wordnet, tmp_path):
    from test_lm_recipes import mlm_args

    import zoo

    fsdp, ddp = tmp_path / "fsdp", tmp_path / "ddp"
    run("mlm", mlm_args(wordnet, fsdp, "run.threads=1", *FSDP))
    run("mlm", mlm_args(wordnet, ddp, "run.threads=1", "train.steps=3", "finetune.steps=3"))
    check_fsdp_matches_ddp(fsdp, ddp, 3)
    check_fsdp_matches_ddp(fsdp / "finetune", ddp / "finetune", 3)  # the classifier, rebuilt whole after sharding
    assert zoo.load(next(fsdp.rglob("*.safetensors"))).spec.family == "encoder"
