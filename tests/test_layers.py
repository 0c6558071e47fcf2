"""Stacks whose layers differ (``layers:`` patterns): local and global attention, a RoPE base of their
own, no positions on some layers, another FFN on some layers.

The truths: each layer computes what a block given that layer's own context computes (windows and
rotary modules made here, by hand, not by the stack); cached decoding equals full recomputation
past every window; the summary's per-layer KV cache is the hand count; files and YAML carry the
patterns. (Qwen2's ``layer_types`` against HF are in test_decoder_variants.py.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import zoo
from zoo.components.attention import attention_mask
from zoo.components.block import BlockContext
from zoo.components.position import NoPosition
from zoo.components.rope import RotaryPosition
from zoo.summary import summarize

BASE = ["d_model=32", "n_layers=6", "block.attention.kind=gqa", "block.attention.n_heads=4", "block.attention.n_kv_heads=2",
        "block.ffn.kind=swiglu", "block.ffn.hidden=40", "block.norm.kind=rmsnorm", "position.kind=rope",
        "vocab_size=61", "max_seq_len=64", "dropout.residual=0", "dropout.embedding=0"]
# Gemma-3-like: local layers (window 3, base 10k), every third layer global with a base of its own;
# layer 1 has no positions (NoPE) and a wider FFN.
GEMMA3_LIKE = BASE + [
    "block.attention.window=3",
    "layers=[{at: '2::3', block: {attention: {window: null}}, position: {kind: rope, base: 1000000.0}},"
    " {at: 1, position: {kind: none}, block: {ffn: {hidden: 56}}}]",
]


def _tokens(batch=2, length=13, seed=0):
    return torch.randint(0, 61, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_patterns_resolve_per_layer():
    spec = zoo.load_spec("llama-small", GEMMA3_LIKE)
    layers = spec.stack_layers()
    assert [layer.block.attention.window for layer in layers] == [3, 3, None, 3, 3, None]
    assert [getattr(layer.position, "base", None) for layer in layers] == [None, None, 1e6, None, None, 1e6]
    assert layers[1].position.kind == "none" and layers[1].block.ffn.hidden == 56
    assert [layer.block.ffn.hidden for layer in layers] == [40, 56, 40, 40, 40, 40]
    assert layers[0].block is spec.block  # untouched layers share the model's block spec


def test_each_layer_computes_with_its_own_window_and_position():
    """The model's output equals the blocks run one by one, each with a context made here: its
    window's mask, and a rotary module of its base (or none)."""
    model = zoo.build("llama-small", GEMMA3_LIKE, seed=0).eval()
    x = _tokens()
    T = x.shape[1]
    positions = torch.arange(T)
    own = {None: model.position, "none": NoPosition(), 1e6: RotaryPosition(8, base=1e6)}
    keys = [None, "none", 1e6, None, None, 1e6]
    windows = [3, 3, None, 3, 3, None]
    with torch.no_grad():
        h = model.tok_emb(x)
        for block, key, window in zip(model.stack.blocks, keys, windows):
            mask, causal = attention_mask(q_len=T, k_len=T, causal=True, window=window)
            h = block(h, BlockContext(pos=own[key], positions=positions, mask=mask, is_causal=causal))
        expected = model.head(model.stack.norm(h))
        assert torch.allclose(model(x), expected, atol=1e-6)
        same = [*BASE, "block.attention.window=3", "layers=[{at: 1, block: {ffn: {hidden: 56}}}]"]
        uniform = zoo.build("llama-small", same, seed=0).eval()
        uniform.load_state_dict(model.state_dict())
        assert not torch.allclose(uniform(x), model(x), atol=1e-3)  # the windows and positions change the function


@pytest.mark.parametrize("padded", [False, True])
def test_cached_decoding_equals_recomputation_past_every_window(padded):
    model = zoo.build("llama-small", GEMMA3_LIKE, seed=1).eval()
    x = _tokens(3, 14, seed=2)
    mask = torch.ones_like(x, dtype=torch.bool)
    if padded:
        mask[1, :4] = False  # left padding
    with torch.no_grad():
        full = model(x, mask)
        cache = model.new_cache(20)
        steps = [model(x[:, :5], mask[:, :5], cache=cache)]
        steps += [model(x[:, t : t + 1], mask[:, t : t + 1], cache=cache) for t in range(5, 14)]
    cached = torch.cat(steps, dim=1)
    real = mask.unsqueeze(-1).expand_as(full)
    assert torch.allclose(cached[real], full[real], atol=1e-5)
    local = [layer.k.shape[2] for layer in cache.layers]  # windowed layers keep window - 1 keys
    assert local == [2, 2, 20, 2, 2, 20]


def test_summary_counts_each_layers_cache_and_parameters():
    spec = zoo.load_spec("llama-small", GEMMA3_LIKE)
    s = summarize(spec, seq=40)
    per_token = 2 * (8 + 8)  # G=2 key/value heads of 8, keys and values, in fp32 bytes / 4
    held = [2, 2, 40, 2, 2, 40]  # a window of 3 holds the 2 tokens before the next one; global layers all 40
    assert [row["kv_tokens"] for row in s.layers] == held
    assert s.kv_cache_bytes == sum(per_token * 4 * h for h in held)
    assert s.kv_cache_tokens == 40 and s.kv_cache_bytes_per_token == 6 * per_token * 4
    d, hidden = 32, [40, 56, 40, 40, 40, 40]
    attention = d * (32 + 2 * 16) + 32 * d  # q, k, v (4 x 8, 2 x 8 each) and out
    assert [row["parameters"] for row in s.layers] == [attention + 3 * d * f + 2 * d for f in hidden]
    assert s.parameters == zoo.count_parameters(zoo.build(spec, device="meta"))


def test_files_and_yaml_carry_the_patterns(tmp_path):
    model = zoo.build("llama-small", GEMMA3_LIKE, seed=0).eval()
    zoo.save(model, tmp_path / "m.safetensors")
    loaded = zoo.load(tmp_path / "m.safetensors")
    assert loaded.spec == model.spec and loaded.spec.layers == model.spec.layers
    x = _tokens()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    (tmp_path / "m.yaml").write_text(zoo.to_yaml(model.spec))
    assert zoo.load_spec(tmp_path / "m.yaml") == model.spec
    # overrides of the model's block reach the layers their patterns leave alone
    wider = zoo.load_spec(tmp_path / "m.yaml", ["block.ffn.hidden=48"])
    assert [layer.block.ffn.hidden for layer in wider.stack_layers()] == [48, 56, 48, 48, 48, 48]


def test_zoo_show_prints_the_resolved_layers(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(zoo.to_yaml(zoo.load_spec("llama-small", GEMMA3_LIKE)))
    out = subprocess.run([sys.executable, "-m", "zoo", "show", str(path)], capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("#   ")]
    assert lines == [
        "#   layer 0: pre block, gqa 4h/2kv window 3, swiglu 40, position rope base 10000",
        "#   layer 1: pre block, gqa 4h/2kv window 3, swiglu 56, position none (its own)",
        "#   layer 2: pre block, gqa 4h/2kv, swiglu 40, position rope base 1e+06 (its own)",
        "#   layer 3-4: pre block, gqa 4h/2kv window 3, swiglu 40, position rope base 10000",
        "#   layer 5: pre block, gqa 4h/2kv, swiglu 40, position rope base 1e+06 (its own)",
    ]
    assert zoo.load_spec(path) == zoo.parse_spec(zoo.spec.read_yaml(out, "zoo show"))


def test_activation_checkpointing_keeps_the_gradients():
    torch.manual_seed(0)
    model = zoo.build("llama-small", GEMMA3_LIKE, seed=3)
    x = _tokens()
    model(x).square().mean().backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.stack.checkpointing = True
    model(x).square().mean().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, plain[n], atol=1e-6), n


def test_encoder_decoder_patterns_pick_their_stack():
    spec = zoo.load_spec("transformer-base", ["d_model=32", "n_layers=2", "block.attention.n_heads=4", "block.ffn.hidden=40",
                                              "vocab_size=61", "max_seq_len=32",
                                              "layers=[{at: 1, stack: decoder, block: {ffn: {hidden: 24}}}]"])
    assert [layer.block.ffn.hidden for layer in spec.stack_layers("encoder")] == [40, 40]
    assert [layer.block.ffn.hidden for layer in spec.stack_layers("decoder")] == [40, 24]
    model = zoo.build(spec, seed=0)
    assert model.decoder.blocks[1].ffn.fc1.out_features == 24 and model.encoder.blocks[1].ffn.fc1.out_features == 40
