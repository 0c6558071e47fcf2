"""The workloads: each builds zoo and its peers on the same architecture (the same weights where a
converter exists), times them alternately with :func:`bench.common.compare`, and returns a Row.

``tiny=True`` shrinks every model and batch so the scripts can be smoke-tested in seconds.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

import zoo
import zoo.train as T
from bench.common import Row, Side, compare, count_flops, here

Timing = dict  # warmup / repeats / inner for compare()


def _train_step(model: nn.Module, loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer,
                precision: str) -> Callable[[], None]:
    def step() -> None:
        with T.autocast(here(), precision):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _zoo_opt(model: nn.Module) -> torch.optim.Optimizer:
    return T.build_optimizer(model, T.OptimConfig(name="adamw", lr=1e-4, weight_decay=0.05))


def _torch_adamw(model: nn.Module) -> torch.optim.Optimizer:
    """What HF's Trainer and most scripts use: torch AdamW with its default (foreach) kernel."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)


def _flops_of_train(step_fwd_bwd: Callable[[], torch.Tensor]) -> float:
    def fn():
        step_fwd_bwd().backward()

    return count_flops(fn)


# ------------------------------------------------------------------------------------------ ViT
def vit(name: str, precision: str, mode: str, timing: Timing, tiny: bool = False) -> Row:
    """zoo ViT vs timm ``name`` (same weights via zoo.interop.timm): training step or inference."""
    import timm

    from zoo.interop.timm import from_timm

    kw = dict(img_size=32, depth=2) if tiny else {}
    batch = 4 if tiny else 32
    peer = timm.create_model(name, pretrained=False, **kw)
    ours = from_timm(peer)
    size = kw.get("img_size", 224)
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, 1000, (batch,))
    row = Row(workload=f"{name} {mode}", precision=precision, unit="images", work=batch)
    if mode == "train":
        peer.train(), ours.train()
        from timm.optim import create_optimizer_v2

        peer_opt = create_optimizer_v2(peer, "adamw", lr=1e-4, weight_decay=0.05)
        sides = [
            Side("zoo", _train_step(ours, lambda: F.cross_entropy(ours(images), labels), _zoo_opt(ours), precision)),
            Side("timm", _train_step(peer, lambda: F.cross_entropy(peer(images), labels), peer_opt, precision)),
        ]
        row.flops = _flops_of_train(lambda: F.cross_entropy(ours(images), labels))
    else:
        peer.eval(), ours.eval()

        def infer(m):
            def step():
                with torch.inference_mode(), T.autocast(here(), precision):
                    m(images)
            return step

        sides = [Side("zoo", infer(ours)), Side("timm", infer(peer))]
        with torch.inference_mode():
            row.flops = count_flops(lambda: ours(images))
    row.seconds, row.spread = compare(sides, **timing)
    return row


# ---------------------------------------------------------------------------------------- GPT-2
def gpt2(precision: str, timing: Timing, *, layers: int = 12, width: int = 768, heads: int = 12,
         batch: int = 8, seq: int = 256, tiny: bool = False) -> Row:
    """zoo vs HF GPT2LMHeadModel (sdpa attention), same weights: a causal-LM training step."""
    from transformers import GPT2Config, GPT2LMHeadModel


    if tiny:
        layers, width, heads, batch, seq = 2, 64, 4, 2, 16
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, attn_implementation="sdpa")
    name = "GPT-2 small" if (layers, width) == (12, 768) else f"GPT {layers}L/{width}"
    return _causal_lm_row(name, GPT2LMHeadModel(cfg), precision, timing, batch=batch, seq=seq)


def _causal_lm_row(name: str, peer: nn.Module, precision: str, timing: Timing, *, batch: int, seq: int) -> Row:
    """A causal-LM training step of an HF model against zoo's conversion of it (the same weights)."""
    from zoo.interop.hf import from_hf

    peer.train()
    ours = from_hf(peer).train()
    tokens = torch.randint(0, peer.config.vocab_size, (batch, seq))
    # next-token targets, the last position ignored: as zoo's LM recipe and HF's loss shift the labels,
    # not the [B, T, V] logits (slicing them copies the largest activation of the step)
    targets = F.pad(tokens[:, 1:], (0, 1), value=-100)

    def ours_loss():
        logits = ours(tokens)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def peer_loss():
        return peer(input_ids=tokens, labels=tokens).loss

    row = Row(workload=f"{name} train", precision=precision, unit="tokens", work=batch * seq)
    sides = [Side("zoo", _train_step(ours, ours_loss, _zoo_opt(ours), precision)),
             Side("HF", _train_step(peer, peer_loss, _torch_adamw(peer), precision))]
    row.flops = _flops_of_train(ours_loss)
    row.seconds, row.spread = compare(sides, **timing)
    return row


# -------------------------------------------------------------------------------------- Mistral
def mistral(precision: str, timing: Timing, *, layers: int = 6, width: int = 512, heads: int = 8, kv_heads: int = 2,
            window: int = 128, batch: int = 8, seq: int = 256, tiny: bool = False) -> Row:
    """zoo vs HF MistralForCausalLM (sdpa attention), same weights: a causal-LM training step of a
    Mistral-style decoder with GQA and a sliding window shorter than the sequence."""
    from transformers import MistralConfig, MistralForCausalLM


    if tiny:
        layers, width, heads, kv_heads, window, batch, seq = 2, 64, 4, 2, 8, 2, 16
    cfg = MistralConfig(vocab_size=32000, hidden_size=width, intermediate_size=width * 8 // 3 // 64 * 64 + 64,
                        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                        sliding_window=window, max_position_embeddings=max(seq, 2 * window), attn_implementation="sdpa")
    name = f"Mistral-style {layers}L/{width} GQA {heads}/{kv_heads}, window {window}"
    return _causal_lm_row(name, MistralForCausalLM(cfg), precision, timing, batch=batch, seq=seq)


# ----------------------------------------------------------------------------------------- BERT
def bert(precision: str, timing: Timing, tiny: bool = False) -> Row:
    """zoo vs HF BertForMaskedLM (sdpa), same weights: an MLM training step, 15% of tokens scored."""
    from transformers import BertConfig, BertForMaskedLM

    from zoo.interop.hf import from_hf

    batch, seq = (2, 16) if tiny else (16, 128)
    cfg = BertConfig(attn_implementation="sdpa", **(dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                           intermediate_size=128) if tiny else {}))
    peer = BertForMaskedLM(cfg).train()
    ours = from_hf(peer).train()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g, device="cpu").to(here())
    mask = torch.ones(batch, seq, dtype=torch.bool)
    labels = torch.where(torch.rand(batch, seq, generator=g, device="cpu").to(here()) < 0.15, tokens, torch.full_like(tokens, -100))

    def ours_loss():
        logits = ours(tokens, mask)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)

    def peer_loss():
        return peer(input_ids=tokens, attention_mask=mask.long(), labels=labels).loss

    row = Row(workload="BERT-base MLM train", precision=precision, unit="tokens", work=batch * seq)
    sides = [Side("zoo", _train_step(ours, ours_loss, _zoo_opt(ours), precision)),
             Side("HF", _train_step(peer, peer_loss, _torch_adamw(peer), precision))]
    row.flops = _flops_of_train(ours_loss)
    row.seconds, row.spread = compare(sides, **timing)
    return row


# ---------------------------------------------------------------------------- the paper's model
class TorchTransformer(nn.Module):
    """The paper's base model written the usual way with ``torch.nn.Transformer`` (post-norm,
    shared embedding and output, sinusoidal positions, sqrt(d) scaling)."""

    def __init__(self, vocab: int, d: int = 512, heads: int = 8, layers: int = 6, ffn: int = 2048, max_len: int = 1024):
        super().__init__()
        self.d = d
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        pos = torch.arange(max_len).unsqueeze(1) * torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        table = torch.zeros(max_len, d)
        table[:, 0::2], table[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("pe", table, persistent=False)
        self.core = nn.Transformer(d, heads, layers, layers, ffn, dropout=0.1, batch_first=True)
        self.drop = nn.Dropout(0.1)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.emb(x) * self.d**0.5 + self.pe[: x.shape[1]])

    def forward(self, src, tgt, src_mask, tgt_mask):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.bool)
        h = self.core(self.embed(src), self.embed(tgt), tgt_mask=causal, tgt_is_causal=True,
                      src_key_padding_mask=~src_mask, tgt_key_padding_mask=~tgt_mask,
                      memory_key_padding_mask=~src_mask)
        return h @ self.emb.weight.t()


def _marian_config(vocab: int, tiny: bool):
    from transformers import MarianConfig

    size = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=128, decoder_ffn_dim=128) if tiny else dict(
        d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=2048, decoder_ffn_dim=2048)
    return MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, activation_function="relu", pad_token_id=0,
                        eos_token_id=2, decoder_start_token_id=1, bos_token_id=1, max_position_embeddings=512,
                        share_encoder_decoder_embeddings=True, scale_embedding=True, attn_implementation="sdpa",
                        dropout=0.1, **size)


def transformer_base(precision: str, timing: Timing, tiny: bool = False) -> Row:
    """The paper's base model: zoo vs HF MarianMTModel (same weights) vs an nn.Transformer model."""
    from transformers import MarianMTModel

    from zoo.interop.hf import from_hf

    vocab = 1000 if tiny else 32000
    batch, length = (2, 8) if tiny else (16, 64)
    peer = MarianMTModel(_marian_config(vocab, tiny)).train()
    ours = from_hf(peer).train()
    c = peer.config
    plain = TorchTransformer(vocab, c.d_model, c.encoder_attention_heads, c.encoder_layers, c.encoder_ffn_dim).train()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (batch, length), generator=g, device="cpu").to(here())
    tgt = torch.randint(4, vocab, (batch, length + 1), generator=g, device="cpu").to(here())
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    mask = torch.ones(batch, length, dtype=torch.bool)

    def ce(logits):
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), label_smoothing=0.1)

    ours_loss = lambda: ce(ours(src, tgt_in, mask, mask))  # noqa: E731
    marian_loss = lambda: ce(peer(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt_in).logits)  # noqa: E731
    plain_loss = lambda: ce(plain(src, tgt_in, mask, mask))  # noqa: E731
    row = Row(workload="Transformer base train", precision=precision, unit="src+tgt tokens", work=2 * batch * length)
    sides = [Side("zoo", _train_step(ours, ours_loss, _zoo_opt(ours), precision)),
             Side("HF Marian", _train_step(peer, marian_loss, _torch_adamw(peer), precision)),
             Side("nn.Transformer", _train_step(plain, plain_loss, _torch_adamw(plain), precision))]
    row.flops = _flops_of_train(ours_loss)
    row.seconds, row.spread = compare(sides, **timing)
    return row


# ------------------------------------------------------------------------------------ generation
def greedy(precision: str, timing: Timing, batch: int, new_tokens: int = 128, tiny: bool = False) -> Row:
    """GPT-2 small greedy decoding of ``new_tokens`` (no early stop), zoo.generate vs HF generate."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from zoo.interop.hf import from_hf

    cfg = GPT2Config(attn_implementation="sdpa", **(dict(n_layer=2, n_embd=64, n_head=4) if tiny else {}))
    new_tokens = 8 if tiny else new_tokens
    peer = GPT2LMHeadModel(cfg).eval()
    ours = from_hf(peer).eval()
    prompt = torch.randint(0, cfg.vocab_size, (batch, 16), generator=torch.Generator().manual_seed(0), device="cpu").to(here())

    def zoo_step():
        with T.autocast(here(), precision):
            out = zoo.generate(ours, prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_id=None)
        assert out.tokens.shape[1] >= new_tokens

    def hf_step():
        with torch.inference_mode(), T.autocast(here(), precision):
            out = peer.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        assert out.shape[1] == 16 + new_tokens

    row = Row(workload=f"GPT-2 small greedy b{batch}", precision=precision, unit="tokens", work=batch * new_tokens)
    row.seconds, row.spread = compare([Side("zoo", zoo_step), Side("HF", hf_step)], **timing)
    return row


def beam(precision: str, timing: Timing, batch: int = 8, new_tokens: int = 64, tiny: bool = False) -> Row:
    """The paper's base model, beam 4, ``new_tokens`` per sentence: zoo.generate vs Marian generate."""
    from transformers import MarianMTModel

    from zoo.interop.hf import from_hf

    vocab = 1000 if tiny else 32000
    new_tokens = 6 if tiny else new_tokens
    peer = MarianMTModel(_marian_config(vocab, tiny)).eval()
    ours = from_hf(peer).eval()
    src = torch.randint(4, vocab, (batch, 32), generator=torch.Generator().manual_seed(0), device="cpu").to(here())
    mask = torch.ones_like(src, dtype=torch.bool)

    def zoo_step():
        with T.autocast(here(), precision):
            zoo.generate(ours, src, padding_mask=mask, num_beams=4, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, bos_id=1, eos_id=2, pad_id=0)

    def hf_step():
        with torch.inference_mode(), T.autocast(here(), precision):
            peer.generate(src, attention_mask=mask.long(), num_beams=4, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False)

    row = Row(workload=f"Transformer base beam 4 b{batch}", precision=precision, unit="sentences", work=batch)
    row.seconds, row.spread = compare([Side("zoo", zoo_step), Side("HF Marian", hf_step)], **timing)
    return row


def compiled(precision: str, timing: Timing, tiny: bool = False) -> Row:
    """torch.compile on a zoo GPT 6L/384 training step vs the same model eager; compile time too."""
    spec = zoo.load_spec("gpt2-small", ["n_layers=2", "d_model=64", "block.attention.n_heads=4"] if tiny else
                         ["n_layers=6", "d_model=384", "block.attention.n_heads=6"])
    eager = zoo.build(spec, seed=0).train()
    comp_model = zoo.build(spec, seed=0).train()
    compiled_fwd = torch.compile(comp_model)
    batch, seq = (2, 16) if tiny else (8, 256)
    tokens = torch.randint(0, spec.vocab_size, (batch, seq))

    def loss_of(m):
        return lambda: F.cross_entropy(m(tokens)[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())

    step_c = _train_step(comp_model, loss_of(compiled_fwd), _zoo_opt(comp_model), precision)
    t0 = time.perf_counter()
    step_c()
    compile_s = time.perf_counter() - t0
    row = Row(workload="zoo GPT 6L/384 train, torch.compile", precision=precision, unit="tokens", work=batch * seq)
    sides = [Side("zoo compiled", step_c), Side("zoo eager", _train_step(eager, loss_of(eager), _zoo_opt(eager), precision))]
    row.seconds, row.spread = compare(sides, **timing)
    row.extra["compile_seconds"] = round(compile_s, 1)
    return row
