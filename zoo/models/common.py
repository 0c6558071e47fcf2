"""What every family builder shares: parts from specs, stacks of resolved layers, input checks,
initialisation."""

from __future__ import annotations

import json
import math

import torch
from torch import Tensor, nn

from zoo.components.embedding import TokenEmbedding
from zoo.components.linear import Linear
from zoo.components.parts import residual_linears
from zoo.components.position import NoPosition, Position
from zoo.components.stack import Stack
from zoo.protocols import HasSublayers, InitNormal, InitResidual, ResidualWriter, SummaryPart
from zoo.registry import registry
from zoo.spec import FamilySpec


def build_part(part: str, spec, **context) -> nn.Module:
    """The module the ``part`` registry builds for ``spec.kind``."""
    return registry(part).builder(spec.kind)(spec, **context)


def token_embedding(spec: FamilySpec, vocab_size: int) -> TokenEmbedding:
    """A token embedding of ``vocab_size`` rows, ``embedding.dim`` (else d_model) wide, scaled as
    ``spec.embedding`` says."""
    e = spec.embedding
    return TokenEmbedding(vocab_size, e.dim or spec.d_model, scale=e.scale, round_scale=e.round_scale,
                          multiplier=e.multiplier)


def embedding_projection(spec: FamilySpec) -> nn.Module:
    """Factorised embeddings' linear map (with a bias) from ``embedding.dim`` to d_model; else nothing."""
    e = spec.embedding.dim
    return nn.Identity() if e is None else EmbeddingProjection(e, spec.d_model)


class EmbeddingProjection(Linear, SummaryPart):
    """[B, T, E] factorised embeddings -> [B, T, D] (ALBERT's embedding_hidden_mapping_in, ELECTRA's
    embeddings_project)."""

    summary_part = "embeddings"


def build_position(spec: FamilySpec, position=None, *, block=None, max_len: int,
                   grid: tuple[int, int] | None = None, causal: bool = False) -> Position:
    """The position module of ``position`` (default: the model's) for layers of ``block`` (default:
    the model's) in a ``causal`` stack or not. The model's own position, where its kind is one per
    stack (``per_stack``: T5's relative bias) or per layer (``per_layer``: BEiT's 2-D relative bias), adds
    nothing: :func:`build_stack` gives each stack or layer one."""
    if position is None and (type(spec.position).per_stack or type(spec.position).per_layer):
        return NoPosition()
    att = (block or spec.block).attention
    dim = spec.d_model if position is not None else getattr(spec, "embedding_dim", spec.d_model)  # added to the embeddings
    return build_part(
        "position", position or spec.position,
        dim=dim, max_len=max_len, n_heads=att.n_heads, head_dim=att.rope_size(spec.d_model), grid=grid,
        causal=causal,
    )


def build_stack(spec: FamilySpec, stack: str = "stack", *, max_len: int, final_norm: bool | None = None,
                causal: bool = False) -> Stack:
    """The blocks of ``stack`` (a name of ``spec.stacks()``) from its resolved layers: each layer's
    block kind and parts, its window and its own position (one module per distinct position and
    head shape, shared by the layers that have it; a position kind that is one per stack, such as
    T5's relative bias, is every other layer's own; one per layer, such as BEiT's 2-D relative bias,
    each layer's own); then the final norm where the block kind declares one (``final_norm``
    overrides) and the final dropout. With ``shared_layers`` each layer
    runs its group's first block (one module at several indices: tied names). ``causal``: the stack's
    self-attention is causal (a decoder's), which a position may depend on."""
    _, cross = spec.stacks()[stack]
    layers = spec.stack_layers(stack)
    own: dict[str, Position] = {}
    blocks, windows, positions, chunks = [], [], [], []
    for layer in layers:
        b = layer.block
        blocks.append(build_part("block", b, dim=spec.d_model, dropout=spec.dropout, cross=cross))
        windows.append(b.attention.window)  # every attention spec is an AttentionSpec
        chunks.append(getattr(b.attention, "chunk", None))
        own_kind = type(spec.position).per_stack or type(spec.position).per_layer
        position = layer.position or (spec.position if own_kind else None)
        if position is None:
            positions.append(None)
        else:  # one module per distinct position (and query/key heads it turns); per layer: one each
            att = b.attention
            layer_key = len(positions) if type(position).per_layer else None
            key = json.dumps([position.model_dump(mode="json"), att.n_heads, att.rope_size(spec.d_model), layer_key],
                             sort_keys=True)
            if key not in own:
                own[key] = build_position(spec, position, block=b, max_len=max_len, causal=causal,
                                          grid=getattr(spec, "grid", None))
            positions.append(own[key])
    if getattr(spec, "shared_layers", None) is not None:  # each layer runs its group's first block
        blocks = [blocks[first] for first in spec.weight_layers(stack)]
    ends = type(layers[-1].block).final_norm if final_norm is None else final_norm
    norm = build_part("norm", spec.block.norm, dim=spec.d_model) if ends else None
    return Stack(blocks, norm, windows=windows, positions=positions, dropout=spec.dropout.final, chunks=chunks)


def check_tokens(tokens: object, name: str, *, vocab_size: int) -> None:
    """Refuse what the embedding would fail on deep inside torch, with the field and the fix."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name}: expected integer token ids of shape [batch, length], got {got}")
    if tokens.shape[1] == 0:
        raise ValueError(f"{name}: empty sequence (length 0)")
    if tokens.device.type == "cpu" and tokens.numel() and not torch.compiler.is_compiling():
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


def _residual_parts(model: nn.Module) -> list[nn.Module]:
    """The blocks' sub-layers, and any other module that declares ``residual_out``."""
    found = {}
    for m in model.modules():
        if isinstance(m, HasSublayers):
            found.update((id(p), p) for p in m.sublayers())
        if isinstance(m, ResidualWriter):
            found[id(m)] = m
    return list(found.values())


def init_weights(model: nn.Module, spec: FamilySpec) -> None:
    """Initialise linear, embedding and learned position weights as ``spec.init`` says; biases zero.
    The residual output linears are those the parts name (``zoo.components.parts.residual_out``);
    a module's ``init_normal`` names parameters drawn like embeddings (a learned position table),
    its ``init_residual`` parameters drawn like residual output linears (stacked expert weights)."""
    init, d = spec.init, spec.d_model
    residual_std = init.std / math.sqrt(2 * spec.n_layers) if init.scaled_residual else init.std
    residual = {id(m.weight) for part in _residual_parts(model) for m in residual_linears(part)}

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
        for name in m.init_normal if isinstance(m, InitNormal) else ():
            normal(getattr(m, name), init.std)
        for name in m.init_residual if isinstance(m, InitResidual) else ():
            normal(getattr(m, name), residual_std)
