"""Reference parity: the same weights in zoo and in timm / HF transformers / torch.nn give the same
outputs, converted either way; presets have the reference classes' parameter counts; what zoo
cannot express is refused by name.

Reference models are built from configs with random weights (no downloads). Every parameter is
randomised (LayerNorm weights around 1, not exactly 1), so a swapped or transposed tensor shows.
Outputs are compared in fp32, eval mode, at real (unpadded) tokens, within 1e-5, with zoo's linears
on ATen as the references' are: this file checks the mapping of weights, and a different GEMM kernel
alone moves a 12-layer ViT's logits (~10) by up to 4e-5. zoo's oneDNN linear is checked against
float64 in test_linear.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import max_diff, positions, randomize
from torch import nn

import zoo
from zoo.interop import ConversionError, from_hf, from_timm, hf_config, hf_spec, timm_spec, to_hf, to_timm

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-5


V = 61  # a small vocabulary


def assert_same_state(a: nn.Module, b: nn.Module, unread: tuple[str, ...] = ()) -> None:
    """Round trip: every tensor comes back bit for bit (but for ``unread`` ones: tensors an untied HF
    model keeps and its forward pass never reads, so zoo holds no copy)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() - set(unread) == sb.keys() - set(unread)
    for name in sa.keys() - set(unread):
        assert torch.equal(sa[name], sb[name]), name


def tokens(batch: int = 3, length: int = 9, seed: int = 1, vocab: int = V) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def right_padding(batch: int = 3, length: int = 9) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, length - 3:] = False
    mask[2, 2:] = False
    return mask


def left_padding(batch: int = 3, length: int = 9) -> torch.Tensor:
    return right_padding(batch, length).flip(1)


# --------------------------------------------------------------------------------------- GPT-2
GPT2 = {
    "gelu_new": dict(n_embd=32, n_head=4, n_layer=2),
    "odd heads, untied": dict(n_embd=24, n_head=3, n_layer=2, n_inner=40, activation_function="gelu",
                              layer_norm_epsilon=1e-6, tie_word_embeddings=False),
    "relu, one head": dict(n_embd=16, n_head=1, n_layer=1, activation_function="relu"),
}


def gpt2(**kw):
    config = transformers.GPT2Config(vocab_size=V, n_positions=32, bos_token_id=0, eos_token_id=0, **kw)
    return randomize(transformers.GPT2LMHeadModel(config))


@pytest.mark.parametrize("kw", GPT2.values(), ids=GPT2)
def test_gpt2_both_ways(kw):
    hf = gpt2(**kw)
    model = from_hf(hf)
    x, mask = tokens(), left_padding()
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < ATOL
        ref = hf(x, attention_mask=mask, position_ids=positions(mask)).logits
        assert max_diff(model(x, mask), ref, mask) < ATOL
        back = to_hf(model, bos_token_id=0, eos_token_id=0).eval()
        assert max_diff(back(x).logits, model(x)) < ATOL
    assert_same_state(hf, back)
    assert (model.head.weight is model.tok_emb.weight) == hf.config.tie_word_embeddings


# ---------------------------------------------------------------------------------------- BERT
BERT = {
    "base-like": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48),
    "odd heads, 3 segments, untied": dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=2, intermediate_size=50,
                                          type_vocab_size=3, layer_norm_eps=1e-6, tie_word_embeddings=False),
}


@pytest.mark.parametrize("kw", BERT.values(), ids=BERT)
def test_bert_both_ways(kw):
    config = transformers.BertConfig(vocab_size=V, max_position_embeddings=32, **kw)
    hf = randomize(transformers.BertForMaskedLM(config))
    model = from_hf(hf)
    x, mask = tokens(), right_padding()
    types = tokens(3, 9, seed=2, vocab=config.type_vocab_size)
    with torch.no_grad():
        ref = hf(x, attention_mask=mask, token_type_ids=types).logits
        assert max_diff(model(x, mask, types), ref, mask) < ATOL
        assert max_diff(model(x), hf(x).logits) < ATOL
        back = to_hf(model).eval()
        assert max_diff(back(x, attention_mask=mask, token_type_ids=types).logits, model(x, mask, types), mask) < ATOL
    assert_same_state(hf, back, unread=() if config.tie_word_embeddings else ("cls.predictions.bias",))


# --------------------------------------------------------------------------------------- LLaMA
LLAMA = {
    "MQA (1 kv head)": dict(num_attention_heads=4, num_key_value_heads=1),
    "GQA (2 kv heads)": dict(num_attention_heads=4, num_key_value_heads=2),
    "odd heads (3, MHA)": dict(hidden_size=36, num_attention_heads=3, num_key_value_heads=3),
    "head_dim 12, GQA": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=12),
    "biases, tied, GeGLU-tanh, theta 5e5": dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                               mlp_bias=True, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh",
                                               rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
}


def llama(**kw):
    kw = {"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "max_position_embeddings": 64, **kw}
    return randomize(transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=V, **kw)))


@pytest.mark.parametrize("kw", LLAMA.values(), ids=LLAMA)
def test_llama_both_ways(kw):
    hf = llama(**kw)
    model = from_hf(hf)
    att = model.spec.block.attention
    assert att.n_kv_heads == hf.config.num_key_value_heads and att.qk_size(model.spec.d_model) == hf.config.head_dim
    x, mask = tokens(length=12), left_padding(length=12)
    with torch.no_grad():
        assert max_diff(model(x), hf(x).logits) < ATOL
        ref = hf(x, attention_mask=mask, position_ids=positions(mask)).logits
        assert max_diff(model(x, mask), ref, mask) < ATOL
        back = to_hf(model).eval()
        assert max_diff(back(x).logits, model(x)) < ATOL
    assert_same_state(hf, back)


# -------------------------------------------------------------------------------------- Marian
MARIAN = {
    "shared, scaled, relu, 2+1 layers": dict(activation_function="relu", scale_embedding=True, decoder_layers=1),
    "swish, odd heads, logits bias": dict(d_model=24, encoder_attention_heads=3, decoder_attention_heads=3,
                                          activation_function="swish", scale_embedding=True),
    "separate vocabularies, gelu": dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=50, activation_function="gelu"),
    "untied": dict(tie_word_embeddings=False, scale_embedding=True),
}


def marian(logits_bias: bool = False, **kw):
    kw = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
          "encoder_ffn_dim": 48, "decoder_ffn_dim": 48, "max_position_embeddings": 32, "pad_token_id": 49,
          "decoder_start_token_id": 49, **kw}
    hf = transformers.MarianMTModel(transformers.MarianConfig(vocab_size=V, **kw))
    return randomize(hf, buffers=("final_logits_bias",) if logits_bias else ())


def marian_logits(hf, src, src_mask, tgt, tgt_mask):
    return hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits


@pytest.mark.parametrize("name", MARIAN)
def test_marian_both_ways(name):
    hf = marian(logits_bias="bias" in name, **MARIAN[name])
    model = from_hf(hf)
    assert model.spec.head.bias == ("bias" in name)
    tgt_vocab = hf.config.decoder_vocab_size
    src, src_mask = tokens(3, 11, seed=4), right_padding(3, 11)
    tgt, tgt_mask = tokens(3, 9, vocab=tgt_vocab), right_padding()
    with torch.no_grad():
        out = model(src, tgt, src_mask, tgt_mask)
        assert max_diff(out, marian_logits(hf, src, src_mask, tgt, tgt_mask), tgt_mask) < ATOL
        back = to_hf(model, pad_token_id=49, decoder_start_token_id=49).eval()
        assert max_diff(marian_logits(back, src, src_mask, tgt, tgt_mask), out, tgt_mask) < ATOL
    assert_same_state(hf, back, unread=() if hf.config.tie_word_embeddings else ("model.shared.weight",))


def test_paper_layout_converts_to_marian_by_permuting_the_model_dimension():
    """transformer-base keeps the paper's interleaved sinusoids; Marian's are concatenated. The
    converter reorders the model dimension of every tensor, which changes no output."""
    spec = zoo.load_spec("transformer-base", ["d_model=32", "n_layers=2", "block.attention.n_heads=4",
                                              "block.ffn.hidden=48", f"vocab_size={V}", "max_seq_len=32"])
    model = randomize(zoo.build(spec, seed=0))
    hf = to_hf(model).eval()
    src, src_mask, tgt, tgt_mask = tokens(3, 11, seed=4), right_padding(3, 11), tokens(), right_padding()
    with torch.no_grad():
        assert max_diff(marian_logits(hf, src, src_mask, tgt, tgt_mask), model(src, tgt, src_mask, tgt_mask), tgt_mask) < ATOL
    assert from_hf(hf).spec.position.layout == "concat"


# ----------------------------------------------------------------------------- torch.nn.Transformer
def torch_transformer_like(model) -> nn.Transformer:
    """nn.Transformer (Post-Norm) holding the weights of a zoo Post-Norm encoder-decoder.

    nn.Transformer always ends its encoder and decoder with a LayerNorm, even with norm_first=False;
    the paper's Post-Norm stack (and zoo's) has none, since every block already ends in a norm. We
    replace the two with nn.Identity so both compute the paper's model."""
    s = model.spec
    ref = nn.Transformer(
        d_model=s.d_model, nhead=s.block.attention.n_heads, num_encoder_layers=s.encoder_layers,
        num_decoder_layers=s.decoder_layers, dim_feedforward=s.block.ffn.hidden_size(s.d_model), dropout=0.0,
        activation="relu", layer_norm_eps=s.block.norm.eps, batch_first=True, norm_first=False,
    )
    ref.encoder.norm, ref.decoder.norm = nn.Identity(), nn.Identity()
    with torch.no_grad():
        for ours, theirs in zip(model.encoder.blocks, ref.encoder.layers):
            theirs.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
            theirs.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
            theirs.self_attn.out_proj.load_state_dict(ours.attn.out.state_dict())
            for a, b in (("linear1", "fc1"), ("linear2", "fc2")):
                getattr(theirs, a).load_state_dict(getattr(ours.ffn, b).state_dict())
            theirs.norm1.load_state_dict(ours.attn_norm.state_dict())
            theirs.norm2.load_state_dict(ours.ffn_norm.state_dict())
        for ours, theirs in zip(model.decoder.blocks, ref.decoder.layers):
            theirs.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
            theirs.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
            theirs.self_attn.out_proj.load_state_dict(ours.attn.out.state_dict())
            x = theirs.multihead_attn  # in_proj rows are [q | k | v]: zoo's q, then its fused kv
            x.in_proj_weight.copy_(torch.cat([ours.cross_attn.q.weight, ours.cross_attn.kv.weight]))
            x.in_proj_bias.copy_(torch.cat([ours.cross_attn.q.bias, ours.cross_attn.kv.bias]))
            x.out_proj.load_state_dict(ours.cross_attn.out.state_dict())
            for a, b in (("linear1", "fc1"), ("linear2", "fc2")):
                getattr(theirs, a).load_state_dict(getattr(ours.ffn, b).state_dict())
            for n, z in (("norm1", "attn_norm"), ("norm2", "cross_norm"), ("norm3", "ffn_norm")):
                getattr(theirs, n).load_state_dict(getattr(ours, z).state_dict())
    return ref.eval()


@pytest.mark.parametrize("heads", [4, 3])
def test_post_norm_encoder_decoder_equals_torch_transformer(heads):
    d = 8 * heads
    spec = zoo.load_spec("transformer-base", [f"d_model={d}", "n_layers=2", f"block.attention.n_heads={heads}",
                                              "block.ffn.hidden=40", f"vocab_size={V}", "max_seq_len=32"])
    model = randomize(zoo.build(spec, seed=0))
    ref = torch_transformer_like(model)
    src, src_mask, tgt, tgt_mask = tokens(3, 11, seed=4), right_padding(3, 11), tokens(), right_padding()

    def embed(ids):  # the paper's input: sqrt(d)-scaled shared embedding plus sinusoids
        return model.tgt_emb(ids) + model.position.weight[: ids.shape[1]]

    causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    with torch.no_grad():
        hidden = ref(embed(src), embed(tgt), tgt_mask=causal, src_key_padding_mask=~src_mask,
                     memory_key_padding_mask=~src_mask, tgt_key_padding_mask=~tgt_mask, tgt_is_causal=True)
        assert max_diff(model(src, tgt, src_mask, tgt_mask), model.head(hidden), tgt_mask) < ATOL


# ------------------------------------------------------------------------------------------ ViT
VIT = {
    "cls token, fc_norm off": dict(global_pool="token"),
    "avg pool, fc_norm": dict(global_pool="avg"),
    "no class token, avg, no biases, gelu-tanh": dict(class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False,
                                                      proj_bias=False, act_layer="gelu_tanh"),
    "no positions, relu, mlp 3x": dict(pos_embed="none", act_layer="relu", mlp_ratio=3.0),
    "mlp 59 wide (59 / 21 * 21 < 59 in floats)": dict(embed_dim=21, mlp_ratio=math.nextafter(59 / 21, 3.0)),
}


@pytest.mark.parametrize("kw", VIT.values(), ids=VIT)
def test_vit_both_ways(kw):
    kw = {"img_size": 32, "patch_size": 8, "embed_dim": 24, "depth": 2, "num_heads": 3, "num_classes": 7, **kw}
    ref = randomize(VisionTransformer(**kw))
    check_vit(ref, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5)))


@pytest.mark.slow
def test_vit_tiny_patch16_224_both_ways():
    ref = randomize(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    model = check_vit(ref, torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(5)))
    assert model.spec.model_dump(exclude={"name"}) == zoo.load_spec("vit-tiny-16").model_dump(exclude={"name"})


def check_vit(ref, images):
    model = from_timm(ref)
    with torch.no_grad():
        assert max_diff(model(images), ref(images)) < ATOL
        back = to_timm(model).eval()
        assert max_diff(back(images), model(images)) < ATOL
    assert_same_state(ref, back)
    return model


# -------------------------------------------------------------------------- parameter counts
def n_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def zoo_count(name: str) -> int:
    return zoo.count_parameters(zoo.build(name, device="meta"))


def same_architecture(a, b, ignore=("name",)) -> bool:
    return a.model_dump(exclude=set(ignore)) == b.model_dump(exclude=set(ignore))


@pytest.mark.parametrize("name,config", [("gpt2-small", "GPT2Config"), ("bert-base", "BertConfig")])
def test_gpt2_and_bert_presets_are_the_default_configs(name, config):
    cls = {"GPT2Config": transformers.GPT2LMHeadModel, "BertConfig": transformers.BertForMaskedLM}[config]
    with torch.device("meta"):
        ref = cls(getattr(transformers, config)())
    assert same_architecture(hf_spec(ref.config), zoo.load_spec(name))
    assert zoo_count(name) == n_params(ref)


def test_llama_preset_count_and_config_round_trip():
    spec = zoo.load_spec("llama-small")
    config = hf_config(spec)
    with torch.device("meta"):
        ref = transformers.LlamaForCausalLM(config)
    assert zoo_count("llama-small") == n_params(ref)
    assert same_architecture(hf_spec(config), spec, ignore=("name", "init"))  # HF has no scaled residual init


VIT_PRESETS = {
    "vit-tiny-16": "vit_tiny_patch16_224", "vit-small-16": "vit_small_patch16_224", "vit-base-16": "vit_base_patch16_224",
    "deit3-small-16": "deit3_small_patch16_224",  # layer scale 1e-6, positions on the patches only
    "vit-medium-16-reg4-gap-256": "vit_medium_patch16_reg4_gap_256",  # 4 registers, no class token, mean + fc_norm
    "vit-so150m-16-reg4-map-256": "vit_so150m_patch16_reg4_map_256",  # 4 registers with positions, attention pooling
    "vit-small-16-reg4": ("vit_small_patch16_224", {"reg_tokens": 4, "no_embed_class": True}),  # the paper's registers
}


@pytest.mark.parametrize("name", VIT_PRESETS)
def test_vit_presets_are_timm_models(name):
    model, kwargs = VIT_PRESETS[name] if isinstance(VIT_PRESETS[name], tuple) else (VIT_PRESETS[name], {})
    with torch.device("meta"):
        ref = timm.create_model(model, pretrained=False, **kwargs)
    assert zoo_count(name) == n_params(ref)
    assert same_architecture(timm_spec(ref), zoo.load_spec(name))


@pytest.mark.parametrize("name", ["transformer-base", "transformer-big"])
def test_paper_presets_count_as_marian_and_torch_transformer(name):
    spec = zoo.load_spec(name)
    with torch.device("meta"):
        marian_model = transformers.MarianMTModel(hf_config(spec))
        torch_model = nn.Transformer(d_model=spec.d_model, nhead=spec.block.attention.n_heads,
                                     dim_feedforward=spec.block.ffn.hidden, batch_first=True)
    # Marian's sinusoid tables are frozen parameters; its trainable ones are exactly zoo's
    assert zoo_count(name) == n_params(marian_model, trainable_only=True)
    # nn.Transformer has no embeddings and two final LayerNorms the Post-Norm paper model lacks
    assert zoo_count(name) == n_params(torch_model) - 2 * 2 * spec.d_model + spec.vocab_size * spec.d_model


# ------------------------------------------------------------------------ refused conversions
FROM_REFUSED = {
    "gpt2 quick_gelu": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_embd=16, n_head=2, n_layer=1, activation_function="quick_gelu")), r"activation_function='quick_gelu'"),
    "gpt2 layer-scaled attention": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_embd=16, n_head=2, n_layer=1, scale_attn_by_inverse_layer_idx=True)), "scale_attn_by_inverse_layer_idx"),
    "bert relu": (lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=16, num_attention_heads=2, num_hidden_layers=1, intermediate_size=8, hidden_act="relu")),
        "hidden_act='relu'"),
    "bert relative positions": (lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=16, num_attention_heads=2, num_hidden_layers=1, intermediate_size=8,
        position_embedding_type="relative_key")), "position_embedding_type='relative_key'"),
    "llama proportional rope": (lambda: llama(num_attention_heads=4, rope_parameters={
        "rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), "rope_parameters.rope_type='proportional'"),
    "llama partial rotary": (lambda: llama(num_attention_heads=4, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), "partial_rotary_factor"),
    "llama relu": (lambda: llama(num_attention_heads=4, hidden_act="relu"), "hidden_act='relu'"),
    "marian unequal FFNs": (lambda: marian(decoder_ffn_dim=40), "decoder_ffn_dim=40"),
    "marian layerdrop": (lambda: marian(encoder_layerdrop=0.1), "encoder_layerdrop=0.1"),
    "marian altered positions": (lambda: marian_with_learned_positions(), "embed_positions.weight is not the sinusoid table"),
    "bart fairseq pre-norm": (lambda: bart(normalize_before=True), "normalize_before=True"),
    "bart logits bias on lm_head": (lambda: bart(add_bias_logits=True), "add_bias_logits=True"),
    "bart layerdrop": (lambda: bart(decoder_layerdrop=0.1), "decoder_layerdrop=0.1"),
    "mbart without its final norms": (lambda: bart("MBart", add_final_layer_norm=False), "add_final_layer_norm=False"),
    "vit layer scale on one sub-layer": (lambda: vit_with_one_layer_scale(), "init_values='differ'"),
    "vit qkv bias only": (lambda: VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3,
                                                   qkv_bias=False), "qkv_bias=False"),
    "vit avgmax pooling": (lambda: VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3,
                                                    global_pool="avgmax"), "global_pool='avgmax'"),
    "vit rmsnorm qk-norm": (lambda: VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3,
                                                     qk_norm=True, norm_layer="rmsnorm"), "qk_norm='RmsNorm'"),
    "vit stochastic depth": (lambda: VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3,
                                                      drop_path_rate=0.1), "blocks.1: drop_path_rate='> 0'"),
}


def bart(kind: str = "Bart", **kw):
    config = getattr(transformers, f"{kind}Config")(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1,
                                                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                                                    decoder_ffn_dim=24, max_position_embeddings=16, **kw)
    return getattr(transformers, f"{kind}ForConditionalGeneration")(config)


def vit_with_one_layer_scale():
    ref = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, init_values=1e-5)
    ref.blocks[0].ls2 = nn.Identity()
    return ref


def marian_with_learned_positions():
    hf = marian()
    with torch.no_grad():
        hf.model.encoder.embed_positions.weight.add_(0.1)
    return hf


@pytest.mark.parametrize("case", FROM_REFUSED)
def test_from_reference_refuses_what_zoo_cannot_express(case):
    build, message = FROM_REFUSED[case]
    reference = build()
    convert = from_timm if isinstance(reference, VisionTransformer) else from_hf
    with pytest.raises(ConversionError, match=message):
        convert(reference)


TINY_TEXT = ["d_model=32", "n_layers=1", "block.attention.n_heads=4", "block.ffn.hidden=48", f"vocab_size={V}", "max_seq_len=32"]
TINY_VIT = ["d_model=24", "n_layers=1", "block.attention.n_heads=3", "block.ffn.hidden=48", "image_size=32", "patch_size=8"]
TO_REFUSED = {
    "gpt2 with alibi": ("gpt2-small", ["position.kind=alibi"], "GPT2LMHeadModel", "position.kind='alibi'"),
    "gpt2 with gqa": ("gpt2-small", ["block.attention.kind=gqa", "block.attention.n_kv_heads=2"], "GPT2LMHeadModel",
                      "block.attention.n_kv_heads=2"),
    "gpt2 with rmsnorm": ("gpt2-small", ["block.norm.kind=rmsnorm"], "GPT2LMHeadModel", "block.norm.kind='rmsnorm'"),
    "gpt2 post-norm": ("gpt2-small", ["block.kind=post"], "GPT2LMHeadModel", "block.kind='post'"),
    "llama with layernorm": ("llama-small", ["block.norm.kind=layernorm"], None, "block.norm.kind='layernorm'"),
    "llama with a relu FFN": ("llama-small", ["block.ffn.kind=relu"], None, "block.ffn.kind='relu'"),
    "llama with embedding dropout": ("llama-small", ["dropout.embedding=0.1"], None, "dropout.embedding=0.1"),
    "bert pre-norm": ("bert-base", ["block.kind=pre"], None, "block.kind='pre'"),
    "bert with a classifier": ("bert-base", ["classifier.num_labels=3"], None, "classifier="),
    # (a BERT layout with tanh GELU is an ELECTRA generator whose embeddings are d_model wide: it converts to that)
    "bert gelu-tanh": ("bert-base", ["block.ffn.approximate=tanh"], "BertForMaskedLM", "block.ffn.kind='gelu'"),
    "marian pre-norm": ("transformer-base", ["block.kind=pre"], None, "block.kind='pre'"),
    "marian learned positions": ("transformer-base", ["position.kind=learned"], None, "position.kind='learned'"),
    "marian shared but untied": ("transformer-base", ["head.tied=false"], None, "head.tied=False"),
    "marian with an embedding norm": ("transformer-base", ["embedding.norm=true"], None, "embedding.norm=True"),
    "bart one position table": ("bart-base", ["share_positions=true"], None, "share_positions=True"),
    "bart positions from row 0": ("bart-base", ["position.offset=0"], None, "position.offset=0"),
    "bart shared but untied": ("bart-base", ["head.tied=false"], None, "head.tied=False"),
    "bart without an embedding norm": ("bart-base", ["embedding.norm=false"], None, "embedding.norm=False"),
    "bart two vocabularies": ("bart-base", ["share_embeddings=false", "head.tied=false", "src_vocab_size=70"], None,
                              "src_vocab_size=70"),
    "bart pre-norm": ("bart-base", ["block.kind=pre"], "BartForConditionalGeneration", "block.kind='pre'"),
    "mbart post-norm": ("bart-base", [], "MBartForConditionalGeneration", "block.kind='post'"),
    "vit sincos2d": ("vit-tiny-16", ["position.kind=sincos2d"], "timm", "position.kind='sincos2d'"),
    "vit post-norm": ("vit-tiny-16", ["block.kind=post"], "timm", "block.kind='post'"),
    "vit geglu": ("vit-tiny-16", ["block.ffn.kind=geglu"], "timm", "block.ffn.kind='geglu'"),
    "vit conv stem": ("vit-tiny-16", ["stem.channels=[8]"], "timm", "stem=.* timm's VisionTransformer does not express it"),
}


@pytest.mark.parametrize("case", TO_REFUSED)
def test_to_reference_refuses_what_it_cannot_express(case):
    preset, overrides, architecture, message = TO_REFUSED[case]
    tiny = TINY_VIT if preset.startswith("vit") else TINY_TEXT
    model = zoo.build(preset, tiny + overrides, device="meta")
    with pytest.raises(ConversionError, match=message):
        if architecture == "timm":
            to_timm(model)
        else:
            to_hf(model, architecture)


def test_unknown_classes_are_named():
    with pytest.raises(ConversionError, match="GPT2ForSequenceClassification does not convert; supported: GPT2LMHeadModel, "
                                              "BertForMaskedLM"):
        from_hf(transformers.GPT2ForSequenceClassification(transformers.GPT2Config(vocab_size=V, n_embd=16, n_head=2, n_layer=1)))
    with pytest.raises(ConversionError, match="vit converts with zoo.interop.timm.to_timm"):
        to_hf(zoo.build("vit-tiny-16", TINY_VIT, device="meta"))
    with pytest.raises(ConversionError, match="n_embd follow from the zoo spec"):
        to_hf(zoo.build("gpt2-small", TINY_TEXT, device="meta"), n_embd=64)


def test_a_zoo_tensor_without_a_place_in_the_reference_is_refused():
    """The guard behind the option checks: a tensor no rule maps would be dropped, changing the outputs."""
    from zoo.interop.common import check_used, rule

    with pytest.raises(ConversionError, match=r"zoo's tensors emb_norm.bias, emb_norm.weight have no place in the reference"):
        check_used(["tok_emb.weight", "emb_norm.weight", "emb_norm.bias"], [rule("tok_emb.weight", "embed.weight")], "zoo -> X")


def test_a_registered_attention_kind_is_refused():
    """A part registered from user code may hold the built-in tensors and compute something else."""
    from typing import Literal

    from zoo.components.attention import _attention
    from zoo.registry import REGISTRIES
    from zoo.spec import AttentionSpec

    class ScaledSpec(AttentionSpec):
        kind: Literal["scaled_mha"] = "scaled_mha"

    registry = REGISTRIES["attention"]
    saved = dict(registry._specs), dict(registry._builders)
    try:
        zoo.register("attention", "scaled_mha", spec=ScaledSpec)(_attention)
        overrides = ["block.attention.kind=scaled_mha"]
        with pytest.raises(ConversionError, match="block.attention.kind='scaled_mha' is not supported"):
            to_hf(zoo.build("gpt2-small", TINY_TEXT + overrides, device="meta"))
        with pytest.raises(ConversionError, match="block.attention.kind='scaled_mha' is not supported"):
            to_hf(zoo.build("llama-small", TINY_TEXT + overrides, device="meta"))
        with pytest.raises(ConversionError, match="block.attention.kind='scaled_mha' is not supported"):
            to_timm(zoo.build("vit-tiny-16", TINY_VIT + overrides, device="meta"))
    finally:
        for current, old in zip((registry._specs, registry._builders), saved):
            current.clear(), current.update(old)


def test_a_changed_weight_is_caught():
    """The comparisons above can fail: one perturbed tensor moves the logits far past the tolerance."""
    hf = gpt2(n_embd=32, n_head=4, n_layer=2)
    model = from_hf(hf)
    with torch.no_grad():
        model.stack.blocks[1].attn.qkv.weight[40] += 0.01  # one row of one key projection
        assert max_diff(model(tokens()), hf(tokens()).logits) > 100 * ATOL
