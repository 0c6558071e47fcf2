"""Pooling: tokens [B, T, D] -> one vector [B, D] (a ViT's classifier input, an encoder's pooled output).

A pool is called as ``pool(x, prefix)``: ``x`` holds every token, ``[class token?, registers...,
patches...]``, and ``prefix`` says how many come before the patches. An encoder calls it as
``pool(x, 0, tokens=tokens, padding_mask=padding_mask)`` (the token ids [B, T], True at real
tokens), which the text pools read (:class:`EosPool`, :class:`MeanPool` leaving padding out).
Pools register in the ``pool`` registry like any part (``builder(spec, *, dim, block)``, ``block``
the model's BlockSpec, whose attention, FFN and norm a pool may borrow).

Shapes: B batch, T tokens, P prefix tokens, N patches, D model width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components.attention import Attention
from zoo.components.parts import flops
from zoo.protocols import CountsFlops, SavesPerToken, SummaryPart
from zoo.registry import register, registry


class ClsPool(nn.Module):
    """The class token (the first token)."""

    def forward(self, x: Tensor, prefix: int, tokens: Tensor | None = None, padding_mask: Tensor | None = None) -> Tensor:
        return x[:, 0]


class MeanPool(nn.Module):
    """The mean of the patch tokens (prefix tokens left out, as timm's ``avg``); of the real tokens
    where a ``padding_mask`` says which they are."""

    def forward(self, x: Tensor, prefix: int, tokens: Tensor | None = None, padding_mask: Tensor | None = None) -> Tensor:
        x = x[:, prefix:]
        if padding_mask is None:
            return x.mean(dim=1)
        real = padding_mask[:, prefix:].unsqueeze(-1).to(x.dtype)  # (B, N, 1)
        return (x * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)


class EosPool(nn.Module):
    """The hidden state at each row's first ``token`` (CLIP's end of text), or with ``token`` None at
    the row's highest id (OpenAI CLIP's end-of-text id, its vocabulary's last); a row without the
    token pools its first slot (the argmax of no match), as HF's ``CLIPTextModel``."""

    def __init__(self, token: int | None) -> None:
        super().__init__()
        self.token = token

    def forward(self, x: Tensor, prefix: int, tokens: Tensor | None = None, padding_mask: Tensor | None = None) -> Tensor:
        if tokens is None:
            raise ValueError("pool: eos finds the end-of-text token in the token ids; pass tokens")
        ids = tokens.int()  # argmax takes the first of equal values: the first end-of-text slot
        slot = (ids == self.token).int().argmax(dim=-1) if self.token is not None else ids.argmax(dim=-1)  # (B,)
        return _at_real(x, slot, padding_mask, "eos", "its first end-of-text token is padding, or it has none; give "
                        "each row one among its real tokens (pad on the right, or with another id)")


class LastPool(nn.Module):
    """The last slot's hidden state (SigLIP's text tower, whose rows are padded to their full length
    without a mask). A padding token there is refused: HF's reference computes its state with the
    token hidden from itself, zoo's lets a padding token attend to itself (no row is empty)."""

    def forward(self, x: Tensor, prefix: int, tokens: Tensor | None = None, padding_mask: Tensor | None = None) -> Tensor:
        slot = torch.full((x.shape[0],), x.shape[1] - 1, device=x.device)
        return _at_real(x, slot, padding_mask, "last", "pad on the left, or pass the padding tokens as real ones "
                        "(no padding_mask), as SigLIP's rows padded to max_seq_len are")


def _at_real(x: Tensor, slot: Tensor, padding_mask: Tensor | None, kind: str, fix: str) -> Tensor:
    """``x[b, slot[b]]`` for each row b [B, D]; a padding token there is refused (pool ``kind``, its ``fix``)."""
    rows = torch.arange(x.shape[0], device=x.device)
    if padding_mask is not None and not torch.compiler.is_compiling():
        padded = (~padding_mask[rows, slot]).nonzero().flatten().tolist()
        if padded:
            raise ValueError(f"padding_mask: pool {kind} would pool a padding token in row {padded[0]}; {fix}")
    return x[rows, slot]


class AttentionPool(nn.Module, SummaryPart, CountsFlops, SavesPerToken):
    """Multihead attention pooling (MAP; timm's ``AttentionPoolLatent`` with one latent): a learned
    query ``latent`` [1, 1, D] attends over the patch tokens (cross-attention ``attn``: ``q`` on the
    latent, ``kv`` on the patches, ``out``), then ``y = y + ffn(norm(y))``. A ``padding_mask`` hides
    the padding patches from the query."""

    summary_part = "head"

    def __init__(self, dim: int, *, attn: Attention, norm: nn.Module, ffn: nn.Module) -> None:
        super().__init__()
        self.latent = nn.Parameter(torch.empty(1, 1, dim))
        nn.init.trunc_normal_(self.latent, std=dim**-0.5, a=-2 * dim**-0.5, b=2 * dim**-0.5)  # as timm
        self.attn, self.norm, self.ffn = attn, norm, ffn

    def forward(self, x: Tensor, prefix: int, tokens: Tensor | None = None, padding_mask: Tensor | None = None) -> Tensor:
        patches = x[:, prefix:]  # (B, N, D)
        mask = None if padding_mask is None else padding_mask[:, None, None, prefix:].bool()  # padding patches hidden
        y = self.attn(self.latent.expand(x.shape[0], -1, -1).to(x.dtype), patches, mask=mask)  # (B, 1, D)
        y = y + self.ffn(self.norm(y))
        return y[:, 0]

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Over ``tokens`` patch tokens: their keys and values, one query, the FFN on one vector."""
        return flops(self.attn, 1, tokens) + flops(self.ffn, 1)

    def saved_per_token(self) -> int:
        """Elements per patch token kept for the backward pass: the kv projection's input and output."""
        return self.attn.kv.in_features + self.attn.kv.out_features


@register("pool", "cls")
def _cls(spec, **_) -> nn.Module:
    return ClsPool()


@register("pool", "mean")
def _mean(spec, **_) -> nn.Module:
    return MeanPool()


@register("pool", "eos")
def _eos(spec, **_) -> nn.Module:
    return EosPool(spec.token)


@register("pool", "last")
def _last(spec, **_) -> nn.Module:
    return LastPool()


@register("pool", "map")
def _map(spec, *, dim: int, block, **_) -> nn.Module:
    heads = spec.n_heads or block.attention.n_heads
    attn = Attention(dim, n_heads=heads, n_kv_heads=heads, head_dim=dim // heads, v_head_dim=dim // heads, bias=spec.bias,
                     cross=True, kv_dim=dim)
    ffn_spec = block.ffn.model_copy(update={"hidden": spec.hidden or block.ffn.hidden_size(dim), "bias": spec.bias})
    ffn = registry("ffn").builder(ffn_spec.kind)(ffn_spec, dim=dim, dropout=0.0, norm=block.norm)
    norm = registry("norm").builder(block.norm.kind)(block.norm, dim=dim)
    return AttentionPool(dim, attn=attn, norm=norm, ffn=ffn)
