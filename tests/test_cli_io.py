"""The zoo command's summary, export and inspect: numbers checked against independent counts
(parameters of the built model, torch's FLOP counter, tensors autograd keeps), files, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import zoo
from zoo.io import FORMAT_SINGLE
from conftest import example_inputs, tiny_spec
from zoo.cli import main
from zoo.summary import PARTS, summarize

SMALL = ["d_model=32", "n_layers=2", "block.attention.n_heads=4", "block.ffn.hidden=64", "vocab_size=100"]
NO_DROPOUT = ["dropout.embedding=0", "dropout.residual=0", "dropout.attention=0", "dropout.ffn=0"]


def _json(capsys, argv) -> dict:
    assert main([*argv, "--json"] if "--json" not in argv else argv) == 0
    return json.loads(capsys.readouterr().out)


def _fails(capsys, argv, match: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("zoo: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert match in err, err
    return err


# ------------------------------------------------------------------------------------------ summary
@pytest.mark.parametrize("preset", zoo.preset_names())
def test_summary_parameters_match_the_built_model(capsys, preset):
    s = _json(capsys, ["summary", preset])
    model = zoo.build(preset, device="meta")
    assert s["parameters"] == zoo.count_parameters(model) == sum(p.numel() for p in model.parameters())
    assert set(s["parts"]) == set(PARTS) and sum(s["parts"].values()) == s["parameters"]
    assert s["weight_bytes"] == 4 * s["parameters"]


def test_summary_parts_of_gpt2_small(capsys):
    s = _json(capsys, ["summary", "gpt2-small"])
    d, L, V, T = 768, 12, 50257, 1024
    assert s["parts"] == {
        "embeddings": V * d + T * d,
        "attention": L * (d * 3 * d + 3 * d + d * d + d),
        "ffn": L * (d * 4 * d + 4 * d + 4 * d * d + d),
        "norms": (2 * L + 1) * 2 * d,
        "head": 0,  # tied to the token embedding
    }
    assert s["tied"] == {"head.weight": "tok_emb.weight"}
    assert main(["summary", "gpt2-small"]) == 0
    table = capsys.readouterr().out
    assert "124,439,808" in table and "tied: head.weight = tok_emb.weight" in table and "FLOPs per token" in table


@pytest.mark.parametrize("preset,weights_per_norm", [("nemotron-tiny", 2), ("olmo-tiny", 0)])
def test_summary_counts_the_layernorm_options(capsys, preset, weights_per_norm):
    """layernorm1p's weight and bias are norms (2 x d each), a LayerNorm without weights none."""
    spec = zoo.load_spec(preset)
    s = _json(capsys, ["summary", preset])
    assert s["parts"]["norms"] == (2 * spec.n_layers + 1) * weights_per_norm * spec.d_model


def test_flops_of_a_small_decoder_by_hand(capsys):
    # d=32, L=2, H=4 (K=V=8), F=64, vocabulary 100, T=16, learned positions (no FLOPs), tied head
    s = _json(capsys, ["summary", "gpt2-small", *sum((["--set", o] for o in SMALL), []), "--seq", "16"])
    d, L, H, K, F, V, T = 32, 2, 4, 8, 64, 100, 16
    matmul_weights = L * (d * 3 * d + d * d + d * F + F * d) + d * V  # every weight a token goes through
    attention = L * 2 * T * H * (K + K)  # q.k over T keys, then the weighted sum of T values
    assert s["flops_forward"] == 2 * matmul_weights + attention == 43_264
    assert s["flops_training"] == 3 * s["flops_forward"]
    # the usual rule: 2 x non-embedding parameters + the attention term, up to biases and norms
    non_embedding = s["parameters"] - s["parts"]["embeddings"] + d * V
    assert abs(s["flops_forward"] - (2 * non_embedding + attention)) < 0.05 * s["flops_forward"]
    assert s["kv_cache_bytes_per_token"] == L * 2 * H * K * 4


def _meta_inputs(model, seq: int) -> tuple:
    g = torch.Generator().manual_seed(0)
    spec = model.spec
    if spec.family == "vit":
        return (torch.randn(1, spec.in_channels, spec.image_size, spec.image_size, generator=g),)
    tokens = torch.randint(0, spec.vocab_size, (1, seq), generator=g)
    return (tokens, tokens) if spec.family == "encoder_decoder" else (tokens,)


COUNTED = [
    ("decoder", []),
    ("decoder", ["block.ffn.kind=relu2", "block.norm={kind: layernorm, unit_offset: true}"]),
    ("decoder", ["position.kind=rope", "block.ffn.kind=swiglu", "block.attention.kind=gqa", "block.attention.n_kv_heads=2",
                 "head.tied=false"]),
    ("encoder", ["classifier.num_labels=3"]),
    ("encoder", ["embedding.dim=12", "n_layers=3", "shared_layers=1"]),  # ALBERT's: factorised, one block
    ("encoder_decoder", ["block.attention.kind=mqa"]),
    ("vit", []),
    ("vit", ["stem.channels=[8, 12]", "stem.strides=[2, 1]"]),
    ("vit", ["pool=map", "class_token=false", "reg_tokens=3", "block.attention.qk_norm.kind=layernorm"]),
]


@pytest.mark.parametrize("family,extra", COUNTED, ids=[f"{f}-{len(e)}" for f, e in COUNTED])
def test_flops_agree_with_torch_flop_counter(family, extra):
    spec = tiny_spec(family, extra)
    seq = 24
    s = summarize(spec, seq=None if family == "vit" else seq)
    model = zoo.build(spec, device="meta")  # on the meta device the counter sees SDPA's matmuls
    inputs = [x.to("meta") for x in _meta_inputs(model, seq)]
    with FlopCounterMode(display=False) as forward:
        out = model(*inputs)
    per = 1 if family == "vit" else seq
    assert s.flops_forward * per == pytest.approx(forward.get_total_flops(), rel=0.01)
    with FlopCounterMode(display=False) as both:
        model(*inputs).float().sum().backward()
    assert s.flops_training * per == pytest.approx(both.get_total_flops(), rel=0.05)
    assert out.shape[0] == 1


ACTIVATIONS = [
    ("decoder", []),
    ("decoder", ["position.kind=rope", "block.ffn.kind=swiglu", "block.norm.kind=rmsnorm", "block.attention.kind=gqa",
                 "block.attention.n_kv_heads=2"]),
    ("encoder", []),
    ("encoder", ["embedding.dim=12", "n_layers=3", "shared_layers=1"]),
    ("encoder_decoder", []),
    ("vit", []),
    ("vit", ["stem.channels=[8, 12]", "stem.strides=[2, 1]"]),
    ("decoder", ["block.layer_scale=0.1", "block.attention.qk_norm={kind: rmsnorm, scope: all}", "position.kind=rope"]),
    ("encoder_decoder", ["block.layer_scale=0.1", "block.attention.qk_norm={kind: layernorm}"]),
    ("vit", ["pool=map", "reg_tokens=3", "prefix_positions=false", "block.layer_scale=0.1"]),
    ("decoder", ["block.ffn.kind=relu2", "block.norm={kind: layernorm, unit_offset: true}", "position.kind=rope"]),
    ("decoder", ["block.norm={kind: layernorm, affine: false}"]),
    ("decoder", ["position={kind: rope, pairs: interleaved}", "block.norm.kind=rmsnorm",  # latent attention
                 "block.attention={kind: mla, n_heads: 4, q_lora_rank: 12, kv_lora_rank: 10, qk_nope_head_dim: 6, "
                 "qk_rope_head_dim: 4, v_head_dim: 8}"]),
    ("decoder", ["position.kind=rope", "block.attention={kind: mla, n_heads: 4, kv_lora_rank: 10, qk_nope_head_dim: 6, "
                 "qk_rope_head_dim: 4, v_head_dim: 8}"]),
    ("encoder", ["position={kind: relative_embedding, buckets: 16, max_distance: 40, dropout: 0.0}",  # DeBERTa's, 2P = T
                 "block.attention={kind: disentangled, n_heads: 4}"]),
]


def _saved_bytes(model, inputs) -> int:
    """Bytes autograd keeps for the backward pass (distinct storages, weights excluded) + the output."""
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*inputs)
    return sum(n for ptr, n in storages.items() if ptr not in weights) + out.numel() * out.element_size()


@pytest.mark.parametrize("family,extra", ACTIVATIONS, ids=[f"{f}-{len(e)}" for f, e in ACTIVATIONS])
def test_activation_estimate_agrees_with_what_autograd_keeps(family, extra, monkeypatch):
    monkeypatch.setattr(zoo.kernels.cpu.attention, "_ZOO_KEYS", {})  # the estimate is for fused attention
    spec = tiny_spec(family, NO_DROPOUT + extra)
    model = zoo.build(spec, seed=0)
    inputs = example_inputs(model, batch=2, length=32)
    if family == "encoder_decoder":
        inputs = (inputs[0][:, :32], inputs[1])
    estimate = summarize(spec, batch=2, seq=None if family == "vit" else 32).activation_bytes
    assert estimate == pytest.approx(_saved_bytes(model, inputs), rel=0.1)


def test_kv_cache_per_token():
    llama = summarize(zoo.load_spec("llama-small"), dtype=torch.bfloat16)
    assert llama.kv_cache_bytes_per_token == 12 * 4 * (64 + 64) * 2  # layers x kv heads x (k + v) x bf16
    base = summarize(zoo.load_spec("transformer-base"))
    assert base.kv_cache_bytes_per_token == base.cross_kv_bytes_per_source_token == 6 * 8 * (64 + 64) * 4
    assert summarize(zoo.load_spec("bert-base")).kv_cache_bytes_per_token is None
    assert summarize(zoo.load_spec("vit-base-16")).unit == "image"


def test_summary_of_big_presets_is_instant():
    summarize(zoo.load_spec("gpt2-small"))  # the first meta build pays torch's one-time set-up
    start = time.perf_counter()
    for name in ("transformer-big", "vit-base-16", "bert-base", "llama-small"):
        summarize(zoo.load_spec(name), batch=64, seq=None if name.startswith("vit") else 512)
    assert time.perf_counter() - start < 3.0


def test_summary_of_a_user_yaml_with_overrides(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("family: decoder\nvocab_size: 500\nd_model: 64\nn_layers: 3\nmax_seq_len: 128\n"
                    "block: {attention: {kind: mha, n_heads: 4}, ffn: {kind: gelu}}\nposition: {kind: rope}\n")
    s = _json(capsys, ["summary", str(path), "--set", "n_layers=2", "--batch", "4", "--seq", "64", "--json"])
    spec = zoo.load_spec(path, ["n_layers=2"])
    assert s["parameters"] == zoo.count_parameters(zoo.build(spec, device="meta")) and s["batch"] == 4 and s["seq"] == 64
    assert main(["summary", str(path), "--dtype", "bf16"]) == 0
    assert "bfloat16" in capsys.readouterr().out


def test_summary_errors(capsys):
    _fails(capsys, ["summary", "gpt2-small", "--seq", "2048"], "seq (2048) exceeds max_seq_len (1024)")
    _fails(capsys, ["summary", "vit-tiny-16", "--seq", "100"], "seq: a vit's length is fixed by its spec (197 tokens); leave it out")
    _fails(capsys, ["summary", "gpt2-small", "--batch", "0"], "argument --batch: must be at least 1, got 0")
    _fails(capsys, ["summary", "gpt2-small", "--dtype", "int4"], "invalid choice: 'int4'")


# ------------------------------------------------------------------------------- export and inspect
def test_export_then_load_and_inspect(tmp_path, capsys):
    out = tmp_path / "tiny.safetensors"
    argv = ["export", "llama-small", *sum((["--set", o] for o in SMALL), []), "--seed", "3", "--dtype", "bf16", "-o", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    spec = zoo.load_spec("llama-small", SMALL)
    expected = zoo.build(spec, seed=3).to(torch.bfloat16)
    assert said.startswith(f"wrote {out}: llama-small, {zoo.count_parameters(expected):,} parameters, bf16, seed 3")
    loaded = zoo.load(out)
    assert loaded.spec == spec
    for a, b in zip(expected.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    # reproducible: the same seed writes the same tensors and metadata
    again = tmp_path / "again.safetensors"
    assert main([*argv[:-1], str(again)]) == 0
    assert zoo.io.read_header(again).metadata == zoo.io.read_header(out).metadata
    for a, b in zip(zoo.load(again).state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)

    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out.split("wrote")[-1]
    n_tensors = len(loaded.state_dict())  # llama-small: untied, so every tensor is stored
    assert f"tensors     {n_tensors} (bfloat16 x {n_tensors})" in text
    assert f"parameters  {zoo.count_parameters(loaded):,}" in text and f"{out.stat().st_size:,} bytes" in text
    assert f"written by  zoo {zoo.__version__} (file format {FORMAT_SINGLE})" in text
    assert zoo.load_spec(zoo.spec.read_yaml(text.split("spec:\n", 1)[1].replace("\n  ", "\n")[2:], "inspect")) == spec
    info = _json(capsys, ["inspect", str(out), "--json"])
    assert info["tensors"] == n_tensors and info["dtypes"] == {"bfloat16": n_tensors} and info["spec"]["name"] == "llama-small"
    # a zoo file is also a SPEC for show and summary
    assert _json(capsys, ["summary", str(out)])["parameters"] == zoo.count_parameters(loaded)


def test_inspect_shows_tied_weights_and_bare_files(tmp_path, capsys):
    path = tmp_path / "gpt.safetensors"
    assert main(["export", "gpt2-small", *sum((["--set", o] for o in SMALL), []), "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    assert "tied        head.weight = tok_emb.weight (stored once)" in capsys.readouterr().out
    from safetensors.torch import save_file

    bare = tmp_path / "bare.safetensors"
    save_file({"w": torch.zeros(3, 4)}, str(bare))
    assert main(["inspect", str(bare)]) == 0
    text = capsys.readouterr().out
    assert "tensors     1 (float32 x 1)" in text and "parameters  12" in text and "spec        none" in text


def test_io_failures_are_one_line(tmp_path, capsys):
    _fails(capsys, ["inspect", str(tmp_path / "none.safetensors")], "no file at")
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    _fails(capsys, ["inspect", str(broken)], "is not a readable safetensors file")
    _fails(capsys, ["summary", str(broken)], "is not a readable safetensors file")
    _fails(capsys, ["export", "gpt2-small", "-o", str(tmp_path / "no" / "dir.safetensors")], "no directory")
    _fails(capsys, ["export", "gpt2-small"], "the following arguments are required: -o/--output")


def test_spec_failures_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: decoder\nd_model: [1, 2\n")
    _fails(capsys, ["summary", str(bad)], "cannot parse file")
    _fails(capsys, ["export", "gpt2-smal", "-o", str(tmp_path / "x.safetensors")], "did you mean 'gpt2-small'")
    err = _fails(capsys, ["summary", "gpt2-small", "--set", "block.attention.n_heads=7", "--set", "d_model=100"],
                 "block.attention.n_heads: d_model (100) must be divisible by n_heads (7)")
    assert "(1 problem):" in err
    _fails(capsys, ["summary", "gpt2-small", "--set", "n_layers"], "must look like key.path=value")
    _fails(capsys, ["frobnicate"], "invalid choice: 'frobnicate'")
    _fails(capsys, ["summary"], "the following arguments are required: SPEC")
    assert not list(tmp_path.glob("*.safetensors"))


@pytest.mark.parametrize("command", [[], ["list"], ["show"], ["summary"], ["export"], ["inspect"], ["schema"]])
def test_help_everywhere(capsys, command):
    assert main([*command, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: zoo{' ' + command[0] if command else ''}")


def test_console_script(tmp_path):
    """The installed ``zoo`` command: a failure is one line on stderr, exit status 2, no traceback."""
    script = Path(sys.executable).parent / "zoo"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "zoo.cli"]
    missing = tmp_path / "missing.safetensors"
    run = subprocess.run([*cmd, "inspect", str(missing)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"zoo: error: no file at '{missing}'\n"
