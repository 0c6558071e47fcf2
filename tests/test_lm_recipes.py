"""The language-model recipes end to end on tiny models: the text data (WordNet reader, byte-level
BPE, blocks, BERT masking), recipes/lm.py (trains, samples, exports, reloads, resumes exactly) and
recipes/mlm.py (pre-trains, fine-tunes on WordNet's parts of speech, exports, resumes exactly)."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import zoo
from zoo.data import bpe
from zoo.cli import main as zoo_main
from zoo.data import text as T
from zoo.train import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_recipe", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the config's annotations through it
    spec.loader.exec_module(module)
    return module


lm = _recipe("lm")
mlm = _recipe("mlm")

WORDS = {
    "noun": "animal plant tool person place building river stone device material".split(),
    "verb": "move cause change make break carry give become run speak".split(),
    "adj": "small large bright heavy quiet green strong soft warm cold".split(),
    "adv": "quickly slowly badly loudly gently rarely openly firmly fully nearly".split(),
}
HEADER = "  1 This software and database is being provided to you, the LICENSEE, by\n  2 Princeton University\n"


def fake_wordnet(root: Path, per_part: int = 60) -> Path:
    """``data.{noun,verb,adj,adv}`` in WordNet's layout: a license header, then synset lines with
    their gloss after ' | '; each part's glosses use their own words, so the part is learnable."""
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for part, words in WORDS.items():
        lines = [HEADER]
        for i in range(per_part):
            gloss = "a " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + f" {i % 7}"
            lines.append(f"{i:08d} 03 n 01 thing_{i} 0 000 | {gloss}\n")
        lines.append(f"{per_part:08d} 03 n 01 again 0 000 | {gloss}\n")  # a repeated gloss
        (root / f"data.{part}").write_text("".join(lines), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def wordnet(tmp_path_factory) -> Path:
    return fake_wordnet(tmp_path_factory.mktemp("wordnet"))


# ------------------------------------------------------------------------------------------ data
def test_read_wordnet(wordnet):
    data = T.read_wordnet(wordnet)
    assert len(data) == 4 * 60 and data.dropped["duplicate"] == 4
    assert data.texts[0].startswith("a ") and "|" not in data.texts[0] and "LICENSEE" not in " ".join(data.texts)
    assert set(data.labels) == set(WORDS) and data.labels[0] == "noun"


@pytest.mark.skipif(not (T.WORDNET_DIR / "data.noun").is_file(), reason=T.INSTALL_HINT)
def test_read_the_installed_wordnet():
    data = T.read_wordnet()
    assert 110_000 < len(data) < 120_000 and 1.3e6 < sum(len(t.split()) for t in data.texts) < 1.6e6
    assert Counter(data.labels).most_common(1)[0][0] == "noun" and not any(" | " in t for t in data.texts[:1000])


def test_missing_wordnet_names_the_package(tmp_path, capsys):
    with pytest.raises(T.DataError, match="apt-get install wordnet-base"):
        T.read_wordnet(tmp_path / "none")
    assert lm.main([f"data.wordnet_dir={tmp_path / 'none'}", f"run.out_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "apt-get install wordnet-base" in err[0]


def test_bpe_round_trip_and_blocks():
    texts = ["naïve café – “quoted” text", "plain words again and again", "日本語 text"] * 5
    tok = bpe.train_bpe(texts, 300, specials=T.SPECIALS)
    assert [tok.id_to_token(i) for i in range(4)] == T.SPECIALS
    for t in texts[:3]:
        assert tok.decode(tok.encode(t, add_special_tokens=False).ids).strip() == t
    docs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    blocks = T.pack_blocks(docs, 4, eos_id=1)  # stream 5 6 7 1 8 9 1 10 11 12 13 1 (12 tokens)
    assert blocks.tolist() == [[5, 6, 7, 1, 8], [8, 9, 1, 10, 11]]
    assert T.unigram_perplexity(torch.arange(10), torch.arange(10), 10) == pytest.approx(10.0)


def test_rows_packed_with_document_masks_padded_or_examples_whole():
    docs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    rows = T.pack_documents(docs, 4, eos_id=1)  # stream 1 5 6 7 1 8 9 1 10 11 12 13 1: <eos> opens each document
    assert rows.tokens.tolist() == [[1, 5, 6, 7, 1], [1, 8, 9, 1, 10], [10, 11, 12, 13, 1]]
    assert rows.documents.tolist() == [[1, 1, 1, 1, 2], [2, 2, 2, 3, 3], [3, 3, 3, 3, 4]]
    assert rows.positions.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1], [1, 2, 3, 4, 0]]  # row 3 goes on at 1
    assert rows.split == 1 and rows.targets == 12
    assert T.pack_documents(docs, 4, eos_id=1, max_position=3).positions[2].tolist() == [1, 2, 0, 1, 0]
    padded = T.pad_documents(docs, 4, eos_id=1, pad_id=0)
    assert padded.tokens.tolist() == [[1, 5, 6, 7, 1], [1, 8, 9, 1, 0], [1, 10, 11, 12, 13]]
    assert padded.split == 1 and padded.targets == 11 and padded.take([1]).padding.tolist() == [[1, 1, 1, 1, 0]]
    assert T.pack_examples([[1, 2, 3], [4, 5], [6, 7, 8, 9], [1]], 5) == (
        [[1, 2, 3, 4, 5], [6, 7, 8, 9, 1]], [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]])
    with pytest.raises(T.DataError, match="an example of 6 tokens does not fit a row of 5"):
        T.pack_examples([[1] * 6], 5)


def test_lm_loss_of_packed_rows_equals_each_document_alone():
    """The LM recipe's loss on rows packed with document masks is the sum of each document's loss run
    alone (``<eos> doc <eos>``), which is what padded rows compute, and not what concat rows compute."""
    lm = _recipe("lm")
    model = zoo.build(zoo.load_spec("llama-tiny", ["vocab_size=60", "d_model=32", "n_layers=2", "block.attention.n_heads=4",
                                                   "block.attention.n_kv_heads=2", "block.ffn.hidden=48"])).eval()
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(4, 60, (n,), generator=g).tolist() for n in (5, 9, 3, 6)]
    with torch.no_grad():
        packed, n_packed = lm.lm_loss(model, T.pack_documents(docs, 27, eos_id=1))  # all in one row of 27 + 1
        padded, n_padded = lm.lm_loss(model, T.pad_documents(docs, 12, eos_id=1, pad_id=0))
        concat, _ = lm.lm_loss(model, T.Rows(T.pack_blocks([[1, *d] for d in docs][:1] + [d for d in docs[1:]], 27,
                                                           eos_id=1)))
    assert int(n_packed) == int(n_padded) == sum(len(d) + 1 for d in docs)
    assert abs(float(packed) - float(padded)) < 1e-3 and abs(float(packed) - float(concat)) > 1e-2


def test_bert_masking_selects_in_every_packed_document():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 1000, (50, 40), generator=g)
    documents = torch.arange(40).div(2, rounding_mode="floor").expand(50, -1)  # 20 documents of 2 tokens a row
    maskable = torch.ones_like(tokens, dtype=torch.bool)
    _, labels = T.mask_tokens(tokens, maskable, mask_id=3, vocab_size=1000, generator=g, documents=documents)
    per_doc = (labels != -100).view(50, 20, 2).any(-1)
    assert per_doc.all()  # 0.85^2 = 72% of them drew nothing by the 15% rule alone
    _, plain = T.mask_tokens(tokens, maskable, mask_id=3, vocab_size=1000, generator=g)
    assert not (plain != -100).view(50, 20, 2).any(-1).all()


def test_bert_masking_rule():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 1000, (400, 250), generator=g)
    maskable = torch.ones_like(tokens, dtype=torch.bool)
    maskable[:, :2] = False  # e.g. <cls> and padding are never selected
    inputs, labels = T.mask_tokens(tokens, maskable, mask_id=3, vocab_size=1000, generator=g)
    sel = labels != -100
    assert not sel[:, :2].any() and torch.equal(labels[sel], tokens[sel])
    assert sel.float().mean().item() == pytest.approx(0.15 * 248 / 250, abs=0.005)
    masked = (inputs[sel] == 3).float().mean().item()
    same = (inputs[sel] == tokens[sel]).float().mean().item()
    assert masked == pytest.approx(0.8, abs=0.01) and same == pytest.approx(0.1 + 0.1 / 996, abs=0.01)
    assert torch.equal(inputs[~sel], tokens[~sel]) and int(inputs.min()) >= 3


# ------------------------------------------------------------------------------------ recipes/lm.py
def lm_args(wordnet: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"data.wordnet_dir={wordnet}", "data.vocab_size=300", "data.valid_fraction=0.1", f"run.out_dir={out}",
        "model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=2,block.attention.n_kv_heads=1,block.ffn.hidden=64]",
        "train.steps=6", "train.batch_size=4", "train.block_len=16", "schedule.warmup=2",
        "run.log_every=1", "run.eval_every=3", "run.checkpoint_every=3", "run.progress=false", "run.plot=false",
        "sample.max_new_tokens=6", "sample.prompts=[a]", *extra,
    ]


@pytest.mark.recipe
def test_lm_trains_samples_exports_and_resumes_exactly(wordnet, tmp_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert lm.main(lm_args(wordnet, straight, "run.plot=true")) == 0
    out = capsys.readouterr().out
    assert "unigram baseline" in out and "valid perplexity" in out and "sample: a|" in out
    assert (straight / "curves.png").is_file()
    model = zoo.load(straight / "model" / "model.safetensors").eval()
    tok = bpe.load_bpe(straight / "model" / "tokenizer.json", specials=T.SPECIALS)
    ids = torch.tensor([tok.encode("a small tool", add_special_tokens=False).ids])
    assert model(ids).shape == (1, ids.shape[1], tok.get_vocab_size())
    # its checkpoints record the model's spec: `zoo average` rebuilds a model from them alone
    ckpts = sorted(map(str, straight.glob("ckpt-*.pt")))
    assert len(ckpts) == 2 and zoo_main(["average", *ckpts, "-o", str(tmp_path / "avg.safetensors")]) == 0
    assert zoo.load(tmp_path / "avg.safetensors").spec == model.spec

    # a run that stopped at step 3: its checkpoint, tokenizer and log, then --resume
    resumed.mkdir()
    for name in ("ckpt-0000003.pt", "tokenizer.json", "metrics.jsonl"):
        shutil.copy(straight / name, resumed / name)
    assert lm.main(lm_args(wordnet, resumed, "--resume")) == 0
    assert "resumed from" in capsys.readouterr().out
    a = zoo.load(straight / "model" / "model.safetensors").state_dict()
    b = zoo.load(resumed / "model" / "model.safetensors").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    _same_losses(straight, resumed)


def _same_losses(a: Path, b: Path) -> None:
    """The two runs logged the same losses and scores at the same steps (speeds differ)."""
    def key(r):
        return r["step"], r["split"], r.get("loss"), r.get("ppl"), r.get("accuracy")

    assert [key(r) for r in read_metrics(a / "metrics.jsonl")] == [key(r) for r in read_metrics(b / "metrics.jsonl")]


def test_a_split_too_short_for_one_block_names_the_settings(wordnet, tmp_path, capsys):
    assert lm.main(lm_args(wordnet, tmp_path, "data.max_valid=1", "train.block_len=64")) == 2
    err = capsys.readouterr().err
    assert "the valid split:" in err and "data.valid_fraction or data.max_valid" in err and "train.block_len" in err


def test_lm_rejects_an_encoder(wordnet, tmp_path, capsys):
    assert lm.main(lm_args(wordnet, tmp_path, "model=bert-mini", "model_overrides=[d_model=32,n_layers=1]")) == 2
    assert "needs a decoder" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- recipes/mlm.py
def mlm_args(wordnet: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"data.wordnet_dir={wordnet}", "data.vocab_size=300", "data.valid_fraction=0.2", f"run.out_dir={out}",
        "model_overrides=[d_model=32,n_layers=2,block.attention.n_heads=2,block.ffn.hidden=64]",
        "train.steps=6", "train.batch_size=8", "train.max_len=16", "schedule.warmup=2",
        "finetune.steps=6", "finetune.batch_size=8", "finetune.schedule.warmup=2", "finetune.checkpoint_every=3",
        "run.log_every=1", "run.eval_every=3", "run.checkpoint_every=3", "run.progress=false", "run.plot=false", *extra,
    ]


@pytest.mark.recipe
def test_mlm_pretrains_finetunes_exports_and_resumes_exactly(wordnet, tmp_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    packed = "data.packing=documents"  # packed rows here; the default (pad) in the labelled-TSV test below
    assert mlm.main(mlm_args(wordnet, straight, packed)) == 0
    out = capsys.readouterr().out
    assert "packed with document masks" in out
    assert "most-frequent-token baseline" in out and "masked-token accuracy" in out
    assert "WordNet gloss -> part of speech" in out and "fine-tuned valid accuracy" in out
    encoder = zoo.load(straight / "model" / "model.safetensors").eval()
    assert encoder.spec.family == "encoder" and encoder.spec.classifier is None
    clf = zoo.load(straight / "finetune" / "model" / "model.safetensors").eval()
    labels = json.loads((straight / "finetune" / "model" / "labels.json").read_text())
    assert labels == sorted(WORDS)
    tokens, mask = T.pad_batch([[2, 10, 11, 1], [2, 12, 1]])
    assert clf.classify(tokens, mask).shape == (2, 4)
    # pre-training's checkpoints record the encoder's spec; fine-tuning's hold a wrapper, which has none
    capsys.readouterr()
    assert zoo_main(["average", str(straight / "ckpt-0000006.pt"), "-o", str(tmp_path / "enc.safetensors")]) == 0
    assert zoo.load(tmp_path / "enc.safetensors").spec == encoder.spec
    assert zoo_main(["average", str(straight / "finetune" / "ckpt-0000006.pt"), "-o", str(tmp_path / "ft.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ckpt-0000006.pt records no model spec" in err

    # stopped in pre-training at step 3, then --resume: both phases end with the same weights
    resumed.mkdir()
    for name in ("ckpt-0000003.pt", "tokenizer.json", "metrics.jsonl"):
        shutil.copy(straight / name, resumed / name)
    assert mlm.main(mlm_args(wordnet, resumed, packed, "--resume")) == 0
    for sub in ("model", "finetune/model"):
        a = zoo.load(straight / sub / "model.safetensors").state_dict()
        b = zoo.load(resumed / sub / "model.safetensors").state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), sub
    _same_losses(straight, resumed)

    # stopped in fine-tuning at step 3
    shutil.rmtree(resumed)
    (resumed / "finetune").mkdir(parents=True)
    for name in ("ckpt-0000006.pt", "tokenizer.json", "metrics.jsonl", "finetune/ckpt-0000003.pt", "finetune/metrics.jsonl"):
        shutil.copy(straight / name, resumed / name)
    assert mlm.main(mlm_args(wordnet, resumed, packed, "--resume")) == 0
    a = zoo.load(straight / "finetune/model/model.safetensors").state_dict()
    b = zoo.load(resumed / "finetune/model/model.safetensors").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    _same_losses(straight / "finetune", resumed / "finetune")


@pytest.mark.recipe
def test_mlm_pretrains_deberta_tiny(wordnet, tmp_path, capsys):
    """The mlm recipe trains deberta-tiny (disentangled attention over the shared relative table) on
    packed rows and fine-tunes it; its loss falls."""
    out = tmp_path / "deberta"
    args = mlm_args(wordnet, out, "model=deberta-tiny", "data.packing=documents", "train.steps=12", "run.eval_every=6",
                    "run.checkpoint_every=6")
    assert mlm.main(args) == 0
    encoder = zoo.load(out / "model" / "model.safetensors")
    assert encoder.spec.block.attention.kind == "disentangled"
    losses = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if r.get("split", "train") == "train" and "loss" in r and "phase" not in r]
    assert losses[-1] < losses[0]


@pytest.mark.recipe
def test_mlm_finetunes_on_a_labelled_tsv(tmp_path, capsys):
    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS[p]) for _ in range(5)) + f"\t{p}" for p in WORDS for _ in range(30)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "text.txt").write_text("\n".join(x.split("\t")[0] for x in lines) + "\n", encoding="utf-8")
    args = mlm_args(tmp_path, tmp_path / "out", f"data.text=[{tmp_path / 'text.txt'}]", f"finetune.train={tmp_path / 'train.tsv'}")
    assert mlm.main(args) == 0
    assert "majority-class baseline" in capsys.readouterr().out
    (tmp_path / "bad.tsv").write_text("no tab here\n", encoding="utf-8")
    assert mlm.main(args[:-1] + [f"finetune.train={tmp_path / 'bad.tsv'}"]) == 2
    assert "bad.tsv:1: expected 'text<TAB>label'" in capsys.readouterr().err


# under torchrun (DDP and FSDP, two gloo processes): tests/test_torchrun_loss.py and tests/test_scale_torchrun.py


def test_the_unigram_comparison_says_higher_when_the_model_is_worse():
    assert lm.versus_unigram(100.0, 1000.0) == "10.0x lower"
    assert lm.versus_unigram(516.0, 216.5).startswith("2.4x higher")


@pytest.mark.recipe
def test_the_quickstarts_minute_of_training_runs_as_written(wordnet, tmp_path, capsys):
    """docs/quickstart.md's one-minute run, its settings as the page gives them, on the tiny model
    and data above for a few seconds; it writes what the page says it writes."""
    page = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    command = next(line for line in page.splitlines() if line.startswith("python recipes/lm.py "))
    out = tmp_path / "quick"
    shrunk = [a for a in lm_args(wordnet, out, "train.minutes=0.03", "run.plot=true", "run.eval_every=20",
                                 "run.checkpoint_every=20") if not a.startswith("train.steps=")]
    assert lm.main([*command.split()[2:], *shrunk]) == 0
    assert "sample: a|" in capsys.readouterr().out
    for name in ("metrics.jsonl", "curves.png", "model/model.safetensors", "model/tokenizer.json"):
        assert (out / name).is_file(), name
    assert list(out.glob("ckpt-*.pt"))
