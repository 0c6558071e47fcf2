"""``zoo convert``: files on disk converted both ways through the command, exactly.

Reference models are tiny, built from configs with random weights (no downloads), written with
their own savers (``save_pretrained``, safetensors), converted by the command and read back with
the readers users have (``zoo.load``, ``from_pretrained(local_files_only=True)``,
``timm.create_model("local-dir:...")``). Logits are compared in fp32, eval mode, within 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import randomize
from safetensors.torch import save_file

import zoo
import zoo.io
from zoo.cli import main

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

pytestmark = pytest.mark.reference
ATOL = 1e-5
V = 61
TINY_VIT = ["d_model=24", "n_layers=2", "block.attention.n_heads=3", "block.ffn.hidden=48", "image_size=32", "patch_size=8",
            "head.num_classes=7"]


def tokens(batch: int = 2, length: int = 9, seed: int = 1, vocab: int = V) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def convert(capsys, *argv) -> str:
    capsys.readouterr()  # what the test's own savers printed
    code = main(["convert", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""  # no progress bars or notices from the libraries
    return out


def refuse(capsys, *argv) -> str:
    capsys.readouterr()
    code = main(["convert", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("zoo: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------------------- HF
HF = {
    "gpt2 untied": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_positions=32, n_embd=24, n_head=3, n_layer=2, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)),
    "bert 2 segments": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48,
        max_position_embeddings=32, type_vocab_size=2)),
    "llama gqa, biases": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        attention_bias=True, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)),
    "marian scaled": lambda: transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=32, scale_embedding=True,
        pad_token_id=V - 1, decoder_start_token_id=V - 1)),
    "bart untied, scaled": lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=V, d_model=36, encoder_layers=2, decoder_layers=3, encoder_attention_heads=3, decoder_attention_heads=3,
        encoder_ffn_dim=52, decoder_ffn_dim=52, max_position_embeddings=40, scale_embedding=True, tie_word_embeddings=False)),
    "mbart": lambda: transformers.MBartForConditionalGeneration(transformers.MBartConfig(
        vocab_size=V, d_model=36, encoder_layers=2, decoder_layers=3, encoder_attention_heads=3, decoder_attention_heads=3,
        encoder_ffn_dim=52, decoder_ffn_dim=52, max_position_embeddings=40)),
}
SEQ2SEQ = ("MarianMTModel", "BartForConditionalGeneration", "MBartForConditionalGeneration")


def hf_logits(hf, x, types=None):
    if type(hf).__name__ in SEQ2SEQ:
        return hf(input_ids=x, decoder_input_ids=x.flip(1)).logits
    if isinstance(hf, transformers.BertForMaskedLM):
        return hf(x, token_type_ids=types).logits
    return hf(x).logits


def zoo_logits(model, x, types=None):
    if model.spec.family == "encoder_decoder":
        return model(x, x.flip(1))
    if model.spec.family == "encoder":
        return model(x, None, types)
    return model(x)


@pytest.mark.parametrize("name", HF)
def test_hf_directory_to_zoo_and_back(name, tmp_path, capsys):
    hf = randomize(HF[name]())
    hf.save_pretrained(tmp_path / "hf")
    out = convert(capsys, tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert out.startswith(f"wrote {tmp_path / 'm.safetensors'}: zoo file, {type(hf).__name__}")
    model = zoo.load(tmp_path / "m.safetensors").eval()
    convert(capsys, tmp_path / "m.safetensors", "-o", tmp_path / "back")
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "back").iterdir()}
    back = type(hf).from_pretrained(tmp_path / "back", local_files_only=True).eval()
    x, types = tokens(), tokens(seed=2, vocab=2)
    with torch.no_grad():
        ref = hf_logits(hf, x, types)
        assert (zoo_logits(model, x, types) - ref).abs().max().item() < ATOL
        assert (hf_logits(back, x, types) - ref).abs().max().item() < ATOL
    if name == "gpt2 untied":
        assert model.head.weight is not model.tok_emb.weight and back.lm_head.weight is not back.transformer.wte.weight


def test_bert_checkpoint_with_other_heads_converts_and_says_what_it_left_out(tmp_path, capsys):
    """A pre-training checkpoint (pooler + next-sentence head) reads as BertForMaskedLM, as in HF."""
    config = transformers.BertConfig(vocab_size=V, hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
                                     intermediate_size=48, max_position_embeddings=32)
    randomize(transformers.BertForPreTraining(config)).save_pretrained(tmp_path / "hf")
    out = convert(capsys, tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert "left out 4 tensors BertForMaskedLM does not read" in out and "bert.pooler.dense.weight" in out
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    with torch.no_grad():
        assert (zoo.load(tmp_path / "m.safetensors").eval()(tokens()) - hf(tokens()).logits).abs().max().item() < ATOL


def test_zoo_to_hf_picks_the_architecture_and_casts(tmp_path, capsys):
    zoo.save(zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1"], seed=0), tmp_path / "m.safetensors")
    convert(capsys, tmp_path / "m.safetensors", "-o", tmp_path / "hf", "--dtype", "bf16")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"
    convert(capsys, tmp_path / "hf", "-o", tmp_path / "back.safetensors")
    header = zoo.io.read_header(tmp_path / "back.safetensors")
    assert header.dtypes() == {"bfloat16": len(header.tensors)}


# ----------------------------------------------------------------------------------------- timm
def test_zoo_vit_to_timm_directory_and_back(tmp_path, capsys):
    model = zoo.build("vit-tiny-16", TINY_VIT + ["pool=mean", "fc_norm=true"], seed=0)
    randomize(model)
    zoo.save(model, tmp_path / "vit.safetensors")
    out = convert(capsys, tmp_path / "vit.safetensors", "-o", tmp_path / "timm")
    assert out.startswith(f"wrote {tmp_path / 'timm'}: timm directory, VisionTransformer")
    ref = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()  # timm's own reader
    convert(capsys, tmp_path / "timm", "-o", tmp_path / "back.safetensors")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (ref(x) - model(x)).abs().max().item() < ATOL
        assert (zoo.load(tmp_path / "back.safetensors").eval()(x) - model(x)).abs().max().item() < ATOL


def test_architecture_names_a_timm_class_too(tmp_path, capsys):
    """``--architecture`` takes any registered class; a timm one means a timm target."""
    vit, eva = tmp_path / "vit.safetensors", tmp_path / "eva.safetensors"
    zoo.save(zoo.build("vit-tiny-16", TINY_VIT, seed=0), vit)
    zoo.save(zoo.build("eva02-mini", seed=0), eva)
    out = convert(capsys, vit, "-o", tmp_path / "timm", "--architecture", "VisionTransformer")
    assert out.startswith(f"wrote {tmp_path / 'timm'}: timm directory, VisionTransformer")
    assert "key_bias=False is not supported" in refuse(capsys, eva, "-o", tmp_path / "out", "--architecture", "VisionTransformer")
    assert "'Eva' is a timm class; an HF target takes an HF class" in refuse(
        capsys, vit, "-o", tmp_path / "out", "--to", "hf", "--architecture", "Eva")
    assert "'BertModel' is not a timm class; a timm target takes VisionTransformer, Eva" in refuse(
        capsys, vit, "-o", tmp_path / "out", "--to", "timm", "--architecture", "BertModel")
    assert not (tmp_path / "out").exists()


def test_bare_timm_checkpoint_with_its_model_name(tmp_path, capsys):
    kw = dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, num_classes=5)
    ref = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False, **kw))
    save_file(ref.state_dict(), str(tmp_path / "ckpt.safetensors"))
    err = refuse(capsys, tmp_path / "ckpt.safetensors", "-o", tmp_path / "m.safetensors")
    assert "has no zoo spec; for a timm checkpoint name its model with --timm-model NAME" in err
    # the model name alone gives the 224-pixel, 192-wide model: the tensors do not fit it
    err = refuse(capsys, tmp_path / "ckpt.safetensors", "-o", tmp_path / "m.safetensors", "--timm-model", "vit_tiny_patch16_224")
    assert "do not fit" in err or "size mismatch" in err
    (tmp_path / "timm").mkdir()
    save_file(ref.state_dict(), str(tmp_path / "timm" / "model.safetensors"))
    (tmp_path / "timm" / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "model_args": kw}))
    convert(capsys, tmp_path / "timm", "-o", tmp_path / "m.safetensors")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (zoo.load(tmp_path / "m.safetensors").eval()(x) - ref(x)).abs().max().item() < ATOL


# ---------------------------------------------------------------------------------------- errors
def test_bad_inputs_are_one_line_with_exit_2(tmp_path, capsys):
    vit = tmp_path / "vit.safetensors"
    zoo.save(zoo.build("vit-tiny-16", TINY_VIT, seed=0), vit)
    gpt = tmp_path / "gpt.safetensors"
    zoo.save(zoo.build("gpt2-small", [f"vocab_size={V}", "n_layers=1", "d_model=32", "block.attention.n_heads=4",
                                      "max_seq_len=32", "position.kind=alibi"], seed=0), gpt)

    assert "no such file or directory" in refuse(capsys, tmp_path / "missing", "-o", tmp_path / "m.safetensors")
    assert "not a model directory (no config.json)" in refuse(capsys, tmp_path, "-o", tmp_path / "m.safetensors")
    assert "family 'vit' has no HF counterpart" in refuse(capsys, vit, "-o", tmp_path / "out", "--to", "hf")
    assert "family='decoder' is not supported: timm's VisionTransformer is a 'vit' model" in refuse(capsys, gpt, "-o", tmp_path / "out", "--to", "timm")
    assert "position.kind='alibi' is not supported" in refuse(capsys, gpt, "-o", tmp_path / "out")
    assert "unknown architecture 'T5EncoderModel'" in refuse(
        capsys, gpt, "-o", tmp_path / "out", "--architecture", "T5EncoderModel")
    assert "block.norm.eps=1e-05 is not supported" in refuse(
        capsys, _vit_eps(tmp_path), "-o", tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.bin").write_bytes(b"")
    assert "the directory is not empty" in refuse(capsys, vit, "-o", tmp_path / "full")
    assert "a zoo file converts to a directory" in refuse(capsys, gpt, "-o", tmp_path / "out.safetensors", "--to", "hf")
    assert not (tmp_path / "out").exists()

    # HF directories: a class that does not convert, an option zoo lacks, weights of another model
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(vocab_size=V, hidden_size=16, num_attention_heads=2,
                                                              num_hidden_layers=1, ffn_dim=32, word_embed_proj_dim=16))
    opt.save_pretrained(tmp_path / "opt")
    err = refuse(capsys, tmp_path / "opt", "-o", tmp_path / "m.safetensors")
    assert "model_type 'opt' (OPTForCausalLM) does not convert; supported: GPT2LMHeadModel" in err
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64,
        rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}))
    llama.save_pretrained(tmp_path / "llama")
    assert "rope_parameters.rope_type='proportional' is not supported" in refuse(capsys, tmp_path / "llama", "-o", tmp_path / "m.safetensors")
    transformers.BertModel(transformers.BertConfig(vocab_size=V, hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                                                   intermediate_size=32)).save_pretrained(tmp_path / "bert")
    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    del config["architectures"]  # a BertModel's weights read as the class with the head, BertForMaskedLM
    (tmp_path / "bert" / "config.json").write_text(json.dumps(config))
    err = refuse(capsys, tmp_path / "bert", "-o", tmp_path / "m.safetensors")
    assert "the weights do not fit BertForMaskedLM: it has no cls.predictions" in err and "(the directory holds another model)" in err
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "config.json").write_text((tmp_path / "bert" / "config.json").read_text())
    assert "no-weights: cannot read the model:" in refuse(capsys, tmp_path / "no-weights", "-o", tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()
    assert "--to and --architecture apply to zoo files" in refuse(capsys, tmp_path / "bert", "-o", tmp_path / "m.safetensors", "--to", "hf")
    assert "the following arguments are required: -o/--output" in refuse(capsys, vit)


def _vit_eps(tmp_path):
    path = tmp_path / "vit-eps.safetensors"
    zoo.save(zoo.build("vit-tiny-16", TINY_VIT + ["block.norm.eps=1e-5"], seed=0), path)
    return path


def test_help(capsys):
    assert main(["convert", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--to {hf,timm}" in out and "--timm-model NAME" in out and "--dtype" in out


def _shrink(directory, **fields) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **fields}))


def test_weights_of_more_layers_or_experts_than_config_json_are_refused(tmp_path, capsys):
    """A config.json that makes fewer layers (or experts) than the weights hold would convert a smaller
    model, the rest left out; refused naming the tensors and the field, in both readers."""
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64))
    llama.save_pretrained(tmp_path / "llama")
    _shrink(tmp_path / "llama", num_hidden_layers=1)
    err = refuse(capsys, tmp_path / "llama", "-o", tmp_path / "m.safetensors")
    assert "holds more layers than config.json's num_hidden_layers=1: model.layers.1.input_layernorm.weight" in err
    assert "(+6 more) would be left out; correct num_hidden_layers" in err  # the 9 tensors of layer 1
    (tmp_path / "bin").mkdir()
    llama.config.save_pretrained(tmp_path / "bin")
    torch.save(llama.state_dict(), tmp_path / "bin" / "pytorch_model.bin")  # read whole, by from_pretrained
    _shrink(tmp_path / "bin", num_hidden_layers=1)
    assert "holds more layers than config.json's num_hidden_layers=1" in refuse(capsys, tmp_path / "bin", "-o", tmp_path / "m.safetensors")

    for name, model, field, first in [
        ("gpt2", HF["gpt2 untied"](), {"n_layer": 1}, "transformer.h.1.attn.c_attn.weight"),
        ("bart", HF["bart untied, scaled"](), {"decoder_layers": 2}, "model.decoder.layers.2.encoder_attn.k_proj.bias")]:
        model.save_pretrained(tmp_path / name)
        _shrink(tmp_path / name, **field)
        (key, value), = field.items()
        assert f"holds more layers than config.json's {key}={value}: {first}" in refuse(capsys, tmp_path / name, "-o", tmp_path / "m.safetensors")

    mixtral = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64))
    mixtral.save_pretrained(tmp_path / "mixtral")
    _shrink(tmp_path / "mixtral", num_local_experts=3)
    err = refuse(capsys, tmp_path / "mixtral", "-o", tmp_path / "m.safetensors")
    assert "holds more experts than config.json's num_local_experts=3: model.layers.0.block_sparse_moe.experts.3.w1.weight" in err
    (tmp_path / "mixtral-bin").mkdir()
    mixtral.config.save_pretrained(tmp_path / "mixtral-bin")
    torch.save(mixtral.state_dict(), tmp_path / "mixtral-bin" / "pytorch_model.bin")
    _shrink(tmp_path / "mixtral-bin", num_local_experts=3)
    err = refuse(capsys, tmp_path / "mixtral-bin", "-o", tmp_path / "m.safetensors")
    assert "the checkpoint's tensors do not fit its config.json (MixtralForCausalLM): model.layers.0.mlp.experts.down_proj is [4, 16, 32], " \
           "config.json makes [3, 16, 32]" in err
    assert not (tmp_path / "m.safetensors").exists()
