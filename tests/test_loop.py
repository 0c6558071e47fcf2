"""The one training loop (zoo.train.fit) on a toy task, against hand computations and invariants:
loss scaling across micro-batches, exact resume, the time budget, EMA and per-domain rows."""

from __future__ import annotations

import pytest
import torch

import zoo
from torch import nn

import zoo.train.loop
from zoo.train import Dist, ListTask, OptimConfig, RunConfig, ScheduleConfig, Task, TrainError, fit, read_metrics


class Regression(ListTask):
    """Least squares on fixed data; a micro-batch is a list of row indices; ``count`` = rows, so the
    loss is the batch's sum of squared errors."""

    name = "toy"

    def __init__(self, accum: int, batch: int, n: int = 24, by_rows: bool = True, seed: int = 0) -> None:
        super().__init__(Dist(), accum)
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)
        self.batch, self.by_rows = batch, by_rows

    def batches(self, epoch):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(epoch)).tolist()
        return [order[i : i + self.batch] for i in range(0, len(order), self.batch)]

    def count(self, batch):
        return float(len(batch)) if self.by_rows else 1.0

    def loss(self, model, batch, step):
        err = (model(self.x[batch]) - self.y[batch]).pow(2).sum()
        return (err if self.by_rows else err / len(batch)), {"rows": len(batch)}

    def evaluate(self, model):
        mse = float((model(self.x) - self.y).pow(2).mean())
        return {"loss": mse, "half": {"loss": mse / 2}}


def cfg(tmp_path, **run) -> dict:
    """fit's configs and its (single-process) Dist."""
    return dict(optim=OptimConfig(name="adam", lr=0.01, weight_decay=0.0, clip_grad=None),
                schedule=ScheduleConfig(kind="constant", warmup=0), dist=Dist(),
                run=RunConfig(**{"out_dir": tmp_path, "plot": False, "progress": False, "precision": "fp32", **run}))


def model(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(3, 1)


def test_a_step_is_the_mean_over_units_whatever_the_accumulation(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo.train.loop, "build_optimizer", lambda m, c: torch.optim.SGD(m.parameters(), lr=0.1))
    # one SGD step over 24 rows in micro-batches of 6 x 4 equals plain gradient descent on the mean loss
    task = Regression(accum=4, batch=6)
    m = fit(model(), task, **cfg(tmp_path / "a", grad_accum=4), total_steps=1).model
    ref = model()
    rows = [i for b in task.batches(0)[:4] for i in b]
    (ref(task.x[rows]) - task.y[rows]).pow(2).mean().backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # uneven micro-batches (7+7+7+3 rows): weighted by rows, not by batch
    task = Regression(accum=4, batch=7)
    m = fit(model(), task, **cfg(tmp_path / "b", grad_accum=4), total_steps=1).model
    ref = model()
    rows = [i for b in task.batches(0)[:4] for i in b]
    (ref(task.x[rows]) - task.y[rows]).pow(2).mean().backward()
    torch.testing.assert_close(m.weight, ref.weight - 0.1 * ref.weight.grad, rtol=1e-6, atol=1e-7)


def test_train_and_valid_rows(tmp_path):
    fitted = fit(model(), Regression(accum=1, batch=6), **cfg(tmp_path, log_every=2, eval_every=3, ema=0.5),
                 total_steps=6)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4, 6] and all(r["rows_per_s"] > 0 for r in train)
    valid = [r for r in rows if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [3, 6] and {"loss", "ema_loss"} <= set(valid[0])
    half = [r for r in rows if r["split"] == "valid_half"]
    assert [r["step"] for r in half] == [3, 6] and half[-1]["loss"] == pytest.approx(valid[-1]["loss"] / 2)
    assert fitted.valid["loss"] == valid[-1]["loss"] and fitted.best is fitted.ema
    assert fitted.best_valid["loss"] == valid[-1]["ema_loss"]
    # the EMA copy is (1-d) * model + d * previous EMA after every step: differs from the model
    assert not torch.equal(fitted.ema.weight, fitted.model.weight)


def test_resume_continues_exactly(tmp_path):
    c = cfg(tmp_path / "full", log_every=1, checkpoint_every=3, keep_checkpoints=5)
    full = fit(model(), Regression(accum=2, batch=5), **c, total_steps=7)  # 2 steps an epoch: crosses epochs
    part = cfg(tmp_path / "part", log_every=1, checkpoint_every=3, keep_checkpoints=5)
    fit(model(), Regression(accum=2, batch=5), **part, total_steps=7, resume=None)
    ckpt = tmp_path / "part" / "ckpt-0000003.pt"
    resumed = fit(model(seed=1), Regression(accum=2, batch=5), **part, total_steps=7, resume=ckpt)
    assert torch.equal(resumed.model.weight, full.model.weight)
    losses = lambda d: [(r["step"], r["loss"]) for r in read_metrics(d / "metrics.jsonl") if r["split"] == "train"]  # noqa: E731
    assert losses(tmp_path / "part") == losses(tmp_path / "full") and len(losses(tmp_path / "full")) == 7


def test_resume_takes_back_the_kernel_choices_its_run_used(tmp_path, monkeypatch, capsys):
    import time

    from zoo.kernels.cpu import choose

    zoo.kernels.use(cache=str(tmp_path / "kernels.json"))
    slow = {"a": 0.0, "b": 0.02}  # a stand-in clock: kernel "a" measures faster

    class Choosing(Regression):  # the two "kernels" compute different things, so the choice shows
        def loss(self, model, batch, step):
            name = choose.pick("test_op", "loop", {n: (lambda n=n: time.sleep(slow[n])) for n in "ab"})
            err, stats = super().loss(model, batch, step)
            return (err if name == "a" else err + model.weight.pow(2).sum()), stats

    def run(out, seed=0, resume=None):
        c = cfg(tmp_path / out, log_every=1, checkpoint_every=3, keep_checkpoints=5)
        return fit(model(seed), Choosing(accum=2, batch=5), **c, total_steps=7, resume=resume).model.weight

    choose.forget()
    full = run("full")
    ckpt = tmp_path / "full" / "ckpt-0000003.pt"
    # between the run and its resume the machine re-measured: "b" is faster now, and the cache says so
    slow.update(a=0.02, b=0.0)
    choose.forget()
    (tmp_path / "kernels.json").unlink()
    assert torch.equal(run("resumed", seed=1, resume=ckpt), full)  # the run's own choice, from its checkpoint
    choose.forget()
    assert not torch.equal(run("fresh"), full)  # a new run measures afresh and picks "b": the choice matters
    # a checkpoint written on another machine: this machine's choices, said so
    monkeypatch.setattr(choose, "machine", lambda: "another CPU")
    choose.forget()
    capsys.readouterr()
    assert not torch.equal(run("moved", seed=1, resume=ckpt), full)
    assert "written on another machine: CPU kernel choices are this machine's own" in capsys.readouterr().out
    choose.forget()


def test_time_budget_stops_early_and_is_saved(tmp_path):
    class Slow(Regression):
        def loss(self, model, batch, step):
            import time

            time.sleep(0.05)
            return super().loss(model, batch, step)

    # one row a step, so an epoch of 24 steps outlasts the budget: the loop must stop inside the epoch
    fitted = fit(model(), Slow(accum=1, batch=1), **cfg(tmp_path), total_steps=1000, minutes=0.2 / 60)
    assert fitted.stopped_early and 1 <= fitted.step < 10 and fitted.elapsed >= 0.2
    assert [p.name for p in tmp_path.glob("ckpt-*.pt")] == [f"ckpt-{fitted.step:07d}.pt"]  # the last step, once
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if r["split"] == "valid"] == [fitted.step]  # evaluated once, at the stop
    assert fitted.valid


def test_a_task_must_say_its_steps(tmp_path):
    class Empty(Task):
        def steps(self, epoch):
            return 0

    with pytest.raises(TrainError, match="no full optimizer step"):
        fit(model(), Empty(), **cfg(tmp_path), total_steps=1)


def test_settings_the_run_cannot_take_are_train_errors(tmp_path):
    task = Regression(accum=1, batch=6)
    with pytest.raises(TrainError, match="run.activation_checkpointing: Linear has no zoo block stack"):
        fit(model(), task, **cfg(tmp_path, activation_checkpointing=True), total_steps=1)
    with pytest.raises(TrainError, match="optim.weight_decay: Adam adds decay"):
        fit(model(), task, **{**cfg(tmp_path), "optim": OptimConfig(name="adam", weight_decay=0.1)}, total_steps=1)
    with pytest.raises(TrainError, match=r"inverse_sqrt needs d_model .*fit\(d_model=...\)"):
        fit(model(), task, **{**cfg(tmp_path), "schedule": ScheduleConfig(kind="inverse_sqrt", warmup=4)}, total_steps=1)
    with pytest.raises(TrainError, match="no checkpoint at"):  # a CheckpointError is a TrainError
        fit(model(), task, **cfg(tmp_path), total_steps=1, resume=tmp_path / "ckpt-0000009.pt")


def test_the_documented_task_trains(tmp_path, monkeypatch):
    # docs/training.md's example runs as written (tests/test_doc_blocks.py) and learns the least-squares fit
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "docs_training"}
    exec(compile(code, "docs/training.md", "exec"), scope)
    fitted = scope["fitted"]
    assert fitted.step == 60
    first = [r for r in read_metrics(tmp_path / scope["OUT"] / "metrics.jsonl") if r["split"] == "valid"][0]
    assert fitted.valid["mse"] < first["mse"] / 4  # it learns


def test_resume_with_another_grad_accum_continues_after_the_micro_batches_taken(tmp_path, capsys):
    """Steps of 2 micro-batches x 3: the checkpoint at step 3 of epoch 0 took micro-batches 0-5; with
    grad_accum 3 the run goes on at step 2 of 3 (micro-batch 6), with grad_accum 1 at step 6, and one
    with 4 (6 is no whole number of its steps) is refused, and so are micro-batches of another size.
    The epoch's list of micro-batches is the truth."""
    taken = []

    class Logged(Regression):
        def loss(self, model, batch, step):
            taken.append(tuple(batch))
            return super().loss(model, batch, step)

    part = cfg(tmp_path / "part", grad_accum=2, checkpoint_every=3, keep_checkpoints=5)
    fit(model(), Regression(accum=2, batch=2), **part, total_steps=3)  # 12 micro-batches an epoch: 6 steps
    ckpt = tmp_path / "part" / "ckpt-0000003.pt"
    epoch = Regression(accum=1, batch=2).batches(0)
    for accum, first in ((3, 6), (1, 6)):
        taken.clear()
        fit(model(), Logged(accum=accum, batch=2), **cfg(tmp_path / f"a{accum}", grad_accum=accum), total_steps=4, resume=ckpt)
        assert taken == [tuple(b) for b in epoch[first:first + accum]]  # step 4: the next step's micro-batches
        assert f"resuming a run of 1 process(es) x grad_accum 2 on 1 x {accum}" in capsys.readouterr().out
    with pytest.raises(TrainError, match=r"run.grad_accum: the checkpoint stopped inside epoch 0 after 6 micro-batches "
                                         r"\(3 steps of 1 process\(es\) x grad_accum 2\), not a whole number of this run's steps of 1 x 4"):
        fit(model(), Regression(accum=4, batch=2), **cfg(tmp_path / "a4", grad_accum=4), total_steps=4, resume=ckpt)
    with pytest.raises(TrainError, match="epoch 0 had 12 micro-batches when the checkpoint was written, 8 now"):
        fit(model(), Regression(accum=2, batch=3), **cfg(tmp_path / "b3", grad_accum=2), total_steps=4, resume=ckpt)
