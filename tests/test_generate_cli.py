"""``zoo generate`` and the model's own tokenizer (:mod:`zoo.tokens`), against HF transformers.

A tiny random ``LlamaForCausalLM`` and a byte-level BPE trained here on a few sentences are saved as
an HF folder (``tokenizer.json``, a ``tokenizer_config.json`` with special tokens, ``add_bos_token``
and a chat template, ``generation_config.json``), converted by ``zoo convert``; the command's text must
be what HF's ``generate`` and its tokenizer's ``decode`` give, and its prompts what HF's tokenizer
(``AutoTokenizer`` on the folder) encodes and renders.
"""

from __future__ import annotations

import io
import json
import shutil
import sys

import pytest
import torch
from conftest import randomize

import zoo
from zoo.cli import main
from zoo.tokens import ModelTokenizer, TokenizerError

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.reference
SENTENCES = ["the act of running fast", "a person who sells goods", "a small dog ran in the park",
             "move quickly to the door", "the cat sat on the mat"]
SPECIALS = ["<s>", "</s>", "<pad>"]  # ids 0, 1, 2
TEMPLATE = ("{% for m in messages %}\n{{ bos_token }}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")
PROMPTS = ["the act of", "a small dog"]
N = 12


def bpe(bos: bool = False) -> tokenizers.Tokenizer:
    """A byte-level BPE of SENTENCES; ``bos``: its post-processor starts each text with <s>, as Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES * 4, trainers.BpeTrainer(vocab_size=90, special_tokens=SPECIALS, min_frequency=1))
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


def write_json(path, data) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(HF folder, the zoo file converted from it, the HF model, HF's tokenizer of the folder)."""
    root = tmp_path_factory.mktemp("llama")
    folder, tok = root / "hf", bpe(bos=True)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=48, intermediate_size=80,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    hf = randomize(transformers.LlamaForCausalLM(config))
    hf.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                                   "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": True,
                                                   "chat_template": TEMPLATE})
    (root / "zoo").mkdir()
    assert main(["convert", str(folder), "-o", str(root / "zoo" / "model.safetensors")]) == 0
    return folder, root / "zoo" / "model.safetensors", hf, transformers.AutoTokenizer.from_pretrained(folder)


def hf_text(llama, ids, n=N, **kwargs) -> str:
    """HF's greedy continuation of ``ids``, decoded without the eos that ends it."""
    _, _, hf, hf_tok = llama
    x = torch.tensor([ids])
    with torch.no_grad():
        out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, **kwargs)
    new = out[0, x.shape[1]:].tolist()
    eos = kwargs.get("eos_token_id", hf.generation_config.eos_token_id)
    eos = set(eos if isinstance(eos, list) else [eos])
    new = new[:next((i for i, t in enumerate(new) if t in eos), len(new))]
    return hf_tok.decode(new, skip_special_tokens=True)


def generate(capsys, monkeypatch, *argv, stdin=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    code = main(["generate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, monkeypatch, *argv, stdin=None) -> str:
    code, out, err = generate(capsys, monkeypatch, *argv, stdin=stdin)
    assert code == 2 and out == "" and err.startswith("zoo: error: ") and err.count("\n") == 1, (code, out, err)
    return err


# --------------------------------------------------------------------------------- the tokenizer
def test_prompts_encode_and_chats_render_as_hfs_tokenizer(llama):
    folder, path, _, hf_tok = llama
    for tok in (ModelTokenizer.beside(path), ModelTokenizer.from_dir(folder)):
        assert (tok.bos_id, tok.eos_ids, tok.pad_id, tok.add_bos) == (0, (1,), 2, True)
        for text in PROMPTS:
            assert tok.encode(text) == hf_tok(text).input_ids  # bos first, once
        messages = [{"role": "user", "content": "a small dog"}]
        rendered = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tok.render_chat(messages) == rendered
        ids = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert tok.encode(rendered, add_special_tokens=False) == list(ids)


def test_special_ids_come_from_the_first_file_that_gives_them(tmp_path):
    tok = bpe()
    tok.save(str(tmp_path / "tokenizer.json"))
    write_json(tmp_path / "special_tokens_map.json", {"eos_token": "<pad>", "bos_token": {"content": "<s>"}})
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "</s>"})
    write_json(tmp_path / "config.json", {"eos_token_id": 7, "pad_token_id": None})
    write_json(tmp_path / "generation_config.json", {"eos_token_id": [5, 6], "decoder_start_token_id": 4})
    read = ModelTokenizer.from_dir(tmp_path)
    assert (read.eos_ids, read.bos_id, read.pad_id, read.decoder_start_id) == ((5, 6), tok.token_to_id("<s>"), None, 4)
    for name, eos in (("generation_config.json", (7,)), ("config.json", (tok.token_to_id("</s>"),)),
                      ("tokenizer_config.json", (tok.token_to_id("<pad>"),)), ("special_tokens_map.json", ())):
        (tmp_path / name).unlink()
        assert ModelTokenizer.from_dir(tmp_path).eos_ids == eos, name
    write_json(tmp_path / "tokenizer_config.json", {"eos_token": "<nope>"})
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: eos_token '<nope>' is not a token of"):
        ModelTokenizer.from_dir(tmp_path)
    write_json(tmp_path / "generation_config.json", {"eos_token_id": "2"})
    with pytest.raises(TokenizerError, match=r"generation_config.json: eos_token_id: '2' is not a token id"):
        ModelTokenizer.from_dir(tmp_path)


@pytest.mark.parametrize("flag", [None, True, False])
@pytest.mark.parametrize("post_processor", [True, False])
def test_bos_as_the_post_processor_or_add_bos_token_says(tmp_path, flag, post_processor):
    """HF's tokenizer (transformers 5) encodes as tokenizer.json's post-processor says, whatever
    add_bos_token says; without a post-processor, zoo takes add_bos_token (HF 5 adds nothing)."""
    bpe(bos=post_processor).save(str(tmp_path / "tokenizer.json"))
    write_json(tmp_path / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                                     "eos_token": "</s>"} | ({} if flag is None else {"add_bos_token": flag}))
    read = ModelTokenizer.from_dir(tmp_path)
    ids = transformers.AutoTokenizer.from_pretrained(tmp_path)("the act of").input_ids
    bos = post_processor or flag is True
    assert read.add_bos == bos and read.encode("the act of") == ([0] * (bos and not post_processor) + ids)
    read.save(tmp_path / "saved")  # a tokenizer without a post-processor is saved with one that adds bos
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")("the act of").input_ids == read.encode("the act of")


def test_vocabulary_check_and_save_round_trip(tmp_path, llama):
    tok = ModelTokenizer.from_dir(llama[0])
    tok.check_vocab(tok.vocab_size + 8)  # embeddings padded above the tokenizer: fine
    with pytest.raises(TokenizerError, match=rf"has {tok.vocab_size} tokens, more than the model's {tok.vocab_size - 1} "):
        tok.check_vocab(tok.vocab_size - 1)
    tok.save(tmp_path)
    again = ModelTokenizer.from_dir(tmp_path)
    assert (again.bos_id, again.eos_ids, again.pad_id, again.add_bos, again.chat_template) == (0, (1,), 2, True, TEMPLATE)
    assert again.encode("the act of") == transformers.AutoTokenizer.from_pretrained(tmp_path)("the act of").input_ids


# ------------------------------------------------------------------------------------ the command
def test_greedy_text_is_hfs(llama, capsys, monkeypatch):
    _, path, _, hf_tok = llama
    for prompt in PROMPTS:
        code, out, err = generate(capsys, monkeypatch, path, prompt, "--max-new-tokens", N)
        assert code == 0 and err == "" and out == hf_text(llama, hf_tok(prompt).input_ids) + "\n"
    code, out, _ = generate(capsys, monkeypatch, path, PROMPTS[0], "--max-new-tokens", N, "--echo")
    assert out == PROMPTS[0] + hf_text(llama, hf_tok(PROMPTS[0]).input_ids) + "\n"


def test_stdin_lines_give_one_line_each(llama, capsys, monkeypatch):
    _, path, _, hf_tok = llama
    code, out, _ = generate(capsys, monkeypatch, path, "--max-new-tokens", N, stdin="\n".join(PROMPTS) + "\n")
    want = [hf_text(llama, hf_tok(p).input_ids).replace("\\", "\\\\").replace("\n", "\\n") for p in PROMPTS]
    assert code == 0 and out.split("\n") == [*want, ""]


def test_chat_prompt_is_hfs_template(llama, capsys, monkeypatch):
    _, path, _, hf_tok = llama
    messages = [{"role": "user", "content": PROMPTS[1]}]
    ids = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    code, out, _ = generate(capsys, monkeypatch, path, PROMPTS[1], "--max-new-tokens", N, "--chat", "--echo")
    rendered = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert code == 0 and out == rendered + hf_text(llama, list(ids)) + "\n"


def test_eos_ids_and_stop_strings_end_the_text(llama, tmp_path, capsys, monkeypatch):
    folder, path, hf, hf_tok = llama
    ids = hf_tok(PROMPTS[0]).input_ids
    with torch.no_grad():
        new = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N, eos_token_id=None)[0, len(ids):].tolist()
    early = next(t for t in new[3:] if t != 1)  # a token the greedy text holds after three others: made an eos
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(path.parent / name, tmp_path / name)
    write_json(tmp_path / "generation_config.json", {"bos_token_id": 0, "eos_token_id": [1, early]})
    code, out, _ = generate(capsys, monkeypatch, tmp_path / "model.safetensors", PROMPTS[0], "--max-new-tokens", N)
    full = hf_text(llama, ids)
    assert code == 0 and out == hf_text(llama, ids, eos_token_id=[1, early]) + "\n" and len(out) < len(full) + 1
    stop = full[len(full) // 2:len(full) // 2 + 2]
    for how in ([], ["--beams", "2"]):
        beams = zoo.generate(zoo.load(path).eval(), torch.tensor([ids]), num_beams=2, max_new_tokens=N, stop_tokens=[1])
        text = hf_tok.decode(beams.tokens[0, :int(beams.lengths[0])].tolist(), skip_special_tokens=True) if how else full
        code, out, _ = generate(capsys, monkeypatch, path, PROMPTS[0], "--max-new-tokens", N, "--stop", stop, "--stop", "zz", *how)
        assert code == 0 and out == (text[:text.index(stop)] if stop in text else text) + "\n"


def test_sampling_and_beams_are_zoo_generates(llama, capsys, monkeypatch):
    _, path, _, hf_tok = llama
    model, ids = zoo.load(path).eval(), torch.tensor([hf_tok(PROMPTS[0]).input_ids])

    def text(out) -> str:
        new = out.tokens[0, :int(out.lengths[0])].tolist()
        return hf_tok.decode([t for t in new if t != 1], skip_special_tokens=True)

    sampled = zoo.generate(model, ids, max_new_tokens=N, do_sample=True, top_k=5, temperature=0.7, stop_tokens=[1],
                           generator=torch.Generator().manual_seed(3))
    code, out, _ = generate(capsys, monkeypatch, path, PROMPTS[0], "--max-new-tokens", N, "--sample", "--top-k", 5,
                            "--temperature", 0.7, "--seed", 3)
    assert code == 0 and out == text(sampled) + "\n"
    beams = zoo.generate(model, ids, max_new_tokens=N, num_beams=3, length_norm="power", alpha=1.0, stop_tokens=[1])
    code, out, _ = generate(capsys, monkeypatch, path, PROMPTS[0], "--max-new-tokens", N, "--beams", 3,
                            "--length-norm", "power", "--alpha", 1.0)
    assert code == 0 and out == text(beams) + "\n"


def test_on_token_sees_each_step_and_may_end_it(llama):
    model, ids = zoo.load(llama[1]).eval(), torch.tensor([[0, 5, 6], [0, 7, 8]])
    seen, steps = [], []
    whole = zoo.generate(model, ids, max_new_tokens=6, on_token=lambda t: seen.append(t.tolist()))
    assert torch.equal(torch.tensor(seen).T, whole.tokens)
    cut = zoo.generate(model, ids, max_new_tokens=6, on_token=lambda t: steps.append(t) or len(steps) == 3)
    assert torch.equal(cut.tokens, whole.tokens[:, :3]) and cut.lengths.tolist() == [3, 3]
    with pytest.raises(ValueError, match="on_token follows greedy or sampled tokens"):
        zoo.generate(model, ids, max_new_tokens=6, num_beams=2, on_token=print)


def test_encoder_decoder_output_for_a_prompt(tmp_path, capsys, monkeypatch):
    tok = bpe()
    tok.save(str(tmp_path / "tokenizer.json"))
    write_json(tmp_path / "generation_config.json", {"eos_token_id": 1, "decoder_start_token_id": 2})
    model = zoo.build("bart-tiny", [f"vocab_size={tok.get_vocab_size()}"], seed=0).eval()
    zoo.save(model, tmp_path / "bart.safetensors")
    src = torch.tensor([tok.encode(PROMPTS[0]).ids])
    out = zoo.generate(model, src, bos_id=2, num_beams=1, max_new_tokens=6, stop_tokens=[1])
    want = tok.decode([t for t in out.tokens[0, :int(out.lengths[0])].tolist() if t != 1])
    code, printed, _ = generate(capsys, monkeypatch, tmp_path / "bart.safetensors", PROMPTS[0], "--max-new-tokens", 6)
    assert code == 0 and printed == want + "\n"


def test_refusals_are_one_line(llama, tmp_path, capsys, monkeypatch):
    folder, path, _, _ = llama
    V = ModelTokenizer.from_dir(folder).vocab_size
    shutil.copyfile(folder / "tokenizer.json", tmp_path / "tokenizer.json")
    zoo.save(zoo.build("bert-mini", [f"vocab_size={V}"], seed=0), tmp_path / "bert.safetensors")
    assert "bert.safetensors: the encoder family does not generate" in refused(capsys, monkeypatch, tmp_path / "bert.safetensors", "hi")
    zoo.save(zoo.build("llama-tiny", [f"vocab_size={V - 5}", "n_layers=1"], seed=0), tmp_path / "small.safetensors")
    err = refused(capsys, monkeypatch, tmp_path / "small.safetensors", "hi")
    assert f"has {V} tokens, more than the model's {V - 5} embedding rows" in err
    (tmp_path / "alone").mkdir()
    zoo.save(zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1"], seed=0), tmp_path / "alone" / "m.safetensors")
    assert "tokenizer.json does not exist; put the model's tokenizer.json next to the model file" in refused(
        capsys, monkeypatch, tmp_path / "alone" / "m.safetensors", "hi")
    assert "--chat: no chat template beside" in refused(capsys, monkeypatch, tmp_path / "alone" / "m.safetensors", "hi",
                                                        "--chat", "--tokenizer", tmp_path / "tokenizer.json")
    assert "PROMPT: an empty prompt" in refused(capsys, monkeypatch, path, "  ")
    assert "stdin:2: an empty prompt" in generate(capsys, monkeypatch, path, "--max-new-tokens", 2, stdin="a dog\n\n")[2]
    assert "--temperature: sampling options; add --sample" in refused(capsys, monkeypatch, path, "hi", "--temperature", 0.5)
    assert "not allowed with argument --sample" in refused(capsys, monkeypatch, path, "hi", "--sample", "--beams", 2)
    gpt = ["n_layers=1", "d_model=32", "block.attention.n_heads=2", "block.ffn.hidden=64", "max_seq_len=16"]
    zoo.save(zoo.build("gpt2-small", [f"vocab_size={V}", *gpt], seed=0), tmp_path / "gpt.safetensors")
    assert "and --max-new-tokens 20 are more than the model's 16 positions" in refused(
        capsys, monkeypatch, tmp_path / "gpt.safetensors", "hi", "--max-new-tokens", 20)
    zoo.save(zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1", "head.kind=none"], seed=0), tmp_path / "h.safetensors")
    assert "this decoder has no language-model head (head: none)" in refused(capsys, monkeypatch, tmp_path / "h.safetensors", "hi")


def test_convert_round_trip_keeps_the_tokenizer_files(llama, tmp_path, capsys):
    folder, path, _, hf_tok = llama
    capsys.readouterr()
    assert main(["convert", str(path), "-o", str(tmp_path / "back")]) == 0
    assert "copied tokenizer.json, tokenizer_config.json, generation_config.json" in capsys.readouterr().out
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "back" / name).read_bytes() == (folder / name).read_bytes(), name
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert back(PROMPTS[0]).input_ids == hf_tok(PROMPTS[0]).input_ids


def test_text_streams_as_it_settles(llama):
    """Pieces written one token at a time add up to the whole text, never show the start of a stop
    string before it is settled, and end before the stop string."""
    from zoo.cli_generate import TextStream

    tok = ModelTokenizer.from_dir(llama[0])
    prompt, new = tok.encode("the act of"), tok.encode(" the cat sat on the mat\nand ran", add_special_tokens=False)
    whole = tok.decode(prompt + new)[len(tok.decode(prompt)):]
    for stops, escape in (([], False), (["mat"], False), (["cat", "nope"], True)):
        pieces: list[str] = []
        stream = TextStream(tok, prompt, stops, pieces.append, escape=escape)
        for i in new:
            if stream.push([i]):
                break
            assert not any("".join(pieces).endswith(s[:n]) for s in stops for n in range(1, len(s) + 1))
        text = stream.finish()
        want = whole[:min((whole.index(s) for s in stops if s in whole), default=len(whole))]
        assert text == want and "".join(pieces) == (want.replace("\n", "\\n") if escape else want)
    stream = TextStream(tok, prompt, [], pieces.append)
    assert stream.push([new[0], 1, new[1]]) and stream.ids == [new[0]]  # eos ends the text


def test_special_ids_beyond_the_embedding_and_a_tokenizer_folder(llama, capsys, monkeypatch):
    folder, path, _, hf_tok = llama
    tok = ModelTokenizer.from_dir(folder)
    with pytest.raises(TokenizerError, match=r"the eos token id 500 is beyond the model's 100 embedding rows \(vocab_size\); give this"):
        ModelTokenizer(tok.tokenizer, eos_ids=(1, 500)).check_vocab(100)
    code, out, _ = generate(capsys, monkeypatch, path, PROMPTS[0], "--max-new-tokens", N, "--tokenizer", folder)
    assert code == 0 and out == hf_text(llama, hf_tok(PROMPTS[0]).input_ids) + "\n"
