"""Recipes that start from converted weights (``init=``): the LM recipe fine-tunes an HF decoder with
its own tokenizer, the classification recipe fine-tunes an encoder (text and pairs of texts), and a
pre-trained encoder, converted to HF and back, beats the same architecture from scratch."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import zoo
from zoo.cli import main as zoo_main
from zoo.tokens import ModelTokenizer

from test_lm_recipes import WORDS, _recipe, fake_wordnet, lm, mlm

transformers = pytest.importorskip("transformers")
classify = _recipe("classify")


@pytest.fixture(scope="module")
def wordnet(tmp_path_factory) -> Path:
    return fake_wordnet(tmp_path_factory.mktemp("wordnet"), per_part=150)


def hf_llama(folder: Path, texts: list[str]) -> Path:
    """A random-init HF LlamaForCausalLM with its own byte-level BPE (``<s>`` ``</s>``), as a
    downloaded checkpoint folder holds them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=tok.get_vocab_size() + 3,  # padded rows, as HF's
                                      max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def lm_init_args(wordnet: Path, init: Path, out: Path, *extra: str) -> list[str]:
    return [f"init={init}", f"data.wordnet_dir={wordnet}", "data.valid_fraction=0.1", f"run.out_dir={out}",
            "train.steps=12", "train.batch_size=8", "train.block_len=16", "schedule.warmup=2", "optim.lr=3e-3",
            "run.log_every=4", "run.eval_every=12", "run.checkpoint_every=12", "run.progress=false", "run.plot=false",
            "sample.max_new_tokens=4", "sample.prompts=[a]", *extra]


@pytest.mark.recipe
def test_lm_fine_tunes_an_hf_decoder_with_its_own_tokenizer(wordnet, tmp_path, capsys):
    from zoo.data import text as T

    hf = hf_llama(tmp_path / "hf", T.read_wordnet(wordnet).texts)
    assert lm.main(lm_init_args(wordnet, hf, tmp_path / "run")) == 0
    out = capsys.readouterr().out
    assert "init: " in out and "LlamaForCausalLM" in out and "the model's own" in out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["valid_loss"] < results["start_valid_loss"] - 0.5, results  # fine-tuning lowered it from the start
    assert results["init"]["new"] == [] and results["init"]["dropped"] == []
    exported = tmp_path / "run" / "model"
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in exported.iterdir()}
    model = zoo.load(exported / "model.safetensors")
    config = json.loads((hf / "config.json").read_text())
    assert model.spec.vocab_size == config["vocab_size"] and model.spec.d_model == 32  # the HF model's, not a preset's


def test_lm_init_refuses_an_encoder_and_an_architecture_override(wordnet, tmp_path, capsys):
    enc = zoo.build(zoo.load_spec("bert-mini", ["d_model=32", "n_layers=1", "block.attention.n_heads=2",
                                                "block.ffn.hidden=40", "vocab_size=300"]))
    zoo.save(enc, tmp_path / "enc.safetensors")
    assert lm.main(lm_init_args(wordnet, tmp_path / "enc.safetensors", tmp_path / "a")) == 2
    assert "holds a encoder" in capsys.readouterr().err
    assert lm.main(lm_init_args(wordnet, tmp_path / "enc.safetensors", tmp_path / "b", "model_overrides=[d_model=64]")) == 2
    assert "'d_model=64' would change the architecture" in capsys.readouterr().err


def test_a_tokenizer_larger_than_the_embedding_is_refused_with_both_sizes(wordnet, tmp_path, capsys):
    from zoo.data import text as T

    hf = hf_llama(tmp_path / "hf", T.read_wordnet(wordnet).texts)
    config = json.loads((hf / "config.json").read_text())
    small = zoo.build(zoo.load_spec("llama-tiny", ["d_model=32", "n_layers=1", "block.attention.n_heads=2",
                                                   "block.attention.n_kv_heads=1", "block.ffn.hidden=40", "vocab_size=100"]))
    (tmp_path / "z").mkdir()
    zoo.save(small, tmp_path / "z" / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "z" / name).write_bytes((hf / name).read_bytes())
    assert lm.main(lm_init_args(wordnet, tmp_path / "z" / "model.safetensors", tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert f"{config['vocab_size'] - 3} tokens" in err and "100" in err


# ------------------------------------------------------------------------------------ classify.py
def classify_args(wordnet: Path, out: Path, *extra: str) -> list[str]:
    return [f"data.wordnet_dir={wordnet}", f"run.out_dir={out}", "data.max_len=16", "train.steps=10", "data.valid_fraction=0.2",
            "train.batch_size=16", "schedule.warmup=2", "run.log_every=5", "run.eval_every=10",
            "run.checkpoint_every=10", "run.progress=false", "run.plot=false", *extra]


@pytest.mark.recipe
def test_classify_from_scratch_on_text_pairs(tmp_path, capsys):
    rng = random.Random(2)
    lines = []
    for _ in range(120):
        a, b = rng.choice(list(WORDS)), rng.choice(list(WORDS))
        lines.append(f"{' '.join(rng.choices(WORDS[a], k=3))}\t{' '.join(rng.choices(WORDS[b], k=3))}\t{a == b}")
    (tmp_path / "pairs.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = classify_args(tmp_path, tmp_path / "out", f"data.train={tmp_path / 'pairs.tsv'}", "data.vocab_size=120",
                         "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2,block.ffn.hidden=40]")
    assert classify.main(args) == 0
    assert "pairs of texts" in capsys.readouterr().out
    exported = tmp_path / "out" / "model"
    model = zoo.load(exported / "model.safetensors")
    assert model.spec.type_vocab_size == 2 and model.spec.classifier.num_labels == 2
    assert json.loads((exported / "labels.json").read_text()) == ["False", "True"] == model.spec.classifier.labels
    from tokenizers import Tokenizer

    enc = Tokenizer.from_file(str(exported / "tokenizer.json")).encode("small", "large")
    assert enc.type_ids[-1] == 1 and enc.ids[0] == 2  # <cls> a <eos> b <eos>, segment 1 for b
    (tmp_path / "bad.tsv").write_text("a\tb\tc\nd\te\n", encoding="utf-8")
    assert classify.main(args[:-2] + [f"data.train={tmp_path / 'bad.tsv'}"]) == 2
    assert "bad.tsv:2: 2 columns" in capsys.readouterr().err


@pytest.mark.recipe
@pytest.mark.skipif(not (Path("/usr/share/wordnet") / "data.noun").is_file(), reason="needs Debian's wordnet-base")
def test_a_pretrained_encoder_converted_to_hf_beats_scratch(tmp_path, capsys):
    """MLM pre-training on 20,000 WordNet glosses, exported, converted to an HF ModernBertForMaskedLM folder
    (with its tokenizer) and fine-tuned from there on 1,000 labelled glosses (-> part of speech):
    better than the same architecture from random weights, with the same tokenizer, data and steps."""
    spec = tmp_path / "encoder.yaml"  # ModernBERT's layout (pre-norm, GeGLU, RoPE), small
    spec.write_text("family: encoder\nvocab_size: 2000\nmax_seq_len: 64\nd_model: 64\nn_layers: 3\n"
                    "embedding: {norm: true}\nhead: {kind: mlm, transform: true, transform_bias: false, bias: true, tied: true}\n"
                    "position: {kind: rope}\nblock: {kind: pre, attention: {kind: mha, n_heads: 4, bias: false}, "
                    "ffn: {kind: geglu, hidden: 128, bias: false}, norm: {kind: layernorm, bias: false}}\n"
                    "layers: [{at: 0, block: {attn_norm: false}}]\n")
    quiet = ("run.progress=false", "run.plot=false", "run.log_every=100")
    assert mlm.main([f"model={spec}", "data.limit=20000", "data.vocab_size=2000", "train.steps=600",
                     "train.batch_size=32", "train.max_len=32", "optim.lr=1e-3", "finetune.enabled=false",
                     f"run.out_dir={tmp_path / 'mlm'}", "run.eval_every=600", "run.checkpoint_every=600", *quiet]) == 0
    exported = tmp_path / "mlm" / "model"
    assert zoo_main(["convert", str(exported / "model.safetensors"), "-o", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(zoo.to_yaml(zoo.io.read_spec(exported / "model.safetensors")))
    common = ("data.limit=1000", "data.max_len=32", "train.steps=150", "train.batch_size=32", "optim.lr=5e-4",
              "run.eval_every=150", "run.checkpoint_every=150", *quiet)
    assert classify.main([f"init={tmp_path / 'hf'}", f"run.out_dir={tmp_path / 'pre'}", *common]) == 0
    out = capsys.readouterr().out
    assert "ModernBertForMaskedLM" in out and "new 4 (classifier." in out
    assert classify.main([f"model={spec_file}", f"data.tokenizer={exported / 'tokenizer.json'}",
                          f"run.out_dir={tmp_path / 'scratch'}", *common]) == 0
    pre = json.loads((tmp_path / "pre" / "results.json").read_text())
    scratch = json.loads((tmp_path / "scratch" / "results.json").read_text())
    assert pre["loss"] < scratch["loss"] - 0.05 and pre["accuracy"] > scratch["accuracy"], (pre, scratch)
    assert any(n.startswith("head.") for n in pre["init"]["dropped"])  # the MLM head, reported


def hf_bert(folder: Path, texts: list[str]) -> Path:
    """A random-init HF BertForMaskedLM with its own WordPiece tokenizer ([CLS] a [SEP] b [SEP])."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=150, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizerFast", "do_lower_case": True}))  # as bert-base-uncased: no token named here
    config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=64,
                                     pad_token_id=0)
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config).save_pretrained(folder)
    return folder


@pytest.mark.recipe
def test_mlm_continues_an_hf_bert_with_its_own_tokenizer_and_fine_tunes_it(wordnet, tmp_path, capsys):
    from zoo.data import text as T

    hf = hf_bert(tmp_path / "hf", T.read_wordnet(wordnet).texts)
    args = [f"init={hf}", f"data.wordnet_dir={wordnet}", "data.valid_fraction=0.2", f"run.out_dir={tmp_path / 'run'}",
            "train.steps=6", "train.batch_size=8", "train.max_len=16", "schedule.warmup=2", "finetune.steps=6",
            "finetune.batch_size=8", "finetune.schedule.warmup=2", "run.log_every=3", "run.eval_every=6",
            "run.checkpoint_every=6", "run.progress=false", "run.plot=false"]
    assert mlm.main(args) == 0
    out = capsys.readouterr().out
    assert "BertForMaskedLM" in out and "the model's own" in out and "fine-tuned valid accuracy" in out
    own = ModelTokenizer.from_dir(hf)
    vocab = mlm.Vocab(own.tokenizer, own, where="t")
    rows = vocab.examples(["a small tool", "move quickly and softly"], 16)
    assert rows[0][0] == vocab.tok.token_to_id("[CLS]") and rows[0][-1] == vocab.tok.token_to_id("[SEP]")
    inputs, pad_mask, labels, _ = mlm.mlm_batch(rows, 0.9, vocab, torch.Generator().manual_seed(0))
    specials = torch.isin(T.pad_batch(rows, pad_id=0)[0], torch.tensor(vocab.special))
    assert (labels[specials] == -100).all() and (labels[~specials & pad_mask] != -100).any()
    for sub in ("model", "finetune/model"):
        folder = tmp_path / "run" / sub
        assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    assert zoo.load(tmp_path / "run" / "finetune" / "model" / "model.safetensors").spec.classifier.num_labels == 4


@pytest.mark.recipe
def test_lm_lora_trains_adapters_alone_and_exports_them_merged(wordnet, tmp_path, capsys):
    from zoo.data import text as T
    from zoo.finetune import load_adapters

    hf = hf_llama(tmp_path / "hf", T.read_wordnet(wordnet).texts)
    lora = "finetune.lora={rank: 4, alpha: 8, targets: [q, v, ffn]}"
    assert lm.main(lm_init_args(wordnet, hf, tmp_path / "run", lora, "optim.lr=1e-2")) == 0
    out = capsys.readouterr().out
    assert "lora: rank 4, alpha 8" in out and "parameters train" in out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["valid_loss"] < results["start_valid_loss"], results
    base = zoo.load(tmp_path / "run" / "init" / "model.safetensors").eval()
    merged = zoo.load(tmp_path / "run" / "model" / "model.safetensors").eval()
    b, m = base.state_dict(), merged.state_dict()
    assert b.keys() == m.keys()  # the merged export is a plain model
    changed = {k for k in b if not torch.equal(b[k], m[k])}
    assert changed and all(".qkv." in k or ".ffn." in k for k in changed), changed  # frozen elsewhere
    adapted = load_adapters(zoo.load(tmp_path / "run" / "init" / "model.safetensors"),
                            tmp_path / "run" / "model" / "adapters.safetensors").eval()
    tokens = torch.randint(0, merged.spec.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(merged(tokens), adapted(tokens), atol=1e-4, rtol=1e-4)


@pytest.mark.recipe
def test_classify_lora_on_a_converted_encoder(wordnet, tmp_path, capsys):
    from zoo.data import text as T

    hf = hf_bert(tmp_path / "hf", T.read_wordnet(wordnet).texts)
    args = classify_args(wordnet, tmp_path / "out", f"init={hf}", "finetune.lora={rank: 2, targets: [q, k, v, o]}")
    assert classify.main(args) == 0
    assert "(+ classifier in full)" in capsys.readouterr().out
    exported = tmp_path / "out" / "model"
    assert (exported / "adapters.safetensors").is_file()
    model = zoo.load(exported / "model.safetensors")
    base = zoo.load(tmp_path / "out" / "init" / "model.safetensors")
    assert torch.equal(model.state_dict()["tok_emb.weight"], base.state_dict()["tok_emb.weight"])
    assert model.spec.classifier.num_labels == 4
