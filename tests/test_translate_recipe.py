"""The translation recipe end to end on a slice of the default data: trains, averages, decodes,
scores, exports, reloads, translates; resumes exactly; runs under torchrun with gloo."""

from __future__ import annotations

import importlib.util
import io
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import DE_NOUNS, NOUNS, messages, write_catalog
from translate_data import word_dropout  # recipes/, on pytest's path

import zoo
from zoo.data import bpe
from zoo.data import corpus as C
from zoo.data import translation as T
from zoo.cli import main as zoo_main
from zoo.train import list_checkpoints, load_checkpoint, read_metrics

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "translate.py"

pytestmark = pytest.mark.skipif(not T.DING_PATH.is_file(), reason=T.INSTALL_HINT)


def _recipe():
    spec = importlib.util.spec_from_file_location("translate_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the config's annotations through it
    spec.loader.exec_module(module)
    return module


recipe = _recipe()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A slice of the embedded Ding default as TSV files (read once: parsing the dictionary takes seconds)."""
    root = tmp_path_factory.mktemp("ding")
    splits, _ = T.ding_splits(direction="en-de")
    for name, n in (("train", 400), ("valid", 24), ("test", 24)):
        p = splits[name]
        (root / f"{name}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(p.src[:n], p.tgt[:n])), encoding="utf-8")
    return root


def tiny(data: Path, out: Path, *extra: str, model: str = "") -> list[str]:
    return [
        f"data.path={data}", "data.vocab_size=400", f"run.out_dir={out}",
        f"model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=4,block.ffn.hidden=64{model}]",
        "train.max_tokens=600", "train.minutes=null", "train.average_last=2", "schedule.warmup=10", "optim.lr=2.0",
        "run.log_every=2", "run.eval_every=4", "run.checkpoint_every=4", "run.progress=false", "run.plot=false",
        "decode.beams=2", "decode.max_len_b=10", "decode.samples=2", "decode.final_splits=[valid,test]",
        "decode.score_last=true", *extra,
    ]


@pytest.mark.recipe
def test_trains_scores_exports_and_translates(data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    # as the default keeps the checkpoints it averages (5), this run keeps its 2
    assert recipe.main(tiny(data, out, "train.steps=12", "run.plot=true", "run.keep_checkpoints=2")) == 0
    text = capsys.readouterr().out
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in text and "chrF signature" in text
    assert "padding" in text and "averaged 2 checkpoints" in text
    results = json.loads((out / "results.json").read_text())
    for key in ("valid/last", "valid/averaged", "test/last", "test/averaged"):
        assert 0 <= results[key]["bleu"] <= 100 and results[key]["chrf"] >= 0
    assert results["step"] == 12 and 0 < results["padding_tgt"] < 0.5
    assert results["params"] == sum(p.numel() for p in zoo.load(out / "model" / "model.safetensors").parameters())
    for name in ("curves.png", "cross_attention.png", "tokenizer.json", "metrics.jsonl"):
        assert (out / name).stat().st_size > 0
    records = read_metrics(out / "metrics.jsonl")
    assert any(r["split"] == "train" and r["tokens_per_s"] > 0 for r in records)

    # the export reloads with zoo.load and is the mean of the last two checkpoints
    model = zoo.load(out / "model" / "model.safetensors")
    assert model.spec.d_model == 32 and model.spec.vocab_size == 400
    ckpts = [load_checkpoint(p)["model"] for p in list_checkpoints(out)[-2:]]
    w = "encoder.blocks.0.ffn.fc1.weight" if "encoder.blocks.0.ffn.fc1.weight" in ckpts[0] else next(
        k for k in ckpts[0] if k.startswith("encoder.blocks.0") and k.endswith("weight"))
    torch.testing.assert_close(model.state_dict()[w], (ckpts[0][w].double() + ckpts[1][w].double()).div(2).float())

    # the averaging command docs/recipes/translate.md shows rebuilds that model from the run's checkpoints alone
    doc = (ROOT / "docs" / "recipes" / "translate.md").read_text(encoding="utf-8")
    argv = shlex.split(next(line for line in doc.splitlines() if line.startswith("zoo average runs/translate/")))
    argv = [a.replace("runs/translate", str(out)).replace("averaged.safetensors", str(tmp_path / "a.safetensors"))
            for a in argv[1:]]
    assert zoo_main([p for a in argv for p in (sorted(map(str, Path("/").glob(a[1:]))) if "*" in a else [a])]) == 0
    assert "the mean of 2 checkpoints" in capsys.readouterr().out
    again, exported = zoo.load(tmp_path / "a.safetensors").state_dict(), model.state_dict()
    assert again.keys() == exported.keys() and all(torch.equal(again[k], exported[k]) for k in exported)

    # the translate command: stdin line by line, an empty line stays empty
    monkeypatch.setattr(sys, "stdin", io.StringIO("The room faces north.\n\nHe is hoping for a promotion.\n"))
    assert recipe.main(["translate", "--model", str(out / "model")]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert recipe.main(["translate", "--model", str(tmp_path / "nothing")]) == 2
    assert "no model.safetensors" in capsys.readouterr().err
    # input that is not UTF-8 is named by its line; a damaged translate.json by its path
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"The room faces north.\nNo \xe9t\xe9\n"),
                                                       encoding="utf-8", errors="surrogateescape"))
    assert recipe.main(["translate", "--model", str(out / "model")]) == 2
    assert capsys.readouterr().err == "translate.py translate: error: stdin:2: not valid UTF-8 (column 4); re-encode the input as UTF-8\n"
    shutil.copytree(out / "model", tmp_path / "damaged")
    (tmp_path / "damaged" / "translate.json").write_text('{"max_len": 2')
    assert recipe.main(["translate", "--model", str(tmp_path / "damaged")]) == 2
    assert f"{tmp_path / 'damaged' / 'translate.json'}: unreadable (" in capsys.readouterr().err


@pytest.mark.recipe
def test_init_continues_a_run_s_export_and_refuses_another_tokenizer(data, tmp_path, capsys):
    first = tmp_path / "first"
    assert recipe.main(tiny(data, first, "train.steps=4", "train.average_last=1", "decode.final_splits=[valid]")) == 0
    exported = first / "model" / "model.safetensors"
    args = [a for a in tiny(data, tmp_path / "again", "train.steps=4", "train.average_last=1",
                            "decode.final_splits=[valid]", f"init={exported}") if not a.startswith("model_overrides=")]
    assert recipe.main(args) == 0
    out = capsys.readouterr().out
    assert f"init: {exported}: loaded" in out and "new 0, dropped 0" in out and "from init" in out
    assert (tmp_path / "again" / "model" / "tokenizer.json").read_bytes() == (first / "model" / "tokenizer.json").read_bytes()
    report = json.loads((tmp_path / "again" / "results.json").read_text())["init"]
    assert report["new"] == [] and report["dropped"] == [] and report["loaded"] > 0
    other = bpe.train_bpe(["ein kleiner Test", "a small test"] * 5, 300, specials=["<unk>", "<s>"], min_frequency=1)
    other.save(str(first / "model" / "tokenizer.json"))  # another model's tokenizer, beside the same weights
    assert recipe.main([a.replace("again", "third") for a in args]) == 2
    assert "this recipe continues models trained by it" in capsys.readouterr().err


@pytest.mark.recipe
def test_trains_the_m2m100_layout(data, tmp_path, capsys):
    """The NLLB-200 / M2M100 layout (``m2m100-tiny``: fairseq's sinusoids past the recipe's padding id 0,
    scaled embeddings, pre-norm with final norms) trains, decodes and scores."""
    out = tmp_path / "run"
    assert recipe.main(tiny(data, out, "model=m2m100-tiny", "train.steps=6", "train.average_last=1",
                            "decode.final_splits=[valid]")) == 0
    assert "m2m100-tiny" in capsys.readouterr().out
    assert 0 <= json.loads((out / "results.json").read_text())["valid/last"]["bleu"] <= 100


@pytest.mark.recipe
def test_ablation_setting_scores_the_last_model_once_on_valid_only(data, tmp_path, capsys):
    """The paper's Table 3 setting: no averaging, dev only. One checkpoint is the final model, so it is decoded
    once; the test split is never decoded; the export is that checkpoint's weights. The model is the grid's
    ``relative-bias`` row (T5's relative position bias: one table per stack, beam search through the cache)."""
    out = tmp_path / "run"
    assert recipe.main(tiny(data, out, "train.steps=8", "train.average_last=1", "decode.final_splits=[valid]",
                            model=",position.kind=relative_bias")) == 0
    text = capsys.readouterr().out
    assert text.count("valid last") == 1 and "valid averaged" not in text and "test  last" not in text
    assert "valid: BLEU" in text  # the summary line names the split it scored
    results = json.loads((out / "results.json").read_text())
    assert "test/last" not in results and "test/averaged" not in results
    assert results["valid/averaged"] == results["valid/last"] and results["averaged"] == ["ckpt-0000008.pt"]
    last = load_checkpoint(list_checkpoints(out)[-1])["model"]
    model = zoo.load(out / "model" / "model.safetensors")
    assert [p.bidirectional for p in (model.encoder.positions[0], model.decoder.positions[0])] == [True, False]
    for k, v in model.state_dict().items():
        assert torch.equal(v, last[k]), k
    with pytest.raises(SystemExit):  # an empty list is refused by the config, naming the field
        recipe.main(tiny(data, tmp_path / "bad", "decode.final_splits=[]"))
    assert "final_splits" in capsys.readouterr().err


@pytest.fixture(scope="module")
def catalogs(tmp_path_factory) -> Path:
    """German catalogs of two listed packages, one per catalog domain (the others are missing)."""
    root = tmp_path_factory.mktemp("catalogs")
    first = {d: C.catalog_packages(d)[0] for d in ("messages", "stories")}
    for pkg in first.values():
        (root / pkg).mkdir()
    write_catalog(root / first["messages"] / "m.mo", messages("A") + messages("B"))
    write_catalog(root / first["stories"] / "s.mo", [(f"The hero walks to the {n} {k}.", f"Der Held geht zu {dn} {k}.")
                                                     for k in ("north", "south", "east", "west", "river", "hill")
                                                     for n, dn in zip(NOUNS, DE_NOUNS)])
    return root


@pytest.mark.recipe
def test_embedded_corpus_scores_each_domain_and_keeps_its_splits(catalogs, tmp_path, capsys):
    out = tmp_path / "run"
    args = [a for a in tiny(Path("unused"), out, "train.steps=6", "decode.beams=1", "decode.samples=1") if not a.startswith("data.path")]
    assert recipe.main([*args, "data.corpus=all", f"data.catalogs={catalogs}", "data.valid=8", "data.test=10",
                        "data.train_limit=500", "decode.final_splits=[test]", "decode.score_last=false"]) == 0
    text = capsys.readouterr().out
    for d in ("ding", "messages", "stories"):
        assert f"corpus {d}: " in text and f"\n{d}:\n  src: " in text  # size line and a sample of each domain
    assert "listed packages" in text and "tools/install-data" in text  # the packages missing here are named
    results = json.loads((out / "results.json").read_text())
    for d in ("ding", "messages", "stories"):
        assert 0 <= results[f"test/{d}/averaged"]["bleu"] <= 100
        # valid is not decoded (final_splits=[test]) but its loss selects; the last model is not decoded
        assert "bleu" not in results[f"valid/{d}/averaged"] and results[f"valid/{d}/last"]["loss"] > 0
        assert "bleu" not in results[f"test/{d}/last"] and results[f"test/{d}/last"]["loss"] > 0
        assert len(results["corpus"]["domains"][d]["sha256"]) == 64
    assert results["corpus"]["name"] == "all" and results["test/averaged"]["bleu"] >= 0
    assert results["corpus"]["missing_packages"] and C.catalog_packages("messages")[1] in results["corpus"]["missing_packages"]
    # the run folder holds the exact splits; no normalised test sentence (either side) is in any train split
    files = sorted(p.name for p in (out / "data").iterdir())
    assert files == sorted(f"{s}.{d}.tsv" for s in ("train", "valid", "test") for d in ("ding", "messages", "stories"))
    train = [T.read_tsv(p) for p in (out / "data").glob("train.*.tsv")]
    for side in ("src", "tgt"):
        seen = {T.normalise(x) for p in train for x in getattr(p, side)}
        for p in (out / "data").glob("test.*.tsv"):
            assert not seen & {T.normalise(x) for x in getattr(T.read_tsv(p), side)}
    assert len(T.read_tsv(out / "data" / "test.messages.tsv")) == 10
    records = read_metrics(out / "metrics.jsonl")
    assert {r["split"] for r in records} >= {"valid", "valid_ding", "valid_messages", "valid_stories"}


def test_embedded_corpus_errors_are_one_line(catalogs, tmp_path, capsys):
    base = [a for a in tiny(Path("unused"), tmp_path / "x", "train.steps=2") if not a.startswith("data.path")]
    with pytest.raises(SystemExit):
        recipe.main([*base, "data.corpus=ding+mesages"])
    err = capsys.readouterr().err
    assert "data.corpus" in err and "unknown domain 'mesages'" in err
    assert recipe.main([*base, "data.corpus=messages", f"data.catalogs={tmp_path / 'nowhere'}"]) == 2
    err = capsys.readouterr().err
    assert "no German message catalogs" in err and "tools/install-data" in err and "Traceback" not in err
    assert recipe.main([*base, "data.corpus=stories", f"data.catalogs={catalogs}", "data.valid=50", "data.test=20"]) == 2
    assert "too few" in capsys.readouterr().err
    assert recipe.main([*base, "data.corpus=messages", f"data.catalogs={catalogs}", "data.valid=5", "data.test=5",
                        "data.oversample={ding: 2}"]) == 2
    assert "data.oversample: cannot repeat ding" in capsys.readouterr().err


def test_word_dropout_replaces_only_real_tokens_at_the_rate():
    torch.manual_seed(0)
    x = torch.randint(4, 100, (200, 50))
    x[:, 0], x[:, -1], x[:, -10:-1] = T.BOS_ID, T.EOS_ID, T.PAD_ID
    y = word_dropout(x, 0.3)
    real = x > T.UNK_ID
    assert torch.equal(y[~real], x[~real])  # <s>, </s> and padding untouched
    changed = y != x
    assert (y[changed] == T.UNK_ID).all()
    assert abs(changed.sum().item() / real.sum().item() - 0.3) < 0.02
    assert torch.equal(word_dropout(x, 0.0), x)


@pytest.mark.recipe
def test_resume_reproduces_the_uninterrupted_run(data, tmp_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # word dropout draws from the RNG too; packed rows (the packing is drawn per epoch)
    steps = ["train.steps=14", "decode.beams=1", "train.word_dropout=0.2", "data.packing=documents", "data.pack_len=40"]
    assert recipe.main(tiny(data, straight, *steps)) == 0
    assert "of rows packed with document masks (" in capsys.readouterr().out
    # the same run, stopped after step 6 (mid-epoch), then resumed from its newest checkpoint
    assert recipe.main(tiny(data, resumed, *steps, "train.steps=6", "run.checkpoint_every=6")) == 0
    ck = load_checkpoint(list_checkpoints(resumed)[-1])
    assert ck["step"] == 6 and ck["state"]["pos"] > 0  # inside an epoch
    for p in list_checkpoints(resumed):
        if p.name != list_checkpoints(resumed)[-1].name:
            p.unlink()
    assert recipe.main([*tiny(data, resumed, *steps), "--resume"]) == 0
    capsys.readouterr()
    a, b = (json.loads((d / "results.json").read_text()) for d in (straight, resumed))
    for key in ("valid/last", "test/last"):
        assert a[key]["loss"] == b[key]["loss"] and a[key]["bleu"] == b[key]["bleu"]
    wa, wb = (zoo.load(d / "model" / "model.safetensors").state_dict() for d in (straight, resumed))
    la, lb = (load_checkpoint(list_checkpoints(d)[-1]) for d in (straight, resumed))
    for k in la["model"]:
        assert torch.equal(la["model"][k], lb["model"][k]), k
    assert la["optimizer"]["state"][0]["exp_avg"].equal(lb["optimizer"]["state"][0]["exp_avg"])
    train = lambda d: [(r["step"], r["loss"]) for r in read_metrics(d / "metrics.jsonl") if r["split"] == "train"]  # noqa: E731
    assert train(straight) == train(resumed)
    assert set(wa) == set(wb)


def test_resume_without_checkpoint_and_bad_data_fail_in_one_line(data, tmp_path, capsys):
    assert recipe.main([*tiny(data, tmp_path / "empty", "train.steps=2"), "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.tsv").write_text("a\tb\nonly one column\n")
    (bad / "valid.tsv").write_text("a\tb\n")
    assert recipe.main(tiny(bad, tmp_path / "x", "train.steps=2")) == 2
    err = capsys.readouterr().err
    assert "train.tsv:2: expected 2 tab-separated columns" in err and "Traceback" not in err


# under torchrun (DDP and FSDP, two gloo processes): tests/test_scale_torchrun.py


def test_decode_config_reads_the_old_length_penalty_name():
    from translate_eval import DecodeConfig
    assert DecodeConfig(length_penalty="hf").length_norm == "power"
    assert DecodeConfig.model_validate({"length_penalty": "gnmt", "alpha": 0.6}).length_norm == "gnmt"
