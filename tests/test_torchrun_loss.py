"""The train loss logged under torchrun is the mean over the whole global batch, and a step's gradient
is the same on two gloo processes as on one process over the same data, with run.strategy ddp and fsdp.

Two processes with ``run.grad_accum=1`` and one process with ``run.grad_accum=2`` see the same
micro-batches in each step (the lm recipe's list of blocks, the ViT recipe's sampler order), so their
metrics.jsonl agree to float rounding. The lm runs' second layer is a mixture of experts with every
router option on (load-balancing and z losses, capacity dropping, the experts' bias update), so its
router losses, token counts and bias updates are checked to add up over processes and micro-batches
as one process's do. Run as a script (under torchrun), this file trains a toy
regression for one SGD step and writes its weights and logged loss for the test to check by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from conftest import launch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.torchrun
STRATEGIES = ["ddp", "fsdp"]


def rows(out: Path, split: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def losses(out: Path, split: str = "train") -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in rows(out, split)]


def assert_same_losses(a: Path, b: Path, rel: float) -> None:
    x, y = losses(a), losses(b)
    assert [s for s, _ in x] == [s for s, _ in y] and x, (x, y)
    for (_, p), (_, q) in zip(x, y):
        assert abs(p - q) <= rel * abs(q), (x, y)


# ------------------------------------------------------------------------ the lm recipe
@pytest.fixture(scope="module")
def wordnet(tmp_path_factory) -> Path:
    from test_lm_recipes import fake_wordnet

    return fake_wordnet(tmp_path_factory.mktemp("wordnet"))


# layer 1 of the tiny lm model: a mixture of experts with every router option on
MOE_LAYER = ("'layers=[{at: 1, block: {ffn: {kind: moe, n_experts: 3, top_k: 2, expert: {kind: swiglu, hidden: 24}, "
             "capacity_factor: 1.0, router: {z_loss_coef: 0.001, bias_update: 0.001}}}}]'")
LM_MODEL = ("model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=2,block.attention.n_kv_heads=1,block.ffn.hidden=64,"
            f"{MOE_LAYER}]")


def lm_args(wordnet: Path, out: Path, *extra: str) -> list[str]:
    return [f"data.wordnet_dir={wordnet}", "data.vocab_size=300", "data.valid_fraction=0.1", f"run.out_dir={out}", LM_MODEL,
            "train.batch_size=4", "train.block_len=16", "train.steps=4", "schedule.warmup=2", "run.log_every=1",
            "run.eval_every=1000", "run.checkpoint_every=2", "run.keep_checkpoints=10", "run.progress=false",
            "run.plot=false", "run.threads=1", "run.precision=fp32", "sample.max_new_tokens=2", "sample.prompts=[a]", *extra]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lm_train_loss_on_two_processes_is_the_one_process_loss(wordnet, tmp_path, strategy):
    from zoo.io import load

    two, one = tmp_path / "two", tmp_path / "one"
    lm = ROOT / "recipes" / "lm.py"
    out = launch(lm, lm_args(wordnet, two, f"run.strategy={strategy}"), processes=2).stdout
    launch(lm, lm_args(wordnet, one, f"run.strategy={strategy}", "run.grad_accum=2"), processes=1)
    # the recipe under torchrun: data sharded, losses all-reduced, one report, rank 0 exports
    assert "2 process(es)" in out and out.count("vs unigram") == 1
    assert load(two / "model" / "model.safetensors").spec.family == "decoder"
    assert_same_losses(two, one, rel=1e-5)  # the same blocks in each step: only float rounding differs
    assert rows(two)[0]["tokens_per_s"] > 0
    for a, b in zip(rows(two), rows(one)):  # the router's losses are the micro-batches' mean, as the task's
        assert a["aux_loss"] == pytest.approx(b["aux_loss"], rel=1e-5) and a["z_loss"] == pytest.approx(b["z_loss"], rel=1e-5)
        assert a["dropped_tokens"] == b["dropped_tokens"]
    assert rows(two, "experts") == rows(one, "experts") and len(rows(one, "experts")) == 4  # the same tokens per expert
    assert [v for _, v in losses(two, "valid")] == pytest.approx([v for _, v in losses(one, "valid")], rel=1e-5)
    # and the same gradients: the exported weights (the experts' biases too) agree after 4 AdamW steps with clipping (fp32)
    a, b = load(two / "model" / "model.safetensors").state_dict(), load(one / "model" / "model.safetensors").state_dict()
    assert b["stack.blocks.1.ffn.expert_bias"].abs().sum() > 0 and any(r["dropped_tokens"] for r in rows(one))
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    if strategy == "fsdp":  # the two-process sharded checkpoint resumes on one process with its loss's scale
        resumed = tmp_path / "resumed"
        resumed.mkdir()
        (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(two) if r["step"] <= 2))
        (resumed / "tokenizer.json").write_bytes((two / "tokenizer.json").read_bytes())
        launch(lm, lm_args(wordnet, resumed, f"run.strategy={strategy}") + ["--resume", str(two / "ckpt-0000002.dcp")],
               processes=1)
        after, before = losses(resumed)[2], losses(two)[2]
        assert after[0] == before[0] == 3 and abs(after[1] / before[1] - 1) < 0.1, (losses(resumed), losses(two))


# ------------------------------------------------------------------------- the ViT recipe
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_vit_train_loss_on_two_processes_is_the_one_process_loss(tmp_path, strategy):
    from test_imagenet_recipe import HAVE_FMNIST

    if not HAVE_FMNIST:
        pytest.skip("dataset-fashion-mnist is not installed")
    args = ["data.train_limit=128", "data.valid_limit=32", "data.batch_size=32", "data.flip=false", "train.max_steps=2",
            "run.log_every=1", "run.threads=1", "run.plot=false", "run.ema=null", "run.precision=fp32", f"run.strategy={strategy}",
            "model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=2,block.ffn.hidden=64]", "schedule.warmup=2"]
    two, one = tmp_path / "two", tmp_path / "one"
    vit = ROOT / "recipes" / "imagenet.py"
    launch(vit, [f"run.out_dir={two}", *args], processes=2)
    launch(vit, [f"run.out_dir={one}", "run.grad_accum=2", *args], processes=1)
    # the sampler's order gives each step the same 32 images, grouped otherwise into micro-batches: the
    # stem's BatchNorm normalises each micro-batch by its own statistics, so the losses differ a little
    assert_same_losses(two, one, rel=0.02)


# ------------------------------------------------ one SGD step against a hand computation
class Net(nn.Sequential):
    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))

    def rebuild(self) -> Net:  # what fsdp's gathered() makes the whole copy from
        return Net()


def regression(n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)


def one_sgd_step(out: Path, strategy: str) -> None:
    """One step of SGD (lr 0.1) over 10 rows in micro-batches of 7 and 3 (one a process, or both on one
    process), the loss summed over rows (``count`` = rows); rank 0 saves the weights."""
    import zoo.train.loop
    from zoo.train import ListTask, OptimConfig, RunConfig, ScheduleConfig, distributed, fit

    x, y = regression()

    class Rows(ListTask):
        def batches(self, epoch):
            return [list(range(7)), list(range(7, 10))]

        def count(self, batch):
            return float(len(batch))

        def loss(self, model, batch, step):
            return (model(x[batch]) - y[batch]).pow(2).sum(), {"rows": len(batch)}

        def evaluate(self, model):
            return {"loss": float((model(x) - y).pow(2).mean())}

    zoo.train.loop.build_optimizer = lambda model, cfg: torch.optim.SGD(model.parameters(), lr=0.1)
    with distributed("cpu") as dist:
        run = RunConfig(out_dir=out, strategy=strategy, precision="fp32", plot=False,
                        progress=False, log_every=1)
        fitted = fit(Net(), Rows(dist, 1), optim=OptimConfig(clip_grad=None),
                     schedule=ScheduleConfig(kind="constant"), run=run, dist=dist, total_steps=1)
        if dist.is_main:
            torch.save(fitted.model.state_dict(), out / "weights.pt")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_step_on_two_processes_is_gradient_descent_on_the_global_mean(tmp_path, strategy):
    launch(Path(__file__), [str(tmp_path), strategy], processes=2)
    x, y = regression()
    ref = Net()
    loss = (ref(x) - y).pow(2).mean()
    loss.backward()
    assert losses(tmp_path) == [(1, pytest.approx(float(loss.detach()), rel=1e-6))]  # the mean over all 10 rows
    assert rows(tmp_path)[0]["rows_per_s"] > 0
    got = torch.load(tmp_path / "weights.pt")
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.detach() - 0.1 * p.grad, rtol=1e-5, atol=1e-6, msg=name)


if __name__ == "__main__":
    one_sgd_step(Path(sys.argv[1]), sys.argv[2])
