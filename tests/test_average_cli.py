"""``zoo average``: the mean of training checkpoints (as ``fit`` writes them: ``.pt`` files and sharded
``.dcp`` folders, each carrying the model's spec) or zoo files, written as a zoo file."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.cli import main
from zoo.train import (Dist, ListTask, OptimConfig, RunConfig, ScheduleConfig, checkpoint_spec, fit, list_checkpoints,
                       load_checkpoint, read_train_state, save_checkpoint)

from conftest import tiny_spec


class Copy(ListTask):
    """Learn to copy random token sequences: enough to move every weight between checkpoints."""

    def __init__(self, vocab: int) -> None:
        super().__init__(Dist(), 1)
        self.data = torch.randint(1, vocab, (16, 6), generator=torch.Generator().manual_seed(0))

    def batches(self, epoch):
        return [list(range(i, i + 4)) for i in range(0, 16, 4)]

    def loss(self, model, batch, step):
        x = self.data[batch]
        return F.cross_entropy(model(x, x).flatten(0, 1), x.flatten()), {}

    def evaluate(self, model):
        return {"loss": float(self.loss(model, list(range(16)), 0)[0])}


def train(out, model: nn.Module, strategy: str = "ddp") -> list:
    """Four steps of ``fit``, a checkpoint after each (the newest three kept); the checkpoints."""
    run = RunConfig(out_dir=out, strategy=strategy, checkpoint_every=1, keep_checkpoints=3, plot=False, progress=False)
    fit(model, Copy(61), optim=OptimConfig(lr=1e-2), schedule=ScheduleConfig(kind="constant"), run=run, dist=Dist(),
        total_steps=4)
    return list_checkpoints(out)


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return zoo.build(tiny_spec("encoder_decoder", ["vocab_size=61", "dropout.residual=0.0"]), seed=seed)


def test_average_what_fit_wrote_pt_and_dcp_alike(tmp_path, capsys):
    files, folders = train(tmp_path / "ddp", model()), train(tmp_path / "fsdp", model(), "fsdp")
    capsys.readouterr()  # the training's progress lines
    assert [p.name for p in files] == ["ckpt-0000002.pt", "ckpt-0000003.pt", "ckpt-0000004.pt"]
    assert [p.name for p in folders] == ["ckpt-0000002.dcp", "ckpt-0000003.dcp", "ckpt-0000004.dcp"]
    # the mean of the checkpoints' weights, by hand from the files
    saved = [load_checkpoint(p)["model"] for p in files]
    mean = {k: torch.stack([s[k].double() for s in saved]).mean(0).float() for k in saved[0]}
    assert not torch.equal(saved[0]["tgt_emb.weight"], saved[2]["tgt_emb.weight"])  # the weights moved
    # each records the spec of the model it was written for, the file in itself, the folder in its train state
    spec = model().spec.model_dump(mode="json")
    assert load_checkpoint(files[0])["spec"] == read_train_state(folders[0])["spec"] == spec
    assert checkpoint_spec(files[0]) == checkpoint_spec(folders[0]) == spec
    for ckpts, name in ((files, "pt"), (folders, "dcp")):
        out = tmp_path / f"avg-{name}.safetensors"
        assert main(["average", *map(str, ckpts), "-o", str(out)]) == 0
        assert "the mean of 3 checkpoints" in capsys.readouterr().out
        avg = zoo.load(out)  # rebuilt from the file alone: the spec came from the checkpoints
        assert avg.spec == model().spec
        for k, t in avg.state_dict().items():
            torch.testing.assert_close(t, mean[k], rtol=0, atol=1e-6, msg=f"{name}: {k}")
        assert avg.head.weight is avg.tgt_emb.weight and avg.src_emb is avg.tgt_emb  # tied three ways stays tied


def test_a_checkpoint_of_a_wrapped_model_records_no_spec(tmp_path, capsys):
    class Wrapped(nn.Module):  # a zoo model inside another module, as the MLM recipe's classifier
        def __init__(self) -> None:
            super().__init__()
            self.inner = model()

        def forward(self, src, tgt):
            return self.inner(src, tgt)

    (ckpt, *_) = train(tmp_path, Wrapped())
    assert "spec" not in load_checkpoint(ckpt)
    capsys.readouterr()  # the training's progress lines
    assert main(["average", str(ckpt), "-o", str(tmp_path / "a.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zoo: error: ") and err.count("\n") == 1
    assert "records no model spec (its model was not a zoo model" in err and "give one with --spec" in err
    # --spec names the model, but the wrapper's tensors are the inner model's under other names
    assert main(["average", str(ckpt), "-o", str(tmp_path / "a.safetensors"), "--spec", "transformer-base"]) == 2
    err = capsys.readouterr().err
    assert "does not fit the spec" in err and "unexpected ['inner." in err and err.count("\n") == 1


def _models(n: int):
    spec = tiny_spec("encoder_decoder")
    return spec, [zoo.build(spec, seed=i) for i in range(n)]


def _mean(models, name):
    return torch.stack([m.state_dict()[name].double() for m in models]).mean(0).float()


def test_average_zoo_files_and_a_given_spec(tmp_path, capsys):
    spec, models = _models(2)
    files = [zoo.save(m, tmp_path / f"m{i}.safetensors") for i, m in enumerate(models)]
    out = tmp_path / "avg.safetensors"
    assert main(["average", *map(str, files), "-o", str(out), "--dtype", "bf16"]) == 0
    avg = zoo.load(out)
    assert avg.tgt_emb.weight.dtype == torch.bfloat16
    torch.testing.assert_close(avg.tgt_emb.weight.float(), _mean(models, "tgt_emb.weight").bfloat16().float())
    # a training checkpoint beside a zoo file, the spec from --spec
    bare = save_checkpoint(tmp_path / "bare.pt", model=models[0], step=0)
    assert main(["average", str(bare), str(files[1]), "-o", str(tmp_path / "x.safetensors"), "--spec", str(files[0])]) == 0
    torch.testing.assert_close(zoo.load(tmp_path / "x.safetensors").tgt_emb.weight, _mean(models, "tgt_emb.weight"))


def test_average_errors_are_one_line(tmp_path, capsys):
    spec, models = _models(1)
    f = zoo.save(models[0], tmp_path / "m.safetensors")
    other = zoo.save(zoo.build(tiny_spec("encoder_decoder", ["d_model=64"])), tmp_path / "o.safetensors")
    fewer = zoo.save(zoo.build(tiny_spec("encoder_decoder", ["n_layers=1"])), tmp_path / "fewer.safetensors")
    for argv, needle in (
        (["average", str(tmp_path / "missing.pt"), "-o", str(tmp_path / "a.safetensors")], "no such file"),
        (["average", str(f), str(other), "-o", str(tmp_path / "a.safetensors")], "shapes differ between checkpoints"),
        (["average", str(f), str(fewer), "-o", str(tmp_path / "a.safetensors")], f"{fewer} holds other tensors than {f}"),
        (["average", str(f), "-o", str(tmp_path / "nodir" / "a.safetensors")], "no directory"),
        (["average", str(f)], "-o/--output"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert main(["average", str(tmp_path / "junk.pt"), "-o", str(tmp_path / "a.safetensors")]) == 2
    assert "cannot read checkpoint" in capsys.readouterr().err
    assert main(["average", "--help"]) == 0
    assert "training checkpoints" in capsys.readouterr().out


def test_integer_buffers_are_the_last_checkpoints(tmp_path, capsys):
    """A ViT with a conv stem (BatchNorm's num_batches_tracked counts steps): averaged floats, the
    last file's counters, as timm's avg_checkpoints and torch's swa_utils keep them."""
    spec = tiny_spec("vit", ["stem={channels: [8]}"])
    files = []
    for i in range(3):
        m = zoo.build(spec, seed=i).train()
        for _ in range(i + 1):  # i + 1 batches counted
            m(torch.randn(2, 3, 16, 16))
        files.append(zoo.save(m, tmp_path / f"m{i}.safetensors"))
    out = tmp_path / "avg.safetensors"
    assert main(["average", *map(str, files), "-o", str(out)]) == 0
    assert "integer tensor(s)" in capsys.readouterr().out
    avg, states = zoo.load(out).state_dict(), [zoo.load(f).state_dict() for f in files]
    counters = [k for k, t in avg.items() if not t.is_floating_point()]
    assert counters and all(k.endswith("num_batches_tracked") for k in counters)
    for k, t in avg.items():
        if t.is_floating_point():
            torch.testing.assert_close(t, sum(s[k].double() for s in states).div(3).to(t.dtype))
        else:
            assert torch.equal(t, states[-1][k]) and int(t) == 3
