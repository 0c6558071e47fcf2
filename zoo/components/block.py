"""Transformer blocks: self-attention [+ cross-attention] + FFN with residuals, arranged as the
block's ``kind`` says. Each kind is one small class registered in the ``block`` registry::

    pre (GPT-2, LLaMA, ViT)           post (the paper, BERT)          post_sublayer (OLMo 2)
    x = x + drop(attn(norm(x)))       x = norm(x + drop(attn(x)))     x = x + drop(norm(attn(x)))
    x = x + drop(ffn(norm(x)))        x = norm(x + drop(ffn(x)))      x = x + drop(norm(ffn(x)))

    parallel (GPT-J, GPT-NeoX, PaLM)                        sandwich (Gemma 2, Gemma 3)
    x = x + drop(attn(norm1(x))) + drop(ffn(norm2(x)))      x = x + drop(post1(attn(norm1(x))))
    (one shared norm with shared_norm)                      x = x + drop(post2(ffn(norm2(x))))

With layer scale (CaiT, DeiT III) each sub-layer's output is multiplied by a learned per-channel
vector before the add: ``x + ls(drop(attn(...)))``; a residual scale (Granite) multiplies it by a
fixed number in the same place.

A block declares what summaries and initialisation need, so nothing outside it branches on its
class: :meth:`Block.sublayers` (its attention, cross-attention and FFN), :meth:`Block.branches`
(each sub-layer with the norms on its path), and from them its FLOPs and the activations a training
step keeps. Whether a stack of these blocks ends with a final norm is its spec's ``final_norm``.

Every block receives its layer's :class:`BlockContext` (masks, positions, the encoder's memory) and
its own layer's KV cache.

Shapes: B batch, T tokens, S memory tokens, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zoo.components import parts
from zoo.components.attention import Attention
from zoo.components.cache import LayerCache
from zoo.components.dropout import Dropout
from zoo.components.position import Position
from zoo.kernels import Mask
from zoo.protocols import HasSublayers, LayerCosts, SummaryPart, SummaryParts
from zoo.registry import register, registry


@dataclass(frozen=True)
class BlockContext:
    """What a block reads besides its input.

    ``pos``, ``positions``: the layer's position module and the tokens' positions ([T], or [B, T]
    with padding), for self-attention's ``pos.rotate``; ``mask``, ``is_causal``: self-attention's mask
    (a :class:`zoo.kernels.Mask`, or a dense tensor) and causal flag (with a dense mask or none); ``memory`` [B, S, D], ``memory_mask`` (broadcastable to
    [B, H, T, S], True = may attend): cross-attention's keys/values source and its padding.
    """

    pos: Position | None = None
    positions: Tensor | None = None
    rotation: object = None  # pos.rotation(positions), made once a pass for the layers sharing pos
    mask: Tensor | Mask | None = None
    is_causal: bool = False
    memory: Tensor | None = None
    memory_mask: Tensor | Mask | None = None


class LayerScale(nn.Module, SummaryPart):
    """x [..., D] -> x * gamma, a learned per-channel scale initialised to ``init`` (Touvron et al.
    2021, CaiT; timm's ``LayerScale``), then times the fixed ``multiplier`` where given."""

    summary_part = "norms"

    def __init__(self, dim: int, init: float, multiplier: float | None = None) -> None:
        super().__init__()
        self.init, self.multiplier = init, multiplier
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        x = x * self.gamma
        return x if self.multiplier is None else x * self.multiplier

    def extra_repr(self) -> str:
        return f"{self.gamma.shape[0]}, init={self.init}" + ("" if self.multiplier is None else f", multiplier={self.multiplier}")


class ResidualScale(nn.Module):
    """x -> x * ``multiplier``, a fixed number (Granite's residual_multiplier): no parameters."""

    def __init__(self, multiplier: float) -> None:
        super().__init__()
        self.multiplier = multiplier

    def forward(self, x: Tensor) -> Tensor:
        return x * self.multiplier

    def extra_repr(self) -> str:
        return f"{self.multiplier}"


class Block(nn.Module, SummaryParts, HasSublayers, LayerCosts):
    """The parts of one layer. ``cross_attn`` (with ``cross_norm``) only in encoder-decoder decoders.
    ``ls_attn``, ``ls_cross``, ``ls_ffn``: layer scales on the sub-layers' outputs (identities when None).
    Subclasses define ``forward`` and, where their norms sit otherwise, ``branches``."""

    # parameters by slot, for zoo.summary: attention and FFN; every other slot is a norm or a scale
    summary_parts = {"attn": "attention", "cross_attn": "attention", "ffn": "ffn", "*": "norms"}

    def __init__(
        self,
        *,
        attn: nn.Module,
        ffn: nn.Module,
        attn_norm: nn.Module,
        ffn_norm: nn.Module | None,
        cross_attn: nn.Module | None = None,
        cross_norm: nn.Module | None = None,
        dropout: float = 0.0,
        ls_attn: nn.Module | None = None,
        ls_cross: nn.Module | None = None,
        ls_ffn: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.ls_attn = attn_norm, attn, ls_attn or nn.Identity()
        if cross_attn is not None:
            self.cross_norm, self.cross_attn, self.ls_cross = cross_norm, cross_attn, ls_cross or nn.Identity()
        else:
            self.cross_attn = None
        self.ffn_norm, self.ffn, self.ls_ffn = ffn_norm, ffn, ls_ffn or nn.Identity()
        self.drop = Dropout(dropout)

    def sublayers(self) -> list[nn.Module]:
        """The sub-layers: self-attention, cross-attention (if any), FFN."""
        return [p for p in (self.attn, self.cross_attn, self.ffn) if p is not None]

    def attend(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        """Self-attention over ``x`` [B, T, D] with the layer's mask and positions (and cache)."""
        return self.attn(x, mask=ctx.mask, is_causal=ctx.is_causal, pos=ctx.pos,
                         positions=ctx.positions if ctx.rotation is None else ctx.rotation, cache=cache)

    def attend_memory(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        """Cross-attention from ``x`` to the encoder's memory (``ctx.memory``)."""
        return self.cross_attn(x, ctx.memory, mask=ctx.memory_mask, cache=cache)

    def branches(self) -> list[tuple[str, nn.Module, list[nn.Module], nn.Module]]:
        """Each sub-layer's residual branch: (its name, the sub-layer, the norms on the branch whose
        inputs the backward pass keeps, its layer scale)."""
        out = [("attn", self.attn, [self.attn_norm], self.ls_attn)]
        if self.cross_attn is not None:
            out.append(("cross", self.cross_attn, [self.cross_norm], self.ls_cross))
        return out + [("ffn", self.ffn, [self.ffn_norm], self.ls_ffn)]

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Forward FLOPs over ``tokens`` tokens (cross-attention: keys and values from ``memory``)."""
        return sum(parts.flops(part, tokens, memory if name == "cross" else None) for name, part, _, _ in self.branches())

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False) -> tuple[int, int]:
        """(elements, dropout-mask bytes) one sample keeps for the backward pass: per branch its
        input, each norm's input (and what the norm itself keeps), a layer scale's input, and what
        the sub-layer keeps (``zoo.components.parts.saved``)."""
        dim = _width(self)
        elements = masks = 0
        for name, part, norms, scale in self.branches():
            kept = dim + sum(dim + parts.norm_saved(n) for n in norms if n is not None)
            kept += dim if parts.has_parameters(scale) else 0
            elements += tokens * kept + parts.saved(part, tokens, memory if name == "cross" else None,
                                                    rotates=rotates and name == "attn")
            if self.drop.p:
                masks += tokens * dim
            masks += tokens * parts.mask_per_token(part)
        return elements, masks


class SandwichNormBlock(Block):
    """A norm before and after each sub-layer (Gemma 2 and 3): the sub-layer reads a normalised
    input, as Pre-Norm, and what it adds is normalised too, as ``post_sublayer``. ``*_post_norm``:
    the norms after the sub-layers."""

    def __init__(self, *, attn_post_norm: nn.Module, ffn_post_norm: nn.Module, cross_post_norm: nn.Module | None = None,
                 **parts) -> None:
        super().__init__(**parts)
        self.attn_post_norm, self.ffn_post_norm = attn_post_norm, ffn_post_norm
        if self.cross_attn is not None:
            self.cross_post_norm = cross_post_norm

    def branches(self) -> list[tuple[str, nn.Module, list[nn.Module], nn.Module]]:
        out = [("attn", self.attn, [self.attn_norm, self.attn_post_norm], self.ls_attn)]
        if self.cross_attn is not None:
            out.append(("cross", self.cross_attn, [self.cross_norm, self.cross_post_norm], self.ls_cross))
        return out + [("ffn", self.ffn, [self.ffn_norm, self.ffn_post_norm], self.ls_ffn)]

    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        x = x + self.ls_attn(self.drop(self.attn_post_norm(self.attend(self.attn_norm(x), ctx, cache))))
        if self.cross_attn is not None:
            x = x + self.ls_cross(self.drop(self.cross_post_norm(self.attend_memory(self.cross_norm(x), ctx, cache))))
        return x + self.ls_ffn(self.drop(self.ffn_post_norm(self.ffn(self.ffn_norm(x)))))


def _width(block: Block) -> int:
    """The model width: the input features of the FFN's first linear (or of any linear in it)."""
    linear = next((m for m in block.ffn.modules() if isinstance(m, nn.Linear)), None)
    return linear.in_features if linear is not None else 0


class PreNormBlock(Block):
    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        x = x + self.ls_attn(self.drop(self.attend(self.attn_norm(x), ctx, cache)))
        if self.cross_attn is not None:
            x = x + self.ls_cross(self.drop(self.attend_memory(self.cross_norm(x), ctx, cache)))
        return x + self.ls_ffn(self.drop(self.ffn(self.ffn_norm(x))))


class PostNormBlock(Block):
    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        x = self.attn_norm(x + self.ls_attn(self.drop(self.attend(x, ctx, cache))))
        if self.cross_attn is not None:
            x = self.cross_norm(x + self.ls_cross(self.drop(self.attend_memory(x, ctx, cache))))
        return self.ffn_norm(x + self.ls_ffn(self.drop(self.ffn(x))))


class PostSublayerNormBlock(Block):
    """The norm on each sub-layer's output, inside the residual branch (OLMo 2; Swin V2)."""

    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        x = x + self.ls_attn(self.drop(self.attn_norm(self.attend(x, ctx, cache))))
        if self.cross_attn is not None:
            x = x + self.ls_cross(self.drop(self.cross_norm(self.attend_memory(x, ctx, cache))))
        return x + self.ls_ffn(self.drop(self.ffn_norm(self.ffn(x))))


class ParallelBlock(Block):
    """Attention and FFN side by side on the same input (GPT-J, GPT-NeoX, PaLM). With
    ``ffn_norm=None`` one norm feeds both (GPT-J, PaLM)."""

    def __init__(self, *, ffn_norm: nn.Module | None, cross_attn: Attention | None = None, **parts) -> None:
        if cross_attn is not None:
            raise ValueError("ParallelBlock: a parallel block has no cross-attention")
        super().__init__(ffn_norm=ffn_norm, **parts)

    def branches(self) -> list[tuple[str, nn.Module, list[nn.Module], nn.Module]]:
        return [("attn", self.attn, [self.attn_norm], self.ls_attn), ("ffn", self.ffn, [self.ffn_norm], self.ls_ffn)]

    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        h = self.attn_norm(x)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(x)
        return x + self.ls_attn(self.drop(self.attend(h, ctx, cache))) + self.ls_ffn(self.drop(self.ffn(ffn_in)))


# ------------------------------------------------------------------------------------------ builders
def build_sublayers(spec, *, dim: int, dropout, cross: bool, layer_scale: bool = True) -> dict[str, nn.Module | None]:
    """The parts every block kind builds alike from a block ``spec``: ``attn``, ``ffn``,
    ``cross_attn`` (with ``cross``), the layer scales (or the fixed residual scales), and the residual ``dropout`` rate
    (``dropout`` is the model's DropoutSpec)."""

    def attention(aspec, is_cross: bool) -> nn.Module:
        return registry("attention").builder(aspec.kind)(
            aspec, dim=dim, kv_dim=dim, d_model=dim, dropout=dropout.attention, cross=is_cross)

    def scale() -> nn.Module | None:
        fixed = spec.residual_scale
        if spec.layer_scale is not None and layer_scale:
            return LayerScale(dim, spec.layer_scale, fixed)
        return None if fixed is None else ResidualScale(fixed)

    return dict(
        attn=attention(spec.attention, False),
        ffn=registry("ffn").builder(spec.ffn.kind)(spec.ffn, dim=dim, dropout=dropout.ffn, norm=spec.norm),
        cross_attn=attention(spec.cross, True) if cross else None,
        dropout=dropout.residual,
        ls_attn=scale(),
        ls_cross=scale() if cross else None,
        ls_ffn=scale(),
    )


def build_norm(spec, dim: int) -> nn.Module:
    """A norm of the block's kind (``spec.norm``)."""
    return registry("norm").builder(spec.norm.kind)(spec.norm, dim=dim)


def _norms(spec, dim: int, cross: bool) -> dict[str, nn.Module | None]:
    return dict(attn_norm=build_norm(spec, dim), cross_norm=build_norm(spec, dim) if cross else None,
                ffn_norm=build_norm(spec, dim))


@register("block", "pre")
def _pre(spec, *, dim: int, dropout, cross: bool = False, **_) -> Block:
    subs = build_sublayers(spec, dim=dim, dropout=dropout, cross=cross)
    norms = _norms(spec, dim, cross)
    if not spec.attn_norm:  # the attention reads x itself (ModernBERT's first layer)
        norms["attn_norm"] = nn.Identity()
    return PreNormBlock(**subs, **norms)


@register("block", "post")
def _post(spec, *, dim: int, dropout, cross: bool = False, **_) -> Block:
    subs = build_sublayers(spec, dim=dim, dropout=dropout, cross=cross)
    return PostNormBlock(**subs, **_norms(spec, dim, cross))


@register("block", "post_sublayer")
def _post_sublayer(spec, *, dim: int, dropout, cross: bool = False, **_) -> Block:
    subs = build_sublayers(spec, dim=dim, dropout=dropout, cross=cross)
    return PostSublayerNormBlock(**subs, **_norms(spec, dim, cross))


@register("block", "parallel")
def _parallel(spec, *, dim: int, dropout, cross: bool = False, **_) -> Block:
    subs = build_sublayers(spec, dim=dim, dropout=dropout, cross=False)
    return ParallelBlock(**subs, attn_norm=build_norm(spec, dim),
                         ffn_norm=None if spec.shared_norm else build_norm(spec, dim))


@register("block", "sandwich")
def _sandwich(spec, *, dim: int, dropout, cross: bool = False, **_) -> Block:
    subs = build_sublayers(spec, dim=dim, dropout=dropout, cross=cross)
    post = dict(attn_post_norm=build_norm(spec, dim), cross_post_norm=build_norm(spec, dim) if cross else None,
                ffn_post_norm=build_norm(spec, dim))
    return SandwichNormBlock(**subs, **_norms(spec, dim, cross), **post)
