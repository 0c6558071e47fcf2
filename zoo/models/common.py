"""What every family builder shares: parts from specs, stacks, input checks, initialisation."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from zoo.components.attention import attention_mask
from zoo.components.block import (
    Block,
    BlockContext,
    LayerScale,
    ParallelBlock,
    PostNormBlock,
    PostSublayerNormBlock,
    PreNormBlock,
    Stack,
)
from zoo.components.cache import KVCache
from zoo.components.embedding import TokenEmbedding
from zoo.components.parts import residual_linears
from zoo.components.position import LearnedPosition, Position
from zoo.registry import registry
from zoo.spec import FamilySpec


def build_part(part: str, spec, **context) -> nn.Module:
    """The module the ``part`` registry builds for ``spec.kind``."""
    return registry(part).builder(spec.kind)(spec, **context)


def token_embedding(spec: FamilySpec, vocab_size: int) -> TokenEmbedding:
    """A token embedding of ``vocab_size`` rows, scaled as ``spec.embedding`` says."""
    e = spec.embedding
    return TokenEmbedding(vocab_size, spec.d_model, scale=e.scale, round_scale=e.round_scale)


def build_position(spec: FamilySpec, *, max_len: int, grid: tuple[int, int] | None = None) -> Position:
    att = spec.block.attention
    return build_part(
        "position", spec.position,
        dim=spec.d_model, max_len=max_len, n_heads=att.n_heads, head_dim=att.qk_size(spec.d_model), grid=grid,
    )


_PLACEMENTS = {"pre": PreNormBlock, "post": PostNormBlock, "post_sublayer": PostSublayerNormBlock}


def build_stack(spec: FamilySpec, n_layers: int, *, cross: bool = False, final_norm: bool | None = None) -> Stack:
    """``n_layers`` blocks as the spec says; ``cross`` adds cross-attention (decoders of encoder-decoders).
    The block class follows ``block.parallel`` and the norm placement; ``final_norm`` defaults to the
    placement's (``spec.has_final_norm``)."""
    d, b, drop = spec.d_model, spec.block, spec.dropout
    parallel = b.parallel

    def norm() -> nn.Module:
        return build_part("norm", b.norm, dim=d)

    def attention(aspec, is_cross: bool) -> nn.Module:
        return build_part("attention", aspec, dim=d, kv_dim=d, d_model=d, dropout=drop.attention, cross=is_cross)

    def scale() -> nn.Module | None:
        return LayerScale(d, b.layer_scale) if b.layer_scale is not None else None

    block_cls = ParallelBlock if parallel is not None else _PLACEMENTS[spec.norm_placement]
    blocks = [
        block_cls(
            attn=attention(b.attention, False),
            ffn=build_part("ffn", b.ffn, dim=d, dropout=drop.ffn),
            attn_norm=norm(),
            ffn_norm=None if parallel is not None and parallel.shared_norm else norm(),
            cross_attn=attention(b.cross, True) if cross else None,
            cross_norm=norm() if cross else None,
            dropout=drop.residual,
            ls_attn=scale(),
            ls_cross=scale() if cross else None,
            ls_ffn=scale(),
        )
        for _ in range(n_layers)
    ]
    return Stack(blocks, norm() if (spec.has_final_norm if final_norm is None else final_norm) else None)


def positions_for(mask: Tensor | None, length: int, device: torch.device) -> Tensor:
    """Token positions: 0..T-1 ([T]), or with a padding mask the count of real tokens before each
    one ([B, T]), so a left-padded row gets the positions it would have unpadded."""
    if mask is None:
        return torch.arange(length, device=device)
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def self_attention_inputs(
    position: Position,
    n_heads: int,
    tokens: Tensor,
    padding_mask: Tensor | None,
    *,
    causal: bool,
    cache: KVCache | None = None,
    window: int | None = None,
    name: str = "tokens",
) -> BlockContext:
    """The blocks' context for self-attention over ``tokens`` (and the cache): the tokens' positions
    (they feed ``position.add`` and ``rotate``) and the SDPA mask, which folds causality, key padding,
    the position's score bias and a sliding ``window`` together (see ``attention_mask``)."""
    B, T = tokens.shape
    if cache is None:
        positions = key_positions = positions_for(padding_mask, T, tokens.device)
        key_mask, S = padding_mask, T
    else:
        positions, key_positions, key_mask = cache.extend(padding_mask, T, B, tokens.device)
        S = cache.end
    if position.max_len is not None and S > position.max_len:
        raise ValueError(
            f"{name}: length {S} exceeds max_seq_len ({position.max_len}) of the position table; "
            f"truncate the input or build the model with a larger max_seq_len"
        )
    bias = position.bias(n_heads, positions, key_positions)
    mask, is_causal = attention_mask(q_len=T, k_len=key_positions.shape[-1], causal=causal, key_padding=key_mask, bias=bias,
                                     window=window, device=tokens.device)
    return BlockContext(pos=position, positions=positions, mask=mask, is_causal=is_causal)


def check_tokens(tokens: object, name: str, *, vocab_size: int) -> None:
    """Refuse what the embedding would fail on deep inside torch, with the field and the fix."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name}: expected integer token ids of shape [batch, length], got {got}")
    if tokens.shape[1] == 0:
        raise ValueError(f"{name}: empty sequence (length 0)")
    if tokens.device.type == "cpu" and not torch.compiler.is_compiling():
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}: token ids must be in [0, {vocab_size}) (vocab_size), got ids from {lo} to {hi}")


def check_mask(mask: object, tokens: Tensor, name: str) -> Tensor | None:
    """A padding mask [B, T], True (or 1) for real tokens, as a bool tensor."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.shape != tokens.shape:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(
            f"{name}: expected a boolean mask of shape {tuple(tokens.shape)} (True = real token, False = padding), got {got}"
        )
    return mask.to(torch.bool)


def _parts(model: nn.Module) -> list[nn.Module]:
    """The blocks' parts, and any other module that declares ``residual_out``."""
    parts = {id(p): p for block in model.modules() if isinstance(block, Block) for p in block.parts()}
    parts.update((id(m), m) for m in model.modules() if getattr(m, "residual_out", None) is not None)
    return list(parts.values())


def init_weights(model: nn.Module, spec: FamilySpec) -> None:
    """Initialise linear, embedding and learned position weights as ``spec.init`` says; biases zero.
    The residual output linears are those the parts name (``zoo.components.parts.residual_out``)."""
    init, d = spec.init, spec.d_model
    residual_std = init.std / math.sqrt(2 * spec.n_layers) if init.scaled_residual else init.std
    residual = {id(m.weight) for part in _parts(model) for m in residual_linears(part)}

    def normal(w: Tensor, std: float) -> None:
        if init.scheme == "trunc_normal":
            nn.init.trunc_normal_(w, std=std, a=-2.0, b=2.0)  # as timm: cut at +-2, not +-2 std
        else:
            nn.init.normal_(w, std=std)

    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            w = m.weight if isinstance(m, nn.Linear) else m.weight.view(m.weight.shape[0], -1)
            if init.scheme == "xavier" or isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(w)
            else:
                normal(m.weight, residual_std if id(m.weight) in residual else init.std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    # Embeddings last: a tied output projection shares their weight and must keep their init.
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            normal(m.weight, d**-0.5 if init.scheme == "xavier" else init.std)
        elif isinstance(m, LearnedPosition):
            normal(m.weight, init.std)
