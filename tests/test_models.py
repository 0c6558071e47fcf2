"""Every component combination, for every family it applies to: builds, shapes, gradients,
causality, padding invariance, determinism."""

from __future__ import annotations

import itertools

import pytest
import torch

import zoo
from conftest import covering, example_inputs, pairwise, tiny_model

POSITIONS = ["none", "sinusoidal", "learned", "rope", "alibi"]
VIT_POSITIONS = ["none", "learned", "sincos2d"]
FFNS = ["relu", "gelu", "silu", "swiglu", "geglu"]
NORMS = ["layernorm", "rmsnorm"]
PLACEMENTS = ["pre", "post"]
ATTENTIONS = {"mha": [], "gqa": ["block.attention.n_kv_heads=2"], "mqa": []}


def combo_overrides(position: str, ffn: str, norm: str, block: str, attention: str) -> list[str]:
    return [
        f"position.kind={position}",
        f"block.ffn.kind={ffn}",
        f"block.norm.kind={norm}",
        f"block.kind={block}",
        f"block.attention.kind={attention}",
        *ATTENTIONS[attention],
    ]


def combos(positions):
    """Combinations of the position, FFN, norm, block and attention kinds in which every three choices
    occur together (the whole suite: 77 of the 300 of a text family), and of those every two (the fast
    lane: the rest are slow)."""
    dims = (positions, FFNS, NORMS, PLACEMENTS, list(ATTENTIONS))
    fast = pairwise(*dims)
    for c in sorted(covering(*dims, strength=3) | fast):
        yield pytest.param(*c, id="-".join(c), marks=() if c in fast else pytest.mark.slow)


CASES = [pytest.param(family, *c.values, id=f"{family}-{c.id}", marks=c.marks)
         for family, positions in [("decoder", POSITIONS), ("encoder", POSITIONS), ("encoder_decoder", POSITIONS),
                                   ("vit", VIT_POSITIONS)] for c in combos(positions)]
CASES += [pytest.param(family, "relative_bias", "geglu", "rmsnorm", "pre", "mha", id=f"{family}-relative_bias-geglu-rmsnorm-pre-mha")
          for family in ("decoder", "encoder", "encoder_decoder")]  # T5's


def output_shape(model, inputs) -> tuple:
    spec = model.spec
    if spec.family == "vit":
        return (inputs[0].shape[0], spec.num_classes)
    tokens = inputs[-1]
    return (*tokens.shape, spec.vocab_size)


@pytest.mark.parametrize("family,position,ffn,norm,block,attention", CASES)
def test_combination(family, position, ffn, norm, block, attention):
    model = tiny_model(family, combo_overrides(position, ffn, norm, block, attention))
    assert model.spec.position.kind == position and model.spec.block.ffn.kind == ffn
    check_invariants(model)


BLOCK_VARIANTS = {
    "layer scale": ["block.layer_scale=0.1"],
    "qk-norm per head": ["block.attention.qk_norm={kind: layernorm}"],
    "qk-norm whole, rope, gqa": ["block.attention.qk_norm={kind: rmsnorm, scope: all}", "position.kind=rope",
                                "block.attention.kind=gqa", "block.attention.n_kv_heads=2"],
    "post-norm, layer scale, qk-norm": ["block.kind=post", "block.layer_scale=0.1",
                                        "block.attention.qk_norm={kind: rmsnorm}"],
}


@pytest.mark.parametrize("variant", BLOCK_VARIANTS)
@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder", "vit"])
def test_block_variants(family, variant):
    overrides = BLOCK_VARIANTS[variant]
    if family == "vit" and "position.kind=rope" in overrides:
        overrides = [o for o in overrides if o != "position.kind=rope"]
    model = tiny_model(family, overrides)
    check_invariants(model)
    if model.spec.block.layer_scale is not None:
        gammas = [p for name, p in model.named_parameters() if name.endswith("gamma")]
        per_layer = 5 if family == "encoder_decoder" else 2  # encoder: attention, FFN; decoder: + cross-attention
        assert len(gammas) == per_layer * model.spec.n_layers
    if model.spec.block.attention.qk_norm is not None:
        assert any(name.endswith("q_norm.weight") for name, _ in model.named_parameters())


# Options only some models have (Mistral, Qwen2, GPT-NeoX, OLMo 2, Gemma), with the positions and
# attention kinds of the combinations above; a variant that sets the position meets the attention kinds only.
VARIANTS = {
    "window 3": ["block.attention.window=3"],
    "qkv bias only": ["block.attention.out_bias=false"],
    "partial rope": ["position.kind=rope", "position.fraction=0.5"],
    "parallel": ["block.kind=parallel", "block.shared_norm=false"],
    "parallel shared norm": ["block.kind=parallel", "block.shared_norm=true", "block.norm.kind=rmsnorm"],
    "post-sublayer norms": ["block.kind=post_sublayer"],
    "gemma norms": ["block.norm.kind=rmsnorm", "block.norm.unit_offset=true", "embedding.scale=true", "embedding.round_scale=true"],
    "olmo 2": ["block.kind=post_sublayer", "block.norm.kind=rmsnorm", "block.attention.qk_norm={kind: rmsnorm, scope: all}"],
    "layer scale, parallel, qk-norm": ["block.layer_scale=0.1", "block.kind=parallel", "block.shared_norm=false",
                                       "block.attention.qk_norm={kind: layernorm}"],
    "all at once": ["block.attention.window=4", "block.attention.out_bias=false", "position.kind=rope", "position.fraction=0.75",
                    "block.kind=parallel", "block.norm.kind=rmsnorm", "block.norm.unit_offset=true",
                    "block.attention.qk_norm={kind: rmsnorm, scope: all}", "block.layer_scale=0.5"],
}
VARIANT_POSITIONS = ["rope", "alibi", "learned"]
# which families each variant applies to (a window is causal self-attention; a parallel block has no cross-attention)
VARIANT_FAMILIES = {"window 3": ["decoder"], "all at once": ["decoder"], "partial rope": ["decoder", "encoder", "encoder_decoder"],
                    "parallel": ["decoder", "encoder", "vit"], "layer scale, parallel, qk-norm": ["decoder", "encoder", "vit"],
                    "parallel shared norm": ["decoder", "encoder", "vit"], "gemma norms": ["decoder", "encoder", "encoder_decoder"]}


def variant_cases():
    """Each variant on the decoder with every position and attention kind (the diagonal of the two in the
    fast lane: each position once, each attention once), and on the other families it applies to."""
    for name, overrides in VARIANTS.items():
        positions = ["rope"] if "position.kind=rope" in overrides else VARIANT_POSITIONS
        for (i, position), (j, attention) in itertools.product(enumerate(positions), enumerate(ATTENTIONS)):
            diagonal = i == j or (len(positions) == 1 and j == 0)
            yield pytest.param("decoder", name, position, attention, id=f"decoder-{name}-{position}-{attention}",
                               marks=() if diagonal else pytest.mark.slow)
        for family in VARIANT_FAMILIES.get(name, ["encoder", "encoder_decoder", "vit"]):
            if family != "decoder":  # the other families once, with their preset's positions
                yield pytest.param(family, name, None, "gqa", id=f"{family}-{name}")


def variant_model(family: str, name: str, position: str | None, attention: str, extra: list[str] = ()):
    overrides = [*VARIANTS[name], *extra]
    if position is not None and "position.kind=rope" not in overrides:
        overrides.append(f"position.kind={position}")
    return tiny_model(family, [f"block.attention.kind={attention}", *ATTENTIONS[attention], *overrides])


@pytest.mark.parametrize("family,variant,position,attention", list(variant_cases()))
def test_variant(family, variant, position, attention):
    check_invariants(variant_model(family, variant, position, attention))


@pytest.mark.parametrize("variant", ["window 3", "qkv bias only", "parallel", "olmo 2", "all at once"])
def test_gqa_with_as_many_key_value_heads_as_heads_is_mha(variant):
    gqa = variant_model("decoder", variant, "rope", "gqa", ["block.attention.n_kv_heads=4"]).eval()
    mha = variant_model("decoder", variant, "rope", "mha").eval()
    x = example_inputs(mha)[0]
    with torch.no_grad():
        assert torch.equal(gqa(x), mha(x))


def test_a_window_as_long_as_the_sequence_is_full_attention():
    """A window >= max_seq_len (as HF configs often have) computes what full attention computes."""
    full = tiny_model("decoder", ["position.kind=rope"]).eval()
    windowed = tiny_model("decoder", ["position.kind=rope", "block.attention.window=32"]).eval()
    short = tiny_model("decoder", ["position.kind=rope", "block.attention.window=4"]).eval()
    x = example_inputs(full, length=20)[0]
    with torch.no_grad():
        assert torch.equal(windowed(x), full(x))
        torch.testing.assert_close(short(x)[:, :4], full(x)[:, :4], rtol=0, atol=1e-5)
        assert not torch.allclose(short(x), full(x))


VIT_VARIANTS = {
    "registers, patch-only positions": ["reg_tokens=3", "prefix_positions=false"],
    "map pooling, no class token, registers": ["pool=map", "class_token=false", "reg_tokens=2"],
    "map pooling, fc_norm, sincos2d, dynamic size": ["pool={kind: map, n_heads: 2, hidden: 20}", "fc_norm=true",
                                                     "position.kind=sincos2d", "dynamic_size=true"],
    "mean pooling, registers, post-norm, layer scale": ["pool=mean", "reg_tokens=1", "block.kind=post",
                                                        "block.layer_scale=0.1"],
}


@pytest.mark.parametrize("variant", VIT_VARIANTS)
def test_vit_variants(variant):
    model = tiny_model("vit", VIT_VARIANTS[variant])
    check_invariants(model)
    spec, x = model.spec, example_inputs(model)[0]
    assert model.features(x).prefix[0].shape == (x.shape[0], spec.n_prefix, spec.d_model)
    if spec.dynamic_size:  # other sizes give logits; the model's own size is unchanged
        assert model(torch.randn(2, 3, 24, 8)).shape == (2, spec.num_classes)


def check_invariants(model):
    """Shapes, finite non-zero gradients, determinism, causality and padding invariance."""
    family = model.spec.family
    inputs = example_inputs(model)
    out = model(*inputs)
    assert out.shape == output_shape(model, inputs)
    assert torch.isfinite(out).all()

    # every parameter gets a finite, non-zero gradient
    (out.float().square().mean()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"

    # eval mode is deterministic
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(*inputs), model(*inputs))
        if family in ("decoder", "encoder_decoder"):
            check_causal(model, inputs)
        if family != "vit":
            check_padding(model, inputs)


def check_causal(model, inputs):
    """Changing tokens after position t never changes the logits up to t."""
    tokens = inputs[-1]
    t = tokens.shape[1] // 2
    changed = tokens.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % model.spec.vocab_size
    before, after = model(*inputs[:-1], tokens), model(*inputs[:-1], changed)
    torch.testing.assert_close(before[:, : t + 1], after[:, : t + 1], rtol=0, atol=1e-5)
    assert not torch.allclose(before[:, t + 1 :], after[:, t + 1 :])


def check_padding(model, inputs):
    """Appending padding (or, for decoders, prepending it) never changes the outputs of real tokens."""
    pad = 4
    spec = model.spec
    if spec.family == "decoder":
        tokens = inputs[0]
        padded = torch.cat([torch.full((tokens.shape[0], pad), 3), tokens], dim=1)  # left padding
        mask = torch.ones_like(padded, dtype=torch.bool)
        mask[:, :pad] = False
        torch.testing.assert_close(model(padded, mask)[:, pad:], model(tokens), rtol=0, atol=1e-5)
    elif spec.family == "encoder":
        tokens = inputs[0]
        padded = torch.cat([tokens, torch.full((tokens.shape[0], pad), 5)], dim=1)
        mask = torch.ones_like(padded, dtype=torch.bool)
        mask[:, -pad:] = False
        torch.testing.assert_close(model(padded, mask)[:, :-pad], model(tokens), rtol=0, atol=1e-5)
    else:
        src, tgt = inputs
        src_p = torch.cat([src, torch.full((src.shape[0], pad), 5)], dim=1)
        tgt_p = torch.cat([tgt, torch.full((tgt.shape[0], pad), 5)], dim=1)
        src_m = torch.ones_like(src_p, dtype=torch.bool)
        src_m[:, -pad:] = False
        tgt_m = torch.ones_like(tgt_p, dtype=torch.bool)
        tgt_m[:, -pad:] = False
        out = model(src_p, tgt_p, src_padding_mask=src_m, tgt_padding_mask=tgt_m)
        torch.testing.assert_close(out[:, :-pad], model(src, tgt), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_rows_of_a_ragged_batch_equal_their_unpadded_selves(family):
    """A batch with rows of different lengths gives each row what it gives alone."""
    model = tiny_model(family, ["position.kind=rope"] if family == "decoder" else []).eval()
    lengths = [3, 7, 5]
    T = max(lengths)
    rows = [torch.randint(0, model.spec.vocab_size, (1, n)) for n in lengths]
    batch = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        if family == "decoder":  # left padding, as for generation
            batch[i, T - lengths[i]:], mask[i, T - lengths[i]:] = r[0], True
        else:
            batch[i, : lengths[i]], mask[i, : lengths[i]] = r[0], True
    with torch.no_grad():
        if family == "encoder_decoder":
            tgt = torch.randint(0, model.spec.vocab_size, (len(rows), 4))
            out = model(batch, tgt, src_padding_mask=mask)
            for i, r in enumerate(rows):
                torch.testing.assert_close(out[i : i + 1], model(r, tgt[i : i + 1]), rtol=0, atol=1e-5)
            return
        out = model(batch, mask)
        for i, r in enumerate(rows):
            real = out[i : i + 1][mask[i : i + 1]]
            torch.testing.assert_close(real, model(r)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder", "vit"])
def test_dropout_acts_in_training_only(family):
    model = tiny_model(family, ["dropout.residual=0.5", "dropout.attention=0.5"])
    inputs = example_inputs(model)
    model.train()
    assert not torch.equal(model(*inputs), model(*inputs))
    model.eval()
    assert torch.equal(model(*inputs), model(*inputs))


def test_weight_tying():
    dec = tiny_model("decoder")
    assert dec.head.weight is dec.tok_emb.weight
    ed = tiny_model("encoder_decoder")
    assert ed.src_emb.weight is ed.tgt_emb.weight is ed.head.weight
    untied = tiny_model("encoder_decoder", ["share_embeddings=false", "head.tied=false", "src_vocab_size=40"])
    assert untied.src_emb.weight is not untied.tgt_emb.weight and untied.head.weight is not untied.tgt_emb.weight
    assert untied.src_emb.weight.shape[0] == 40
    enc = tiny_model("encoder")
    assert enc.head.proj.weight is enc.tok_emb.weight
    # counts: a tied matrix counts once
    n_tied, n_untied = zoo.count_parameters(dec), zoo.count_parameters(tiny_model("decoder", ["head.tied=false"]))
    assert n_untied - n_tied == dec.spec.vocab_size * dec.spec.d_model


def test_embedding_scale_multiplies_by_sqrt_d_model():
    scaled = tiny_model("encoder_decoder", ["embedding.scale=true"])
    tokens = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(scaled.src_emb(tokens), scaled.src_emb.weight[tokens] * 32**0.5)


def test_encoder_classifier_and_segments():
    model = tiny_model("encoder", ["classifier.num_labels=3"]).eval()
    tokens = torch.randint(0, 61, (2, 6))
    assert model.classify(tokens).shape == (2, 3)
    types = torch.zeros_like(tokens)
    types[:, 3:] = 1
    assert not torch.allclose(model(tokens, token_types=types), model(tokens))
    no_head = tiny_model("encoder")
    with pytest.raises(ValueError, match="no classification head; set classifier"):
        no_head.classify(tokens)


def test_vit_mean_pooling_with_fc_norm_and_no_class_token():
    model = tiny_model("vit", ["pool=mean", "class_token=false", "fc_norm=true"])
    assert model.cls_token is None and isinstance(model.stack.norm, torch.nn.Identity)
    assert model(*example_inputs(model)).shape == (3, 7)


def test_vit_conv_stem_sees_across_patch_borders():
    """Without a stem a token depends on its own patch only; a stride-1 3x3 stem layer lets the
    pixel next to a patch border reach the neighbouring token too, and the token grid is unchanged."""
    image = torch.randn(1, 3, 16, 16)
    nudged = image.clone()
    nudged[0, :, 0, 3] += 1.0  # the last column of patch (0, 0), next to patch (0, 1)
    for stem, reaches in (([], False), (["stem.channels=[8]"], True)):
        model = tiny_model("vit", stem).eval()
        a, b = model.patch_embed(image), model.patch_embed(nudged)
        assert a.shape == (1, 16, model.spec.d_model)
        assert not torch.equal(a[0, 0], b[0, 0])
        assert (not torch.allclose(a[0, 1], b[0, 1])) == reaches
        assert torch.equal(a[0, 2:], b[0, 2:])


def test_vit_conv_stem_strides_shrink_the_projection():
    """ViTC's layout: four stride-2 layers then a 1x1 projection keep patch 16's 14 x 14 grid."""
    spec = zoo.load_spec("vit-tiny-16", ["stem.channels=[24, 48, 96, 192]", "stem.strides=[2, 2, 2, 2]"])
    model = zoo.build(spec, device="meta")
    assert model.patch_embed.proj.kernel_size == (1, 1) and model.patch_embed.proj.in_channels == 192
    assert model(torch.empty(2, 3, 224, 224, device="meta")).shape == (2, 1000)
    half = tiny_model("vit", ["stem.channels=[8, 8]", "stem.strides=[2, 1]"])
    assert half.patch_embed.proj.kernel_size == (2, 2)
    assert half(*example_inputs(half)).shape == (3, 7)


def test_vit_conv_stem_batch_statistics_survive_save_and_load(tmp_path):
    model = tiny_model("vit", ["stem.channels=[8]"])
    model.train()(torch.randn(4, 3, 16, 16) * 3 + 1)  # moves BatchNorm's running statistics
    bn = model.patch_embed.stem[1]
    assert int(bn.num_batches_tracked) == 1 and not torch.allclose(bn.running_mean, torch.zeros(8))
    zoo.save(model, tmp_path / "m.safetensors")
    back = zoo.load(tmp_path / "m.safetensors")
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(back.eval()(x), model.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "family,call,message",
    [
        ("decoder", lambda m: m(torch.randn(2, 5)), "tokens: expected integer token ids of shape"),
        ("decoder", lambda m: m(torch.tensor([[1, 2, 99]])), r"token ids must be in \[0, 61\)"),
        ("decoder", lambda m: m(torch.zeros(1, 40, dtype=torch.long)), "exceeds max_seq_len \\(32\\)"),
        ("decoder", lambda m: m(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 4)), "padding_mask: expected a boolean mask"),
        ("encoder", lambda m: m(torch.zeros(2, 5, dtype=torch.long), token_types=torch.ones(2, 5, dtype=torch.long)),
         "no segment embeddings"),
        ("encoder_decoder", lambda m: m(torch.zeros(5, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)), "src: expected"),
        ("vit", lambda m: m(torch.randn(2, 3, 32, 32)), r"images: expected a float tensor \[batch, 3, 16, 16\]"),
        ("vit", lambda m: m(torch.zeros(2, 3, 16, 16, dtype=torch.uint8)),
         r"images: expected a float tensor, got torch.uint8; convert pixels to floats .*images.float\(\) / 255"),
        ("encoder_decoder", lambda m: m(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long)),
         r"tgt_in: 3 target rows, but the source \(memory\) is \(2, 3, 32\): one source row per target row"),
        ("encoder_decoder", lambda m: m.decode(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 3, 32), torch.ones(2, 4, dtype=torch.bool)),
         r"src_padding_mask: expected the source's shape \(2, 3\), got \(2, 4\)"),
        ("decoder", lambda m: m(torch.zeros(1, 3, dtype=torch.long), positions=torch.tensor([[-1, 0, 1]])),
         "positions: a token's position counts from 0 in its document, got -1; give positions >= 0"),
        ("decoder", lambda m: m(torch.zeros(1, 3, dtype=torch.long), positions=torch.zeros(1, 3)),
         "positions: expected integer positions, got torch.float32"),
        ("decoder", lambda m: [m(torch.zeros(r, 2, dtype=torch.long), cache=c) for c in [m.new_cache(8)] for r in (2, 3)],
         "cache: it holds 2 rows, and 3 came to continue them; a cache continues the batch it began with"),
        ("encoder", lambda m: m(torch.zeros(2, 3, dtype=torch.long), token_types=torch.zeros(2, 4, dtype=torch.long)),
         r"token_types: shape \(2, 4\) does not fit tokens \(2, 3\); give one segment id per token"),
        ("encoder_decoder", lambda m: m.decode(torch.zeros(2, 2, dtype=torch.long), None),
         r"memory: None reads the source's keys from the cache, which holds none yet; pass encode\(src\)"),
    ],
)
def test_bad_inputs_fail_clearly(family, call, message):
    extra = ["type_vocab_size=0"] if family == "encoder" and "token_types: shape" not in message else []
    model = tiny_model(family, extra)
    with pytest.raises(ValueError, match=message):
        call(model)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder", "vit"])
@pytest.mark.parametrize("position", ["learned", "alibi", "relative_bias"])
def test_an_empty_batch_gives_an_empty_output(family, position):
    """No rows in, no rows out, of the shape a row would have; a row alone is the reference."""
    if family == "vit" and position != "learned":
        return
    model = tiny_model(family, [] if family == "vit" else [f"position.kind={position}"]).eval()
    inputs = model.example_inputs(1, 5) if family != "vit" else (torch.randn(1, 3, 16, 16),)
    one = model(*inputs)
    empty = model(*(x[:0] for x in inputs))
    assert empty.shape == (0, *one.shape[1:]) and empty.dtype == one.dtype
    if family == "decoder":
        none = inputs[0][:0]
        assert model(none, torch.ones(0, 5, dtype=torch.bool)).shape == (0, *one.shape[1:])
        assert model(none, documents=none).shape == model(none, positions=none).shape == (0, *one.shape[1:])
        assert model(none, documents=none, targets=none).item() == 0.0  # a sum over no tokens


def test_rope_and_alibi_allow_sequences_longer_than_max_seq_len():
    for kind in ("rope", "alibi"):
        model = tiny_model("decoder", [f"position.kind={kind}"])
        assert model(torch.zeros(1, 40, dtype=torch.long)).shape == (1, 40, 61)


def test_build_on_meta_device_and_dtype_and_seed():
    meta = zoo.build("gpt2-small", device="meta")
    assert all(p.device.type == "meta" for p in meta.parameters())
    assert zoo.count_parameters(meta) == 124_439_808
    half = zoo.build("gpt2-small", ["d_model=32", "n_layers=1", "block.attention.n_heads=2"], dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    a, b = tiny_model("decoder", seed=3), tiny_model("decoder", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c = tiny_model("decoder", seed=4)
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)
    assert a.spec == zoo.load_spec(a.spec)
    for kwargs, message in (({"dtype": "float16"}, "dtype must be a floating-point torch.dtype such as torch.bfloat16, got 'float16'"),
                            ({"dtype": torch.int64}, "dtype must be a floating-point torch.dtype"),
                            ({"device": "gpu"}, "device: 'gpu' is not a torch device; use e.g. 'cpu', 'cuda'")):
        with pytest.raises(ValueError, match=message):
            zoo.build("gpt2-small", **kwargs)


def test_embedding_norm_in_every_text_family():
    for family in ("decoder", "encoder", "encoder_decoder"):
        model = tiny_model(family, ["embedding.norm=true"])
        norms = [n for n, _ in model.named_modules() if n.endswith("emb_norm") and not isinstance(_, torch.nn.Identity)]
        assert norms, family
        out = model(*example_inputs(model))
        out.float().mean().backward()
        for n in norms:
            assert model.get_submodule(n).weight.grad is not None
