"""``zoo average``: the mean of training checkpoints or zoo files, written with its spec."""

from __future__ import annotations

import torch

import zoo
from zoo.cli import main
from zoo.train import save_checkpoint

from conftest import tiny_spec


def _models(n: int):
    spec = tiny_spec("encoder_decoder")
    return spec, [zoo.build(spec, seed=i) for i in range(n)]


def _mean(models, name):
    return torch.stack([m.state_dict()[name].double() for m in models]).mean(0).float()


def test_average_training_checkpoints(tmp_path, capsys):
    spec, models = _models(3)
    paths = []
    for i, m in enumerate(models):
        paths.append(save_checkpoint(tmp_path / f"ckpt-{i}.pt", model=m, step=i,
                                     state={"spec": spec.model_dump(mode="json")}))
    out = tmp_path / "avg.safetensors"
    assert main(["average", *map(str, paths), "-o", str(out)]) == 0
    assert "the mean of 3 checkpoints" in capsys.readouterr().out
    avg = zoo.load(out)
    assert avg.spec == spec
    for name, t in avg.state_dict().items():
        if t.is_floating_point():
            torch.testing.assert_close(t, _mean(models, name), rtol=0, atol=1e-7)
    # tied three ways stays tied
    assert avg.head.weight is avg.tgt_emb.weight and avg.src_emb is avg.tgt_emb


def test_average_zoo_files_and_a_given_spec(tmp_path, capsys):
    spec, models = _models(2)
    files = [zoo.save(m, tmp_path / f"m{i}.safetensors") for i, m in enumerate(models)]
    out = tmp_path / "avg.safetensors"
    assert main(["average", *map(str, files), "-o", str(out), "--dtype", "bf16"]) == 0
    avg = zoo.load(out)
    assert avg.tgt_emb.weight.dtype == torch.bfloat16
    torch.testing.assert_close(avg.tgt_emb.weight.float(), _mean(models, "tgt_emb.weight").bfloat16().float())
    # a checkpoint without a recorded spec needs --spec
    bare = save_checkpoint(tmp_path / "bare.pt", model=models[0], step=0)
    assert main(["average", str(bare), str(files[1]), "-o", str(tmp_path / "x.safetensors"), "--spec", str(files[0])]) == 0
    capsys.readouterr()
    assert main(["average", str(bare), "-o", str(tmp_path / "y.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zoo: error: ") and "records no model spec; give one with --spec" in err and err.count("\n") == 1


def test_average_errors_are_one_line(tmp_path, capsys):
    spec, models = _models(1)
    f = zoo.save(models[0], tmp_path / "m.safetensors")
    other = zoo.save(zoo.build(tiny_spec("encoder_decoder", ["d_model=64"])), tmp_path / "o.safetensors")
    for argv, needle in (
        (["average", str(tmp_path / "missing.pt"), "-o", str(tmp_path / "a.safetensors")], "no such file"),
        (["average", str(f), str(other), "-o", str(tmp_path / "a.safetensors")], "shapes differ between checkpoints"),
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
