"""The rows of :mod:`bench.sized` at their three sizes: each a zoo spec, the peer built from it, the
batch, and the FLOP count its MFU divides by."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

import zoo
import zoo.train as T
from bench.common import Row, here
from bench.sized import (Plan, variants, flop_weights, forward_flops, generate_hooks, infer_step, ints,
                         measure, moe_active, train_flops, train_step)

TOY_DECODER = ["n_layers=2", "d_model=64", "block.attention.n_heads=4", "vocab_size=256", "max_seq_len=64"]
# (batch, sequence, spec overrides) of each decoder row at each size
GPT2 = {"toy": (2, 16, TOY_DECODER), "cpu": (8, 256, []), "gpu": (16, 1024, [])}
LLAMA = {"toy": (2, 16, [*TOY_DECODER, "max_seq_len=16384", "block.attention.n_kv_heads=2", "block.ffn.hidden=128"]),
         "cpu": (4, 256, ["n_layers=4", "d_model=512", "block.attention.n_heads=8", "block.attention.n_kv_heads=2",
                          "block.ffn.hidden=2048", "vocab_size=32000", "max_seq_len=4096"]),
         "gpu": (8, 2048, ["max_seq_len=16384"])}  # llama3 rope: above its 8,192
BERT = {"toy": (2, 16, ["n_layers=2", "d_model=64", "block.attention.n_heads=4", "block.ffn.hidden=128",
                        "vocab_size=256"]), "cpu": (16, 128, []), "gpu": (32, 512, [])}
# timm name, batch, timm options
VIT = {"toy": ("vit_tiny_patch16_224", 4, {"img_size": 32, "depth": 2}), "cpu": ("vit_small_patch16_224", 32, {}),
       "gpu": ("vit_base_patch16_224", 256, {})}
# sentences x tokens a side (gpu: 25,600 source + 25,600 target tokens, the paper's ~25k a side)
TRANSFORMER = {"toy": (2, 8), "cpu": (16, 64), "gpu": (200, 128)}
# Mixtral's shape (expert hidden 3.5 x d_model, heads of 128 at d 1024, GQA 4:1, 8 experts top-2, 32k vocabulary)
MOE = {"toy": (2, 16, dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4)),
       "cpu": (4, 256, dict(vocab_size=32000, hidden_size=512, intermediate_size=1792, num_hidden_layers=4,
                            num_attention_heads=8, num_key_value_heads=2, num_local_experts=8)),
       "gpu": (8, 2048, dict(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=12,
                             num_attention_heads=8, num_key_value_heads=2, num_local_experts=8))}
NEW_TOKENS = {"toy": (8, 6), "cpu": (128, 64), "gpu": (64, 32)}  # greedy, beam (gpu: launch-bound, fewer suffice)


def _hf(config, cls_name: str):
    import transformers

    cls = getattr(transformers, cls_name)

    def build():
        torch.manual_seed(0)
        with torch.device(here()):
            return cls(config)
    return build


def _hf_config(spec, architecture: str | None = None):
    from zoo.interop.hf.convert import hf_config

    return hf_config(spec, architecture, attn_implementation="sdpa")


def _zoo(spec):
    return lambda: zoo.build(spec, seed=0, device=here())


# ------------------------------------------------------------------------------------ decoders
def _lm_row(label: str, spec, peer: Callable, batch: int, seq: int, precision: str, plan: Plan,
            n: int | None = None) -> Row:
    """A causal-LM training step: zoo's decoder against the HF model ``peer`` builds."""
    tokens = ints(spec.vocab_size, (batch, seq))
    targets = F.pad(tokens[:, 1:], (0, 1), value=-100).flatten()  # labels shifted, not the logits

    def zoo_loss(m):
        return F.cross_entropy(m(tokens).flatten(0, 1).float(), targets, ignore_index=-100)

    def hf_loss(m):
        return m(input_ids=tokens, labels=tokens).loss

    def zoo_side(c):
        return train_step(_zoo(spec)(), zoo_loss, precision, True, c, plan)

    def hf_side(c):
        return train_step(peer(), hf_loss, precision, False, c, plan)

    row = Row(workload=f"{label} train {batch}x{seq}", precision=precision, unit="tokens", work=batch * seq)
    if n is None:
        probe = zoo.build(spec, device="meta")
        n = flop_weights(probe, spec.head.tied)
    row.flops = train_flops(batch * seq, n, spec.n_layers, seq, spec.d_model)
    row.extra["flop_weights"] = n
    return measure(row, {**variants("zoo", zoo_side, plan), **variants("HF", hf_side, plan)}, plan)


def gpt2(precision: str, plan: Plan) -> Row:
    batch, seq, over = GPT2[plan.size]
    spec = zoo.load_spec("gpt2-small", over)
    return _lm_row("GPT-2 small" if not over else "GPT-2 toy", spec, _hf(_hf_config(spec), "GPT2LMHeadModel"),
                   batch, seq, precision, plan)


def llama(precision: str, plan: Plan) -> Row:
    batch, seq, over = LLAMA[plan.size]
    spec = zoo.load_spec("llama-3.2-1b", over)
    label = "Llama-3.2-1B-shaped" if plan.size == "gpu" else f"Llama-3.2-shaped {spec.n_layers}L/{spec.d_model}"
    return _lm_row(label, spec, _hf(_hf_config(spec), "LlamaForCausalLM"), batch, seq, precision, plan)


def moe(precision: str, plan: Plan) -> Row:
    from transformers import MixtralConfig

    from bench.moe import zoo_spec

    batch, seq, size = MOE[plan.size]
    config = MixtralConfig(num_experts_per_tok=2, max_position_embeddings=4096, attn_implementation="sdpa",
                           tie_word_embeddings=False, **size)
    spec = zoo.parse_spec(zoo_spec(config))
    probe = zoo.build(spec, device="meta")
    ffn = spec.block.ffn
    label = f"Mixtral-shaped {spec.n_layers}L/{spec.d_model} {ffn.n_experts} experts top-{ffn.top_k}"
    return _lm_row(label, spec, _hf(config, "MixtralForCausalLM"), batch, seq, precision, plan,
                   n=moe_active(probe, spec))


# --------------------------------------------------------------------------------------- BERT
def bert(precision: str, plan: Plan) -> Row:
    """An MLM training step, 15% of tokens scored: zoo against HF BertForMaskedLM."""
    batch, seq, over = BERT[plan.size]
    spec = zoo.load_spec("bert-base", over)
    peer = _hf(_hf_config(spec, "BertForMaskedLM"), "BertForMaskedLM")
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (batch, seq), generator=g, device="cpu").to(here())
    mask = torch.ones(batch, seq, dtype=torch.bool, device=here())
    labels = torch.where(torch.rand(batch, seq, generator=g, device="cpu").to(here()) < 0.15, tokens, torch.full_like(tokens, -100))

    def zoo_loss(m):
        return F.cross_entropy(m(tokens, mask).flatten(0, 1).float(), labels.flatten(), ignore_index=-100)

    def hf_loss(m):
        return m(input_ids=tokens, attention_mask=mask.long(), labels=labels).loss

    row = Row(workload=f"BERT-base MLM train {batch}x{seq}" if not over else "BERT toy MLM train", precision=precision,
              unit="tokens", work=batch * seq)
    n = flop_weights(zoo.build(spec, device="meta"), spec.head.tied)
    row.flops, row.extra["flop_weights"] = train_flops(batch * seq, n, spec.n_layers, seq, spec.d_model), n
    sides = {**variants("zoo", lambda c: train_step(_zoo(spec)(), zoo_loss, precision, True, c, plan), plan),
             **variants("HF", lambda c: train_step(peer(), hf_loss, precision, False, c, plan), plan)}
    return measure(row, sides, plan)


# ---------------------------------------------------------------------------------------- ViT
def vit(precision: str, plan: Plan, mode: str) -> Row:
    """A training step (cross-entropy, AdamW) or a forward pass: zoo against timm's VisionTransformer."""
    import timm
    from timm.models.vision_transformer import VisionTransformer

    from zoo.interop.timm import timm_kwargs, timm_spec

    name, batch, kw = VIT[plan.size]
    spec = timm_spec(timm.create_model(name, pretrained=False, **kw))
    size = kw.get("img_size", 224)
    images = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0), device="cpu").to(here())
    labels = ints(1000, (batch,))

    def peer():
        torch.manual_seed(0)
        with torch.device(here()):
            return VisionTransformer(**timm_kwargs(spec))

    row = Row(workload=f"{name} {mode} b{batch}", precision=precision, unit="images", work=batch)
    n, tokens = flop_weights(zoo.build(spec, device="meta"), False), batch * spec.n_tokens
    count = train_flops if mode == "train" else forward_flops
    row.flops, row.extra["flop_weights"] = count(tokens, n, spec.n_layers, spec.n_tokens, spec.d_model), n
    if mode == "train":
        def side(build, is_zoo):
            return lambda c: train_step(build(), lambda m: F.cross_entropy(m(images), labels), precision, is_zoo, c, plan)
    else:
        def side(build, is_zoo):
            return lambda c: infer_step(build(), lambda m: m(images), precision, c, plan)
    return measure(row, {**variants("zoo", side(_zoo(spec), True), plan),
                         **variants("timm", side(peer, False), plan)}, plan)


# ------------------------------------------------------------------------------- the paper's model
def _marian(plan: Plan):
    from bench.workloads import _marian_config

    from zoo.interop.hf.convert import hf_spec

    vocab = 1000 if plan.size == "toy" else 32000
    config = _marian_config(vocab, plan.size == "toy")
    return config, hf_spec(config)


def transformer(precision: str, plan: Plan) -> Row:
    """The paper's base model, a label-smoothed training step: zoo against HF MarianMTModel."""
    batch, length = TRANSFORMER[plan.size]
    config, spec = _marian(plan)
    V = spec.vocab_size
    src, tgt = ints(V - 4, (batch, length)) + 4, ints(V - 4, (batch, length + 1), seed=1) + 4
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:].flatten()
    mask = torch.ones(batch, length, dtype=torch.bool, device=here())

    def ce(logits):
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out, label_smoothing=0.1)

    def zoo_loss(m):
        return ce(m(src, tgt_in, mask, mask))

    def hf_loss(m):
        return ce(m(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt_in).logits)

    tokens = batch * length
    row = Row(workload=f"Transformer base train {tokens:,}+{tokens:,} tokens", precision=precision,
              unit="src+tgt tokens", work=2 * tokens)
    probe, d = zoo.build(spec, device="meta"), spec.d_model
    n_enc = flop_weights(probe, False, "encoder.")
    n_dec = flop_weights(probe, False, "decoder.") + V * d  # its output projection, tied to the embedding
    row.flops = (train_flops(tokens, n_enc, spec.encoder_layers, length, d)
                 + train_flops(tokens, n_dec, spec.decoder_layers, 2 * length, d))  # self- and cross-attention
    row.extra["flop_weights"] = n_enc + n_dec
    sides = {**variants("zoo", lambda c: train_step(_zoo(spec)(), zoo_loss, precision, True, c, plan), plan),
             **variants("HF Marian", lambda c: train_step(_hf(config, "MarianMTModel")(), hf_loss, precision, False,
                                                           c, plan), plan)}
    return measure(row, sides, plan)


# ------------------------------------------------------------------------------------- decoding
def greedy(precision: str, plan: Plan, batch: int) -> Row:
    """GPT-2 small greedy decoding, no early stop: zoo.generate against HF generate."""
    new = NEW_TOKENS[plan.size][0]
    _, _, over = GPT2[plan.size]
    spec = zoo.load_spec("gpt2-small", over)
    peer = _hf(_hf_config(spec), "GPT2LMHeadModel")
    prompt = ints(spec.vocab_size, (batch, 16))

    def zoo_side(**hooks):
        def build():
            model = _zoo(spec)().eval()

            def step():
                with T.autocast(here(), precision):
                    out = zoo.generate(model, prompt, max_new_tokens=new, min_new_tokens=new, eos_id=None, **hooks)
                assert out.tokens.shape[1] >= new
            return step
        return build

    def hf_side():
        model = peer().eval()

        def step():
            with torch.inference_mode(), T.autocast(here(), precision):
                out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False, pad_token_id=0)
            assert out.shape[1] == 16 + new
        return step

    row = Row(workload=f"GPT-2 small greedy b{batch}, {new} tokens", precision=precision, unit="tokens",
              work=batch * new)
    return measure(row, _decode_sides(zoo_side, hf_side, "HF"), plan)


def beam(precision: str, plan: Plan, batch: int = 8) -> Row:
    """The paper's base model, beam 4, a fixed number of tokens a sentence: zoo.generate against Marian's."""
    new = NEW_TOKENS[plan.size][1]
    config, spec = _marian(plan)
    src = ints(spec.vocab_size - 4, (batch, 32)) + 4
    mask = torch.ones_like(src, dtype=torch.bool)

    def zoo_side(**hooks):
        def build():
            model = _zoo(spec)().eval()

            def step():
                with T.autocast(here(), precision):
                    zoo.generate(model, src, padding_mask=mask, num_beams=4, max_new_tokens=new, min_new_tokens=new,
                                 bos_id=1, eos_id=2, pad_id=0, **hooks)
            return step
        return build

    def hf_side():
        model = _hf(config, "MarianMTModel")().eval()

        def step():
            with torch.inference_mode(), T.autocast(here(), precision):
                model.generate(src, attention_mask=mask.long(), num_beams=4, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False)
        return step

    row = Row(workload=f"Transformer base beam 4 b{batch}, {new} tokens", precision=precision, unit="sentences",
              work=batch)
    return measure(row, _decode_sides(zoo_side, hf_side, "HF Marian"), plan)


def _decode_sides(zoo_side, hf_side, peer: str) -> dict:
    """zoo eager and the peer; with ``zoo static+compiled`` too where zoo.generate takes a static cache
    and compilation (:func:`bench.sized.generate_hooks`)."""
    sides = {"zoo": zoo_side(), peer: hf_side}
    hooks = generate_hooks()
    if hooks:
        sides["zoo static+compiled"] = zoo_side(**hooks)
    return sides


def rows(name: str, precision: str, plan: Plan) -> list[Row]:
    """The rows of workload ``name`` in ``precision``."""
    if name == "gpt2":
        return [gpt2(precision, plan)]
    if name == "llama":
        return [llama(precision, plan)]
    if name == "bert":
        return [bert(precision, plan)]
    if name == "vit":
        return [vit(precision, plan, "train"), vit(precision, plan, "infer")]
    if name == "transformer":
        return [transformer(precision, plan)]
    if name == "moe":
        return [moe(precision, plan)]
    if name == "generate":
        return [greedy(precision, plan, 1), greedy(precision, plan, 8), beam(precision, plan)]
    raise ValueError(f"workload {name!r} has no sized rows; use one of gpt2, llama, bert, vit, transformer, moe, generate")
