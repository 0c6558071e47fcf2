"""Safetensors files that carry their spec: round trips for every family, tied weights stored once,
no derived buffers, dtypes, strict loading, and a clear error for each kind of bad file."""

from __future__ import annotations

import json
import pickle
import struct
from typing import Literal

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

import zoo
import zoo.shards
from conftest import example_inputs, tiny_model, tiny_spec
from zoo.components.position import Position, sinusoid_table
from zoo.components.rope import rope_frequencies
from zoo.io import FORMAT, LoadError, SaveError, load, load_weights, read_header, save
from zoo.registry import REGISTRIES
from zoo.spec import PositionSpec

ROUND_TRIPS = [
    ("decoder", []),  # GPT-2 layout: learned positions, tied head
    ("decoder", ["position.kind=rope"]),
    ("decoder", ["position.kind=alibi"]),
    ("decoder", ["position.kind=sinusoidal"]),
    ("decoder", ["position.kind=none"]),
    ("decoder", ["position.kind=rope", "block.ffn.kind=swiglu", "block.norm.kind=rmsnorm", "block.attention.kind=gqa",
                 "block.attention.n_kv_heads=2", "block.attention.bias=false", "head.tied=false"]),
    ("encoder", []),  # BERT layout: post-norm, embedding norm, segments, MLM transform, tied
    ("encoder", ["position.kind=sinusoidal", "classifier.num_labels=3"]),
    ("encoder", ["position.kind=rope", "block.kind=pre", "head.transform=false"]),
    ("encoder", ["n_layers=3", "shared_layers=2", "embedding.dim=8"]),  # ALBERT's: factorised, layers 0 and 1 one block
    ("encoder_decoder", []),  # the paper: sinusoidal, post-norm, one matrix for src, tgt and output
    ("encoder_decoder", ["position.kind=rope", "block.kind=pre"]),
    ("encoder_decoder", ["position.kind=learned", "share_embeddings=false", "src_vocab_size=50", "head.tied=false"]),
    ("encoder_decoder", ["position.kind=alibi", "block.attention.kind=mqa"]),
    ("vit", []),  # learned positions, class token
    ("vit", ["position.kind=sincos2d"]),
    ("vit", ["position.kind=none", "pool=mean", "class_token=false", "fc_norm=true"]),
    ("vit", ["reg_tokens=2", "prefix_positions=false", "pool=map", "block.layer_scale=0.1", "dynamic_size=true",
             "block.attention.qk_norm.kind=rmsnorm", "block.attention.qk_norm.scope=all"]),
]
IDS = [f"{family}-{'-'.join(o.split('=')[1] for o in extra) or 'preset'}" for family, extra in ROUND_TRIPS]


def _outputs(model, inputs):
    with torch.no_grad():
        out = [model(*inputs)]
        if getattr(model, "classifier", None) is not None:
            out.append(model.classify(*inputs))
    return out


def _file_keys(path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


def _header_length(path) -> int:
    with open(path, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def _rewrite(path, out, *, tensors=None, metadata=None, drop=(), change=None):
    """A copy of ``path`` with tensors dropped, added or changed, or other metadata."""
    with safe_open(str(path), framework="pt") as f:
        data = {k: f.get_tensor(k) for k in f.keys() if k not in drop}
        meta = f.metadata()
    data.update(tensors or {})
    if change:
        data.update(change(data))
    save_file(data, str(out), metadata=meta if metadata is None else metadata)
    return out


@pytest.mark.parametrize("family,extra", ROUND_TRIPS, ids=IDS)
def test_round_trip_gives_identical_outputs(tmp_path, family, extra):
    model = tiny_model(family, extra, seed=1).eval()
    path = save(model, tmp_path / "m.safetensors")
    loaded = load(path).eval()
    assert loaded.spec == model.spec and type(loaded) is type(model)
    inputs = example_inputs(model)
    for a, b in zip(_outputs(model, inputs), _outputs(loaded, inputs)):
        assert torch.equal(a, b)
    # every tensor, persistent or derived, equals the original's
    assert zoo.count_parameters(loaded) == zoo.count_parameters(model)
    for (name, a), (name_b, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name_b and torch.equal(a, b)
    derived = dict(model.named_buffers())
    assert derived.keys() == dict(loaded.named_buffers()).keys()
    for name, buf in loaded.named_buffers():
        assert not buf.is_meta and torch.equal(buf, derived[name]), name
    # the file holds each distinct tensor once and no derived table
    assert _file_keys(path) == {name for name, _ in model.named_parameters()}
    assert all(not p.is_meta and p.requires_grad for p in loaded.parameters())


def test_tied_weights_are_stored_once_and_still_tied(tmp_path):
    model = tiny_model("decoder")
    path = save(model, tmp_path / "gpt.safetensors")
    keys = _file_keys(path)
    assert "tok_emb.weight" in keys and "head.weight" not in keys
    assert read_header(path).tied == {"head.weight": "tok_emb.weight"}
    loaded = load(path)
    assert loaded.head.weight is loaded.tok_emb.weight
    assert loaded.head.weight.data_ptr() == loaded.tok_emb.weight.data_ptr()
    # stored once: the data is exactly the distinct parameters, 4 bytes each
    assert path.stat().st_size - 8 - _header_length(path) == 4 * zoo.count_parameters(model)
    # still one parameter for training: a step through the head moves the embedding
    before = loaded.tok_emb.weight.detach().clone()
    loaded(example_inputs(loaded)[0]).sum().backward()
    torch.optim.SGD(loaded.parameters(), lr=0.1).step()
    assert not torch.equal(before, loaded.tok_emb.weight) and loaded.head.weight is loaded.tok_emb.weight


def test_shared_layers_are_stored_once_and_still_one_block(tmp_path):
    model = tiny_model("encoder", ["n_layers=3", "shared_layers=1"]).eval()  # ALBERT's: one block at every layer
    path = save(model, tmp_path / "albert.safetensors")
    assert not any(k.startswith(("stack.blocks.1.", "stack.blocks.2.")) for k in _file_keys(path))
    tied = read_header(path).tied
    assert tied["stack.blocks.2.attn.qkv.weight"] == "stack.blocks.0.attn.qkv.weight"
    assert path.stat().st_size - 8 - _header_length(path) == 4 * zoo.count_parameters(model)
    loaded = load(path).eval()
    assert loaded.stack.blocks[0] is loaded.stack.blocks[1] is loaded.stack.blocks[2]
    tokens = example_inputs(loaded)[0]
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    loaded(tokens).sum().backward()  # a step moves the one block every layer runs
    before = loaded.stack.blocks[0].ffn.fc1.weight.detach().clone()
    torch.optim.SGD(loaded.parameters(), lr=0.1).step()
    assert not torch.equal(before, loaded.stack.blocks[2].ffn.fc1.weight)


def test_tie_groups_are_names_over_the_same_bytes():
    base = torch.randn(4, 6)
    a, b = nn.Parameter(base), nn.Parameter(base.detach())  # two objects, one storage
    state = {"a": a, "b": b, "same": a, "row": base[1:], "copy": base.clone(), "t": base.t()}
    assert zoo.shards.tie_groups(state) == {"a": ["a", "b", "same"], "row": ["row"], "copy": ["copy"], "t": ["t"]}
    with pytest.raises(RuntimeError, match="share memory"):  # what safetensors refuses to write twice
        save_file({"a": a.detach(), "b": b.detach()}, "unused.safetensors")
    meta = torch.empty(3, device="meta")
    assert zoo.shards.tie_groups({"x": meta, "y": torch.empty(3, device="meta"), "z": meta}) == {"x": ["x", "z"], "y": ["y"]}


def test_parameters_over_one_storage_are_stored_once(tmp_path):
    model = tiny_model("decoder").eval()  # head tied to the embedding: one object; now two over one storage
    model.head.weight = nn.Parameter(model.tok_emb.weight.detach())
    path = save(model, tmp_path / "gpt.safetensors")
    assert read_header(path).tied == {"head.weight": "tok_emb.weight"} and "head.weight" not in _file_keys(path)
    tokens = example_inputs(model)[0]
    loaded = load(path).eval()
    assert loaded.head.weight is loaded.tok_emb.weight and torch.equal(loaded(tokens), model(tokens))
    # a spec that does not tie them: both names stored, loaded apart
    untied = tiny_model("decoder", ["head.tied=false"]).eval()
    untied.head.weight = nn.Parameter(untied.tok_emb.weight.detach())
    path = save(untied, tmp_path / "untied.safetensors")
    assert {"head.weight", "tok_emb.weight"} <= _file_keys(path) and read_header(path).tied == {}
    loaded = load(path).eval()
    assert loaded.head.weight is not loaded.tok_emb.weight and torch.equal(loaded(tokens), untied(tokens))


def test_conversion_checks_parameters_over_one_storage_as_tied():
    from zoo.interop.common import ConversionError, load_exact
    target = nn.Module()
    target.a = nn.Parameter(torch.zeros(3))
    target.b = nn.Parameter(target.a.detach())  # another object over the same bytes: one tensor
    with pytest.raises(ConversionError, match="'a' and 'b' are one tied tensor"):
        load_exact(target, {"a": torch.ones(3), "b": torch.full((3,), 2.0)}, "test")
    load_exact(target, {"a": torch.ones(3), "b": torch.ones(3)}, "test")
    assert torch.equal(target.b, torch.ones(3))


def test_encoder_decoder_shares_one_matrix_three_ways(tmp_path):
    model = tiny_model("encoder_decoder")
    path = save(model, tmp_path / "t.safetensors")
    keys = _file_keys(path)
    assert "tgt_emb.weight" in keys and not {"src_emb.weight", "head.weight"} & keys
    assert read_header(path).tied == {"src_emb.weight": "tgt_emb.weight", "head.weight": "tgt_emb.weight"}
    loaded = load(path)
    assert loaded.src_emb.weight is loaded.tgt_emb.weight is loaded.head.weight
    assert loaded.src_emb.weight.data_ptr() == loaded.head.weight.data_ptr()


def test_derived_tables_are_not_stored_but_recomputed(tmp_path):
    model = tiny_model("decoder", ["position.kind=sinusoidal"])
    keys = _file_keys(save(model, tmp_path / "s.safetensors"))
    assert not any(k.startswith("position.") for k in keys)
    loaded = load(tmp_path / "s.safetensors")
    assert torch.equal(loaded.position.weight, sinusoid_table(32, 32))
    rope = tiny_model("decoder", ["position.kind=rope"])
    assert not any("inv_freq" in k for k in _file_keys(save(rope, tmp_path / "r.safetensors")))
    assert torch.equal(load(tmp_path / "r.safetensors").position.inv_freq, rope_frequencies(8, 10000.0))


def test_bf16_export_halves_the_file_and_loads(tmp_path):
    model = tiny_model("decoder", ["d_model=64", "block.ffn.hidden=256", "vocab_size=500"]).eval()
    fp32 = save(model, tmp_path / "fp32.safetensors")
    bf16 = save(model, tmp_path / "bf16.safetensors", dtype=torch.bfloat16)
    data32 = fp32.stat().st_size - 8 - _header_length(fp32)
    data16 = bf16.stat().st_size - 8 - _header_length(bf16)
    assert 2 * data16 == data32 and bf16.stat().st_size < 0.52 * fp32.stat().st_size
    assert read_header(bf16).dtypes() == {"bfloat16": len(_file_keys(bf16))}
    # by default a file loads in the dtype it was stored in, as if built in that dtype
    loaded = load(bf16).eval()
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    reference = model.to(torch.bfloat16)
    for a, b in zip(reference.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    tokens = example_inputs(model)[0]
    with torch.no_grad():
        assert torch.equal(loaded(tokens), reference(tokens))
    # or in the dtype asked for
    up = load(bf16, dtype=torch.float32)
    assert {p.dtype for p in up.parameters()} == {torch.float32}
    assert torch.equal(up.tok_emb.weight, reference.tok_emb.weight.float())
    with pytest.raises(ValueError, match="floating-point torch.dtype"):
        load(bf16, dtype=torch.int8)


def test_load_weights_into_a_built_model(tmp_path):
    source = tiny_model("decoder", seed=0).eval()
    path = save(source, tmp_path / "w.safetensors")
    target = tiny_model("decoder", seed=1).eval()
    tokens = example_inputs(source)[0]
    assert not torch.equal(target(tokens), source(tokens))
    assert load_weights(target, path) is target
    with torch.no_grad():
        assert torch.equal(target(tokens), source(tokens))
    assert target.head.weight is target.tok_emb.weight
    # into a model of another dtype: cast on the way in
    half = tiny_model("decoder", seed=2).to(torch.bfloat16)
    load_weights(half, path)
    assert half.tok_emb.weight.dtype == torch.bfloat16
    assert torch.equal(half.tok_emb.weight, source.tok_emb.weight.to(torch.bfloat16))


def test_loading_never_unpickles(tmp_path, monkeypatch):
    path = save(tiny_model("encoder"), tmp_path / "m.safetensors")

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling on the loading path")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    load_weights(load(path), path)
    with open(path, "rb") as f:  # a safetensors file: 8-byte header length, then JSON
        f.read(8)
        assert f.read(1) == b"{"


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    save(tiny_model("decoder", seed=0), path)
    before = path.read_bytes()

    def crash(f, entry, tensor):
        f.write(b"half a tensor")
        raise OSError("disk full")

    monkeypatch.setattr(zoo.shards, "_write_tensor", crash)
    with pytest.raises(OSError, match="disk full"):
        save(tiny_model("decoder", seed=1), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary file left behind
    monkeypatch.undo()
    save(tiny_model("decoder", seed=1), path)
    assert path.read_bytes() != before and [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


_PEAK_CPU = """
import sys, torch, zoo
torch.set_num_threads(1)
def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key))
    return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
before = status("VmRSS:")
model = zoo.load(sys.argv[1])
assert not any(p.is_meta for p in model.parameters())
print(status("VmHWM:") - before)
"""


@pytest.mark.slow
def test_load_on_cpu_needs_the_model_memory_once(tmp_path):
    """Peak resident memory of a fresh process that loads a 96 MB file grows by about one copy of
    the weights, not two (a build-then-copy loader would need both the initialised model and the file)."""
    import subprocess
    import sys

    spec = tiny_spec("decoder", ["d_model=512", "n_layers=6", "block.ffn.hidden=2048", "vocab_size=16000",
                                 "position.kind=rope", "head.tied=false", "block.attention.n_heads=8"])
    model = zoo.build(spec, seed=0)
    path = save(model, tmp_path / "big.safetensors")
    weight_bytes = 4 * zoo.count_parameters(model)
    assert weight_bytes > 80e6
    del model
    run = subprocess.run([sys.executable, "-c", _PEAK_CPU, str(path)], capture_output=True, text=True, check=True)
    peak = int(run.stdout.split()[-1])
    print(f"peak grew by {peak / weight_bytes:.2f}x the weights")
    assert peak < 1.4 * weight_bytes, f"peak grew by {peak:,} B for {weight_bytes:,} B of weights"


def _cuda_load_needs_the_model_memory_once(tmp_path, device="cuda"):
    spec = tiny_spec("decoder", ["d_model=256", "n_layers=4", "block.ffn.hidden=1024", "vocab_size=8000",
                                 "position.kind=rope", "head.tied=false"])
    model = zoo.build(spec, seed=0).eval()
    path = save(model, tmp_path / "big.safetensors")
    weight_bytes = 4 * zoo.count_parameters(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    loaded = load(path, device=device).eval()
    peak = torch.cuda.max_memory_allocated() - start
    assert all(p.device.type == "cuda" for p in loaded.parameters())
    assert loaded.position.inv_freq.device.type == "cuda"
    assert peak < 1.1 * weight_bytes, f"peak {peak:,} B for {weight_bytes:,} B of weights"
    tokens = example_inputs(model)[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens.cuda()).cpu(), model(tokens), rtol=1e-4, atol=1e-4)


if torch.cuda.is_available():  # collected only where there is a GPU to measure
    test_load_onto_cuda_needs_the_model_memory_once = _cuda_load_needs_the_model_memory_once


# -------------------------------------------------------------------------------------- bad files
@pytest.fixture
def saved(tmp_path):
    return save(tiny_model("decoder"), tmp_path / "good.safetensors")


def _load_error(path, match: str) -> str:
    with pytest.raises(LoadError, match=match) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and str(path.name) in message
    return message


def test_missing_and_unreadable_files(tmp_path, saved):
    _load_error(tmp_path / "nothing.safetensors", "no file at")
    not_safetensors = tmp_path / "spec.yaml"
    not_safetensors.write_text("family: decoder\n")
    _load_error(not_safetensors, "is not a readable safetensors file")


def test_truncated_file(tmp_path, saved):
    data = saved.read_bytes()
    for cut in (len(data) - 5, 8 + _header_length(saved) // 2, 4):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        _load_error(bad, r"not a readable safetensors file \(truncated or corrupt\?\)")


def test_flipped_header_bytes(tmp_path, saved):
    data = bytearray(saved.read_bytes())
    for i, where in enumerate((0, 7, 8, 8 + _header_length(saved) // 3)):
        bad = tmp_path / f"flip{i}.safetensors"
        flipped = data.copy()
        flipped[where] ^= 0xFF
        bad.write_bytes(bytes(flipped))
        _load_error(bad, "not a readable safetensors file|not valid JSON|cannot use the spec")


def test_file_without_spec(tmp_path, saved):
    bare = _rewrite(saved, tmp_path / "bare.safetensors", metadata={})
    _load_error(bare, "has no zoo spec in its metadata .* use zoo.load_weights")
    load_weights(tiny_model("decoder", seed=3), bare)  # the weights alone still load into a built model


def test_dropped_tensor(tmp_path, saved):
    bad = _rewrite(saved, tmp_path / "drop.safetensors", drop=["stack.blocks.1.ffn.fc1.weight"])
    _load_error(bad, r"does not fit its spec \(gpt2-small\): missing tensor stack.blocks.1.ffn.fc1.weight$")
    tied = _rewrite(saved, tmp_path / "drop_tied.safetensors", drop=["tok_emb.weight"])
    _load_error(tied, r"missing tensor tok_emb.weight \(tied with head.weight\)")


def test_unexpected_and_doubly_stored_tensors(tmp_path, saved):
    extra = _rewrite(saved, tmp_path / "extra.safetensors", tensors={"adapter.weight": torch.zeros(2, 2)})
    _load_error(extra, "unexpected tensor adapter.weight")
    twice = _rewrite(saved, tmp_path / "twice.safetensors", change=lambda d: {"head.weight": d["tok_emb.weight"].clone()})
    _load_error(twice, "tied tensors stored more than once: tok_emb.weight and head.weight")


def test_changed_shape(tmp_path, saved):
    bad = _rewrite(saved, tmp_path / "shape.safetensors",
                   change=lambda d: {"stack.blocks.0.attn.out.bias": torch.zeros(16)})
    _load_error(bad, r"wrong shape: stack.blocks.0.attn.out.bias is \[16\], the model needs \[32\]")
    # a spec that says otherwise than the tensors: the spec decides what fits
    meta = read_header(saved).metadata
    spec = json.loads(meta["zoo.spec"])
    spec["vocab_size"] = 100
    other = _rewrite(saved, tmp_path / "vocab.safetensors", metadata={**meta, "zoo.spec": json.dumps(spec)})
    _load_error(other, r"wrong shape: tok_emb.weight is \[61, 32\], the model needs \[100, 32\]")


def test_wrong_dtype_kind(tmp_path, saved):
    bad = _rewrite(saved, tmp_path / "int.safetensors", change=lambda d: {"stack.norm.bias": torch.zeros(32, dtype=torch.int32)})
    _load_error(bad, "wrong dtype: stack.norm.bias is int32, the model needs float32")


def test_spec_from_a_newer_zoo(tmp_path, saved):
    meta = read_header(saved).metadata
    newer = _rewrite(saved, tmp_path / "newer.safetensors", metadata={**meta, "zoo.format": str(FORMAT + 1), "zoo.version": "9.0.0"})
    _load_error(newer, rf"is in zoo file format {FORMAT + 1} \(written by zoo 9.0.0\); this zoo \(.*\) reads format {FORMAT} and older; upgrade zoo")
    spec = json.loads(meta["zoo.spec"])
    spec["position"] = {"kind": "xpos", "scale_base": 512}
    unknown = _rewrite(saved, tmp_path / "xpos.safetensors",
                       metadata={**meta, "zoo.version": "9.0.0", "zoo.spec": json.dumps(spec)})
    message = _load_error(unknown, "cannot use the spec in its metadata: .*unknown position kind 'xpos'")
    assert message.endswith(f"(written by zoo 9.0.0, newer than this zoo {zoo.__version__}; upgrade zoo)")
    garbled = _rewrite(saved, tmp_path / "json.safetensors", metadata={**meta, "zoo.spec": '{"family": "decoder",'})
    _load_error(garbled, "the spec in its metadata is not valid JSON")


def test_load_weights_is_strict(tmp_path, saved):
    other = tiny_model("decoder", ["vocab_size=100", "head.tied=false"])
    with pytest.raises(LoadError, match=r"does not fit the DecoderLM: missing tensor head.weight; wrong shape: tok_emb.weight is \[61, 32\], the model needs \[100, 32\]"):
        load_weights(other, saved)
    with pytest.raises(LoadError, match="on the meta device"):
        load_weights(zoo.build(tiny_spec("decoder"), device="meta"), saved)


def test_save_refuses_what_would_not_load(tmp_path):
    with pytest.raises(SaveError, match="without a zoo spec"):
        save(nn.Linear(2, 2), tmp_path / "x.safetensors")
    model = tiny_model("decoder")
    model.adapter = nn.Linear(32, 4)
    with pytest.raises(SaveError, match="does not match its spec .*unexpected tensors adapter.weight, adapter.bias"):
        save(model, tmp_path / "x.safetensors")
    with pytest.raises(SaveError, match="meta device"):
        save(zoo.build(tiny_spec("decoder"), device="meta"), tmp_path / "x.safetensors")
    with pytest.raises(SaveError, match="floating-point"):
        save(tiny_model("decoder"), tmp_path / "x.safetensors", dtype=torch.int8)
    with pytest.raises(SaveError, match="no directory"):
        save(tiny_model("decoder"), tmp_path / "missing" / "x.safetensors")
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------- a user's part with a derived table
@pytest.fixture
def restore_registries():
    saved = {name: (dict(r._specs), dict(r._builders)) for name, r in REGISTRIES.items()}
    yield
    for name, (specs, builders) in saved.items():
        r = zoo.registry(name)
        r._specs.clear(), r._specs.update(specs)
        r._builders.clear(), r._builders.update(builders)


class DecaySpec(PositionSpec):
    kind: Literal["decay"] = "decay"
    rate: float = 0.5


class DecayPosition(Position):
    """Adds rate^position to every channel: a derived table with no ``reset_buffers``."""

    def __init__(self, dim: int, max_len: int, rate: float) -> None:
        super().__init__()
        self.register_buffer("table", rate ** torch.arange(max_len, dtype=torch.float32)[:, None].expand(max_len, dim).clone(), persistent=False)

    def add(self, x, positions):
        return x + self.table[positions].to(x.dtype)


def test_a_part_without_reset_buffers_still_loads(tmp_path, restore_registries):
    @zoo.register("position", "decay", spec=DecaySpec)
    def build_decay(spec, *, dim, max_len, **_):
        return DecayPosition(dim, max_len, spec.rate)

    model = tiny_model("decoder", ["position.kind=decay", "position.rate=0.9"]).eval()
    loaded = load(save(model, tmp_path / "decay.safetensors")).eval()
    assert torch.equal(loaded.position.table, model.position.table)
    tokens = example_inputs(model)[0]
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


def test_saved_files_get_ordinary_permissions(tmp_path):
    import os
    import stat

    mask = os.umask(0o022)
    try:
        path = save(tiny_model("decoder"), tmp_path / "m.safetensors")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.chmod(path, 0o600)
        save(tiny_model("decoder"), path)  # overwriting keeps the file's own permissions
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        from zoo.train import save_checkpoint

        ckpt = save_checkpoint(tmp_path / "c.pt", model=tiny_model("decoder"), step=1)
        assert stat.S_IMODE(ckpt.stat().st_mode) == 0o644
    finally:
        os.umask(mask)
