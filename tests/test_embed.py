"""Headless BERT backbones (HF ``BertModel``, with and without its pooler) and sentence embeddings.

The truth is HF's own model at random init: its ``last_hidden_state`` and ``pooler_output`` after
converting both ways (in memory, and ``zoo convert`` on directories), and sentence-transformers'
pooling computed here by hand from HF's hidden states and attention mask (its tokenizer is HF's
``PreTrainedTokenizerFast`` over the same tokenizer.json, padding and truncating itself).
"""

from __future__ import annotations

import io
import json

import pytest
import torch
from conftest import max_diff, randomize

import zoo
from zoo.cli import main
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytestmark = pytest.mark.reference

ATOL = 1e-5
V = 59
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "cats and dogs are good friends",
             "the park is green and large", "a small cat runs to the dog"]


def bert_config(vocab: int = V) -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=vocab, hidden_size=28, num_attention_heads=4, num_hidden_layers=2,
                                   intermediate_size=44, max_position_embeddings=40, type_vocab_size=2,
                                   architectures=["BertModel"])


def batch(seed: int = 0):
    """Tokens [3, 9], segments, and a padding mask whose last rows are shorter."""
    g = torch.Generator().manual_seed(seed)
    x, types = torch.randint(0, V, (3, 9), generator=g), torch.randint(0, 2, (3, 9), generator=g)
    mask = torch.arange(9) < torch.tensor([[9], [6], [2]])
    return x, types, mask


def hf_out(hf, x, types, mask):
    with torch.no_grad():
        return hf(input_ids=x, token_type_ids=types, attention_mask=mask.long())


@pytest.mark.parametrize("pooler", [True, False], ids=["pooler", "no pooler"])
def test_bert_model_converts_both_ways_in_memory_and_on_disk(pooler, tmp_path, capsys):
    hf = randomize(transformers.BertModel(bert_config(), add_pooling_layer=pooler))
    x, types, mask = batch()
    ref = hf_out(hf, x, types, mask)
    model = from_hf(hf)
    assert model.spec.head.kind == "none" and model.spec.pooler is pooler
    zoo.save(model, tmp_path / "m.safetensors")
    loaded = zoo.load(tmp_path / "m.safetensors").eval()  # from the file alone
    back = to_hf(model).eval()
    assert type(back).__name__ == "BertModel" and (back.pooler is not None) is pooler
    assert hf_config(model.spec).architectures == ["BertModel"] and hf_spec(back.config).head.kind == "none"
    # zoo convert: the directory streamed to a zoo file and back
    hf.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "c.safetensors")]) == 0
    assert main(["convert", str(tmp_path / "c.safetensors"), "-o", str(tmp_path / "back")]) == 0
    assert "zoo file, BertModel" in capsys.readouterr().out
    disk, info = transformers.BertModel.from_pretrained(tmp_path / "back", add_pooling_layer=pooler, local_files_only=True,
                                                        output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    converted = zoo.load(tmp_path / "c.safetensors").eval()
    with torch.no_grad():
        for m in (model, loaded, converted):
            assert m.spec == model.spec
            assert max_diff(m(x, mask, types), ref.last_hidden_state, mask) < 1e-4
            if pooler:
                assert max_diff(m.pool(x, mask, types), ref.pooler_output) < 1e-4
        for h in (back, disk.eval()):
            out = hf_out(h, x, types, mask)
            assert max_diff(out.last_hidden_state, ref.last_hidden_state, mask) < 1e-4
            if pooler:
                assert max_diff(out.pooler_output, ref.pooler_output) < 1e-4
    if not pooler:
        with pytest.raises(ValueError, match="pool: this encoder has no pooled output; set pool .* or pooler: true"):
            model.pool(x)


def test_bert_model_read_whole_from_pytorch_model_bin_without_its_pooler(tmp_path, capsys):
    """A checkpoint saved without the pooler reads without one (not completed with random values)."""
    hf = randomize(transformers.BertModel(bert_config(), add_pooling_layer=False))
    (tmp_path / "hf").mkdir()
    hf.config.save_pretrained(tmp_path / "hf")
    torch.save(hf.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "m.safetensors")]) == 0, capsys.readouterr().err
    model = zoo.load(tmp_path / "m.safetensors").eval()
    x, types, mask = batch(1)
    with torch.no_grad():
        assert not model.spec.pooler and max_diff(model(x, mask, types), hf_out(hf, x, types, mask).last_hidden_state, mask) < 1e-4


def test_the_masked_lm_class_refuses_a_pooler_and_names_the_backbone():
    spec = hf_spec(bert_config()).model_copy(update={"head": hf_spec(transformers.BertConfig()).head})
    with pytest.raises(ConversionError, match="pooler=True is not supported: BertForMaskedLM has no pooler; an encoder "
                                              "with one and head: none converts to BertModel"):
        to_hf(zoo.build(spec, device="meta"), "BertForMaskedLM")


# ------------------------------------------------------------------------------------- zoo.embed
def by_hand(h: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """sentence-transformers' pooling of hidden states [B, T, D] over the real tokens."""
    m = mask.unsqueeze(-1).to(h.dtype)
    if pooling == "cls":
        return h[:, 0]
    if pooling == "mean":
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return h.masked_fill(m == 0, -1e9).max(1).values


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_embed_pools_each_rows_real_tokens(pooling):
    model = zoo.build("bert-mini", [f"vocab_size={V}", "d_model=28", "block.attention.n_heads=4", "block.ffn.hidden=44",
                                    "n_layers=2", "max_seq_len=40", "head=mlm"], seed=0).eval()
    x, _, mask = batch(2)
    with torch.no_grad():
        got = zoo.embed(model, x, mask, pooling=pooling)
        rows = [by_hand(model.encode(x[i:i + 1, :n]), torch.ones(1, n), pooling) for i, n in enumerate(mask.sum(1).tolist())]
        assert got.shape == (3, 28) and max_diff(got, torch.cat(rows)) < ATOL  # each row alone, unpadded
        unit = zoo.embed(model, x, mask, pooling=pooling, normalize=True)
        assert max_diff(unit, got / got.norm(dim=-1, keepdim=True)) < ATOL


def test_embed_takes_a_headless_decoder_and_refuses_what_has_no_hidden_states():
    decoder = zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1", "head=none"], seed=0).eval()
    x = torch.randint(0, V, (2, 5))
    with torch.no_grad():
        assert max_diff(zoo.embed(decoder, x, pooling="max"), decoder(x).amax(1)) < ATOL
    with pytest.raises(ValueError, match="embed: this decoder's lm head gives logits, not hidden states; embeddings come "
                                         "from a decoder with head: none"):
        zoo.embed(zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1"], device="meta"), x)
    with pytest.raises(ValueError, match="embed: a vit model has no token hidden states to pool"):
        zoo.embed(zoo.build("vit-tiny-16", ["n_layers=1"], device="meta"), x)
    with pytest.raises(ValueError, match="pooling: 'sum' is not one of mean, cls, max"):
        zoo.embed(decoder, x, pooling="sum")
    with pytest.raises(ValueError, match="padding_mask: row 1 has no real token to pool"):
        zoo.embed(decoder, x, torch.tensor([[True] * 5, [False] * 5]))


# ------------------------------------------------------------------------- sentence-transformers
def write_tokenizer(path) -> int:
    """A BERT-style WordPiece tokenizer ([CLS] text [SEP]) trained on SENTENCES; its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(SENTENCES, trainers.WordPieceTrainer(vocab_size=V, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.decoder = decoders.WordPiece()
    tok.save(str(path))
    return tok.get_vocab_size()


def write_sentence_transformers(folder, pooling: str, normalize: bool, max_seq_length: int | None):
    """A sentence-transformers directory as it saves one: the BertModel at the top, 1_Pooling, [2_Normalize]."""
    folder.mkdir()
    vocab = write_tokenizer(folder / "tokenizer.json")
    hf = randomize(transformers.BertModel(bert_config(vocab)))
    hf.save_pretrained(folder)
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")] + ([("2_Normalize", "Normalize")] if normalize else [])
    (folder / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
                                                     for i, (path, kind) in enumerate(modules)]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 28, "pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": pooling == "max", "pooling_mode_mean_sqrt_len_tokens": False}))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
    return hf


def embed_command(monkeypatch, capsys, *argv, stdin: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    capsys.readouterr()
    code = main(["embed", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("pooling, normalize, max_seq_length", [("mean", False, None), ("cls", True, None), ("max", False, 6)])
def test_zoo_embed_reproduces_a_sentence_transformers_directory(pooling, normalize, max_seq_length, tmp_path, monkeypatch, capsys):
    hf = write_sentence_transformers(tmp_path / "st", pooling, normalize, max_seq_length)
    (tmp_path / "out").mkdir()
    assert main(["convert", str(tmp_path / "st"), "-o", str(tmp_path / "out" / "m.safetensors")]) == 0
    said = capsys.readouterr().out
    assert f"embeds with {pooling} pooling" in said and "copied" in said and (tmp_path / "out" / "tokenizer.json").is_file()
    texts = SENTENCES[:2] + ["", "dogs and a cat sat in the large green park"]
    code, out, err = embed_command(monkeypatch, capsys, tmp_path / "out" / "m.safetensors", stdin="\n".join(texts) + "\n")
    assert code == 0, err
    lines = out.split("\n")
    assert len(lines) == len(texts) + 1 and lines[2] == "" and lines[-1] == ""
    got = torch.tensor([[float(v) for v in line.split()] for line in lines if line])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "st" / "tokenizer.json"), pad_token="[PAD]")
    real = [t for t in texts if t]
    enc = tok(real, padding=True, truncation=max_seq_length is not None, max_length=max_seq_length, return_tensors="pt")
    with torch.no_grad():
        want = by_hand(hf(**enc).last_hidden_state, enc["attention_mask"], pooling)
    want = torch.nn.functional.normalize(want, dim=-1) if normalize else want
    assert got.shape == (3, 28) and max_diff(got, want) < ATOL
    if pooling == "mean":  # the file says how it embeds; the cosine matrix of the non-empty lines; the file's pooling overridden
        assert main(["inspect", str(tmp_path / "out" / "m.safetensors")]) == 0
        assert "embeds with mean pooling (zoo embed's default)" in capsys.readouterr().out
        code, out, _ = embed_command(monkeypatch, capsys, tmp_path / "out" / "m.safetensors", "--similarity", stdin="\n".join(texts))
        unit = torch.nn.functional.normalize(want, dim=-1)
        assert code == 0 and max_diff(torch.tensor([[float(v) for v in row.split()] for row in out.splitlines()]), unit @ unit.T) < ATOL
        code, out, _ = embed_command(monkeypatch, capsys, tmp_path / "out" / "m.safetensors", "--pooling", "cls", "--normalize",
                                     stdin=real[0])
        cls = torch.nn.functional.normalize(by_hand(hf(**enc).last_hidden_state, enc["attention_mask"], "cls"), dim=-1)[:1]
        assert code == 0 and max_diff(torch.tensor([[float(v) for v in out.split()]]), cls.detach()) < ATOL


def test_bad_inputs_are_refused_by_name(tmp_path, monkeypatch, capsys):
    zoo.save(zoo.build("bert-mini", [f"vocab_size={V}", "n_layers=1", "head=none"], seed=0), tmp_path / "bert.safetensors")
    code, out, err = embed_command(monkeypatch, capsys, tmp_path / "bert.safetensors", stdin="a cat\n")
    assert code == 2 and out == "" and f"no tokenizer for {tmp_path / 'bert.safetensors'}: {tmp_path / 'tokenizer.json'} does not " \
        "exist; put the model's tokenizer.json next to the model file, or name one with --tokenizer PATH" in err
    code, _, err = embed_command(monkeypatch, capsys, tmp_path / "bert.safetensors", "--tokenizer", tmp_path / "nope.json", stdin="")
    assert code == 2 and "--tokenizer" in err and "nope.json: no such file" in err
    zoo.save(zoo.build("vit-tiny-16", ["n_layers=1"], seed=0), tmp_path / "vit.safetensors")
    code, _, err = embed_command(monkeypatch, capsys, tmp_path / "vit.safetensors", stdin="a cat\n")
    assert code == 2 and "vit.safetensors: a vit model has no token hidden states to pool" in err
    # a sentence-transformers directory that does more than pool and normalise
    write_sentence_transformers(tmp_path / "st", "mean", True, None)
    modules = json.loads((tmp_path / "st" / "modules.json").read_text())
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    (tmp_path / "st" / "modules.json").write_text(json.dumps(modules[:2] + [dense] + modules[2:]))
    assert main(["convert", str(tmp_path / "st"), "-o", str(tmp_path / "x.safetensors")]) == 2
    assert "the modules 2_Dense (sentence_transformers.models.Dense) are not supported" in capsys.readouterr().err
    (tmp_path / "st" / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "st" / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_weightedmean_tokens": True}))
    assert main(["convert", str(tmp_path / "st"), "-o", str(tmp_path / "x.safetensors")]) == 2
    assert "pooling modes pooling_mode_weightedmean_tokens are not supported" in capsys.readouterr().err
    # a tokenizer.json already beside the written file is another model's: kept, and said so
    (tmp_path / "st" / "modules.json").unlink()
    (tmp_path / "tokenizer.json").write_text("{}")
    assert main(["convert", str(tmp_path / "st"), "-o", str(tmp_path / "x.safetensors")]) == 0
    assert f"kept {tmp_path / 'tokenizer.json'}, which is another tokenizer" in capsys.readouterr().out
    assert (tmp_path / "tokenizer.json").read_text() == "{}"


def test_lines_that_are_not_utf8_or_give_no_token(tmp_path, monkeypatch, capsys):
    """Bytes that are not UTF-8 stop with the line's number; a line of spaces, which a tokenizer that
    adds no special tokens makes no token of, gives an empty line as an empty line does, and the
    other lines the vectors they give alone."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from zoo.embed import embed_texts

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(vocab_size=V, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    model = zoo.build("bert-mini", [f"vocab_size={V}", "n_layers=1", "head=none"], seed=0)
    zoo.save(model, tmp_path / "bert.safetensors")
    code, out, err = embed_command(monkeypatch, capsys, tmp_path / "bert.safetensors", stdin="the cat\n   \na dog\n")
    assert code == 0, err
    lines = out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    alone = [embed_command(monkeypatch, capsys, tmp_path / "bert.safetensors", stdin=t)[1].strip() for t in ("the cat", "a dog")]
    vectors = lambda rows: torch.tensor([[float(v) for v in r.split()] for r in rows])  # noqa: E731
    assert max_diff(vectors([lines[0], lines[2]]), vectors(alone)) < 1e-5
    code, out, _ = embed_command(monkeypatch, capsys, tmp_path / "bert.safetensors", "--similarity", stdin="the cat\n \n")
    assert code == 0 and len(out.splitlines()) == 1
    with pytest.raises(ValueError, match=r"texts\[1\] ' ': the tokenizer gives no token to embed; leave such texts out"):
        embed_texts(model, tok, ["the cat", " "])
    for stdin in (io.TextIOWrapper(io.BytesIO(b"the cat\na \xff dog\n"), encoding="utf-8", errors="surrogateescape"),
                  io.StringIO("the cat\na \udcff dog\n")):  # read as bytes, or as text with the bytes escaped
        monkeypatch.setattr("sys.stdin", stdin)
        capsys.readouterr()
        assert main(["embed", str(tmp_path / "bert.safetensors")]) == 2
        out, err = capsys.readouterr()
        assert err == "zoo: error: stdin:2: not valid UTF-8 (column 3); re-encode the input as UTF-8\n"
