"""Training at scale, in one process: activation checkpointing against plain backward, the memory
plan against a hand computation, sharded (DCP) checkpoints (written, found, averaged, resumed
exactly), a checkpoint of another model named, and the CPU kernels never chosen for CUDA tensors.
The multi-process runs (FSDP over gloo) are in tests/test_scale_torchrun.py."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.components.parts import saved_per_token  # noqa: F401 (the summary reads parts' declarations)
from zoo.summary import activation_bytes, summarize, training_memory
from zoo.train import (CheckpointError, Dist, ListTask, OptimConfig, RunConfig, ScheduleConfig, average_checkpoints,
                       fit, latest_checkpoint, list_checkpoints, read_metrics, read_train_state, resolve_resume,
                       save_sharded_checkpoint, set_activation_checkpointing)
from zoo.train.config import ConfigError, load_config

TINY = {
    "decoder": ["d_model=32", "n_layers=3", "block.attention.n_heads=2", "vocab_size=61", "max_seq_len=16"],
    "encoder": ["d_model=32", "n_layers=2", "block.attention.n_heads=2", "vocab_size=61", "max_seq_len=16"],
    "encoder_decoder": ["d_model=32", "n_layers=2", "block.attention.n_heads=2", "block.ffn.hidden=48",
                        "vocab_size=61", "max_seq_len=16"],
    "vit": ["d_model=32", "n_layers=2", "block.attention.n_heads=2", "image_size=16", "patch_size=4", "head.num_classes=5"],
}
PRESET = {"decoder": "gpt2-small", "encoder": "bert-mini", "encoder_decoder": "transformer-base", "vit": "vit-tiny-16"}


def tiny(family: str, *extra: str):
    return zoo.load_spec(PRESET[family], TINY[family] + list(extra))


def loss_of(model, family: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if family == "vit":
        return F.cross_entropy(model(torch.randn(3, 3, 16, 16, generator=g)), torch.tensor([0, 1, 4]))
    tokens = torch.randint(0, 61, (3, 12), generator=g)
    if family == "encoder_decoder":
        logits = model(tokens, tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    return F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())


@pytest.mark.parametrize("family", list(TINY))
def test_activation_checkpointing_gives_the_same_gradients_and_keeps_less(family):
    spec = tiny(family, "dropout.residual=0.2", "dropout.attention=0.1", "dropout.ffn=0.1")
    grads, saved = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = zoo.build(spec).train()
        if checkpointing:
            assert set_activation_checkpointing(model) == spec.n_layers * (2 if family == "encoder_decoder" else 1)
        kept = []
        torch.manual_seed(1)  # the same dropout masks, which the recompute must replay
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel() * t.element_size()) or t, lambda t: t):
            loss = loss_of(model, family)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        saved.append(sum(kept))
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-6, msg=name)
    assert saved[1] < 0.7 * saved[0], saved


def test_checkpointing_needs_zoo_stacks():
    with pytest.raises(ValueError, match="run.activation_checkpointing"):
        set_activation_checkpointing(torch.nn.Linear(2, 2))


def test_training_memory_against_a_hand_computation():
    spec = tiny("decoder")
    n = zoo.count_parameters(zoo.build(spec, device="meta"))
    block = zoo.count_parameters(zoo.build(spec, device="meta").stack.blocks[0])
    root = n - spec.n_layers * block
    one = training_memory(spec, seq=16)
    assert (one.parameters, one.gradients, one.optimizer, one.gathered) == (4 * n, 4 * n, 8 * n, 0)
    ddp = training_memory(spec, processes=2, seq=16)
    assert ddp.gradients == 8 * n and ddp.parameters == 4 * n  # DDP's buckets beside the gradients
    fsdp = training_memory(spec, processes=2, strategy="fsdp", seq=16)
    half = math.ceil(n / 2)
    assert (fsdp.parameters, fsdp.gradients, fsdp.optimizer) == (4 * half, 4 * half, 8 * half)
    assert fsdp.gathered == 4 * (root + 2 * block) + 4 * block
    shared = training_memory(tiny("decoder", "shared_layers=1"), processes=2, strategy="fsdp", seq=16)  # one block, once
    assert shared.parameters == 4 * math.ceil((root + block) / 2) and shared.gathered == 4 * (root + block) + 4 * block
    assert fsdp.activations == ddp.activations == summarize(spec, seq=16).activation_bytes
    # checkpointing keeps each block's input (B x T x D) and one block's activations; one block's
    # activations are what one more layer adds
    full = activation_bytes(zoo.build(spec, device="meta"), batch=2, seq=16, bytes_per_element=4)
    one_block = full - activation_bytes(zoo.build(tiny("decoder", "n_layers=2"), device="meta"), batch=2, seq=16,
                                        bytes_per_element=4)
    ckpt = training_memory(spec, seq=16, batch=2, checkpointing=True).activations
    assert ckpt == full - 3 * one_block + 3 * (2 * 16 * 32 * 4) + one_block
    assert ckpt < full
    with pytest.raises(ValueError, match="--shard"):
        training_memory(spec, processes=0)


def test_summary_shard_on_the_command_line(capsys):
    from zoo.cli import main

    assert main(["summary", "gpt2-small", "--seq", "1024", "--shard", "2", "--strategy", "fsdp", "--checkpointing",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["training_memory"]
    assert plan["processes"] == 2 and plan["strategy"] == "fsdp" and plan["checkpointing"]
    ddp = training_memory(zoo.load_spec("gpt2-small"), processes=2, seq=1024)
    # weights + gradients + AdamW state per process: about half of ddp's (without ddp's buckets: exactly)
    assert abs((plan["parameters"] + plan["optimizer"]) / (ddp.parameters + ddp.optimizer) - 0.5) < 1e-6
    assert main(["summary", "gpt2-small", "--shard", "2"]) == 0
    assert "training memory per process: ddp on 2 processes" in capsys.readouterr().out


def test_offload_needs_fsdp():
    with pytest.raises(ConfigError, match="run.offload"):
        load_config(type("C", (zoo.train.Config,), {"__annotations__": {"run": RunConfig}}), None, ["run.offload=true"])


# ------------------------------------------------------------------------ sharded checkpoints
class Tokens(ListTask):
    """Next-token prediction on fixed random sequences; a micro-batch is a row range."""

    name = "tokens"

    def __init__(self) -> None:
        super().__init__(Dist(), 1)
        self.data = torch.randint(0, 61, (24, 12), generator=torch.Generator().manual_seed(0))

    def batches(self, epoch):
        order = torch.randperm(24, generator=torch.Generator().manual_seed(epoch)).tolist()
        return [order[i : i + 4] for i in range(0, 24, 4)]

    def loss(self, model, batch, step):
        x = self.data[batch]
        return F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()), {}

    def evaluate(self, model):
        return {"loss": float(self.loss(model, list(range(24)), 0)[0])}


def cfg(out, **run) -> dict:
    """fit's configs and its (single-process) Dist."""
    return dict(optim=OptimConfig(lr=3e-3), schedule=ScheduleConfig(kind="cosine", warmup=2), dist=Dist(),
                run=RunConfig(out_dir=out, plot=False, progress=False, log_every=1, **run))


def losses(out):
    return [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl") if r["split"] == "train"]


def model(spec=None):
    torch.manual_seed(0)
    return zoo.build(spec or tiny("decoder", "dropout.residual=0.1"))


@pytest.mark.slow
def test_fsdp_alone_writes_sharded_checkpoints_that_resume_exactly(tmp_path):
    run = dict(strategy="fsdp", checkpoint_every=4, keep_checkpoints=3, ema=0.9, activation_checkpointing=True)
    whole = fit(model(), Tokens(), **cfg(tmp_path / "whole", **run), total_steps=10)
    found = list_checkpoints(tmp_path / "whole")
    assert [p.name for p in found] == ["ckpt-0000004.dcp", "ckpt-0000008.dcp", "ckpt-0000010.dcp"]
    assert all(p.is_dir() for p in found)
    part = tmp_path / "part"
    part.mkdir()
    shutil.copytree(found[0], part / found[0].name)
    (part / "metrics.jsonl").write_text("".join(line for line in (tmp_path / "whole" / "metrics.jsonl").open()
                                               if json.loads(line)["step"] <= 4))
    resumed = fit(model(), Tokens(), **cfg(part, **run), total_steps=10, resume=part / found[0].name)
    assert losses(part) == losses(tmp_path / "whole")
    for a, b in zip(resumed.model.parameters(), whole.model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(resumed.ema.parameters(), whole.ema.parameters()):
        assert torch.equal(a, b)
    # the same checkpoint resumes a ddp run (one file from then on)
    fit(model(), Tokens(), **cfg(tmp_path / "ddp", ema=0.9), total_steps=10, resume=found[0])
    assert losses(tmp_path / "ddp")[-6:] == losses(tmp_path / "whole")[-6:]


def test_half_written_sharded_checkpoints_are_never_resumed(tmp_path):
    fit(model(), Tokens(), **cfg(tmp_path, strategy="fsdp", checkpoint_every=3), total_steps=3)
    good = latest_checkpoint(tmp_path)
    shutil.copytree(good, tmp_path / "ckpt-0000009.dcp.tmp")  # killed before the rename: no checkpoint
    assert list_checkpoints(tmp_path) == [good] and resolve_resume("latest", tmp_path) == good
    (tmp_path / "ckpt-0000012.dcp").mkdir()  # damaged after the fact: refused by name, never skipped
    shutil.copytree(good, tmp_path / "ckpt-0000015.dcp")
    (tmp_path / "ckpt-0000015.dcp" / ".metadata").unlink()
    with pytest.raises(CheckpointError) as e:
        resolve_resume("latest", tmp_path)
    assert str(e.value) == (f"--resume: cannot read the newest checkpoint, {tmp_path / 'ckpt-0000015.dcp'}: it is "
                            f"incomplete: no .metadata in the folder; delete it, or resume from the newest whole one: "
                            f"--resume {good}")


def test_averaging_sharded_checkpoints(tmp_path):
    a, b = model(), model(tiny("decoder"))
    with torch.no_grad():
        for p in b.parameters():
            p.add_(1.0)
    for name, m in (("ckpt-0000001.dcp", a), ("ckpt-0000002.dcp", b)):
        save_sharded_checkpoint(tmp_path / name, model=m, optimizer=None, scheduler=None, step=1, state={},
                                config=None, ema=None, dist=Dist())
    averaged = average_checkpoints(list_checkpoints(tmp_path))
    for name, p in a.state_dict().items():
        torch.testing.assert_close(averaged[name], (p + b.state_dict()[name]) / 2)


def test_resuming_another_model_names_what_differs(tmp_path):
    config = {"model": "gpt2-small", "model_overrides": TINY["decoder"], "run": {"seed": 0}}
    for strategy in ("ddp", "fsdp"):
        out = tmp_path / strategy
        fit(model(), Tokens(), **cfg(out, strategy=strategy), total_steps=2, config=config)
        other = tiny("decoder", "d_model=48")
        bigger = {**config, "model_overrides": TINY["decoder"] + ["d_model=48"], "run": {"seed": 1}}
        with pytest.raises(CheckpointError) as e:
            fit(model(other), Tokens(), **cfg(out, strategy=strategy), total_steps=4, config=bigger,
                resume=latest_checkpoint(out))
        msg = str(e.value)
        assert "holds another model" in msg and "[61, 32] there, [61, 48] here" in msg, msg
        assert "model_overrides" in msg and "run.seed" not in msg, msg


def test_a_corrupt_train_state_is_a_checkpoint_error(tmp_path):
    fit(model(), Tokens(), **cfg(tmp_path, strategy="fsdp"), total_steps=1)
    ckpt = latest_checkpoint(tmp_path)
    (ckpt / "train_state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="train_state.pt"):
        read_train_state(ckpt)


# ------------------------------------------------------------------------------ CUDA dispatch
def test_cpu_kernels_are_never_chosen_for_cuda_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from zoo.kernels import cpu

    with FakeTensorMode(allow_non_fake_inputs=True):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.empty(64, 512, 768, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.empty(3072, 768, device="cuda", dtype=dtype)
            q = torch.empty(8, 12, 64, 64, device="cuda", dtype=dtype, requires_grad=True)
            assert x.device.type == "cuda"
            assert not cpu.linear.applies(x, w, None)
            assert not cpu.dropout.applies(x, 0.1)
            assert not cpu.attention.applies(q, q, 0.1, None)
            assert not cpu.attention.applies(q, q, 0.0, None)
    # and the same shapes on the CPU do take them (so the test can fail)
    x = torch.empty(64, 512, dtype=torch.float32)
    assert cpu.dropout.applies(x, 0.1)


@pytest.mark.slow
def test_gpu_check_skips_its_cuda_parts_in_one_line_without_a_gpu(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tools/gpu-check runs for real there")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["bash", str(root / "tools" / "gpu-check"), str(tmp_path / "report.md")], cwd=root,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "gpu-check: CUDA is not available here; skipping the GPU tests and the GPU benchmark rows "
        "(run it on a machine with a GPU)"]
