"""Gemma 2: ``Gemma2ForCausalLM`` <-> a zoo decoder with Gemma's details (:mod:`zoo.interop.hf.gemma`:
embeddings times sqrt(d_model) rounded to their dtype, (1 + w) RMSNorm) and Gemma 2's own: a norm
before and after each sub-layer (``block.kind: sandwich``), the scores scaled by
``query_pre_attn_scalar ** -0.5`` (``block.attention.scale_dim``), soft-capped attention logits
(``block.attention.softcap`` = ``attn_logit_softcapping``) and final logits (``head.softcap`` =
``final_logit_softcapping``), and local (sliding-window) and global layers by ``layer_types``. The
sliding layers are the model's block, the global ones a layer pattern::

    block: {kind: sandwich, attention: {window: 4096, scale_dim: 256, softcap: 50.0, ...}, ...}
    layers: [{at: "1::2", block: {attention: {window: null}}}]      # Gemma 2: local, global, local, ...
    head: {kind: lm, softcap: 30.0}

Back to HF, zoo writes ``layer_types`` from each layer's window; layers that differ otherwise, or
two window sizes, are refused (Gemma 2 has one ``sliding_window``).
"""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY
from zoo.interop.common import rule, unsupported
from zoo.interop.hf.base import require
from zoo.interop.hf.gemma import GEMMA, Gemma
from zoo.interop.hf.llama import LLAMA_ACTS
from zoo.interop.hf.table import Derived, Fixed, Tensors, table
from zoo.interop.hf.traits import FULL, SLIDING, gated_ffn, softcaps, who
from zoo.spec import FamilySpec

__all__ = ["GEMMA2", "Gemma2", "layer_at", "layer_types", "read_layer_types", "write_layer_types"]


def layer_at(indices: list[int], n: int) -> int | str | list[int]:
    """The shortest ``at`` of a layer pattern that selects ``indices`` of ``n`` layers: an index, a
    slice ("5::6") where one gives exactly these, else the list."""
    if len(indices) == 1:
        return indices[0]
    start, step = indices[0], indices[1] - indices[0]
    if list(range(n))[start::step] == indices:
        return f"{start}::{step}" if step > 1 else f"{start}:"
    return list(indices)


def read_layer_types(c: Any, where: str, position: dict | None = None, full_position: dict | None = None) -> dict:
    """Gemma's ``layer_types`` as spec paths: the sliding layers' window on the model's block, and a
    pattern giving the full-attention layers no window (and, with ``full_position``, their own rope,
    base and scaling, where it differs from the model's ``position``)."""
    types = list(c.layer_types)
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise unsupported(where, "layer_types", unknown[0], f"zoo reads {FULL} and {SLIDING} layers")
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    full = [i for i, t in enumerate(types) if t == FULL]
    if not sliding:
        return {}
    if c.sliding_window is None:
        raise unsupported(where, "sliding_window", None, "sliding_attention layers need a window")
    out: dict = {"block.attention.window": c.sliding_window}
    if full:
        pattern: dict = {"at": layer_at(full, len(types)), "block": {"attention": {"window": None}}}
        if full_position is not None and full_position != position:
            pattern["position"] = full_position
        out["layers"] = [pattern]
    return out


def write_layer_types(s: FamilySpec, where: str, name: str, *, own_positions: bool) -> tuple[list[str], int | None, dict]:
    """Each layer's type (``sliding_attention`` where it has a window), the one window size, and
    each type's rope position. Every layer must be the model's block but for its window; with
    ``own_positions`` each type may have a rope of its own, base and scaling (Gemma 3), else no layer
    has its own position."""
    windows, positions = [], {}
    for i, layer in enumerate(s.stack_layers()):
        b = layer.block
        plain = b.model_copy(update={"attention": b.attention.model_copy(update={"window": s.block.attention.window})})
        if plain != s.block:
            raise unsupported(where, "layers", f"layer {i}'s block",
                              f"{name}'s layers differ in their attention window only (layer_types)")
        kind = FULL if b.attention.window is None else SLIDING
        position = layer.position or s.position
        if layer.position is not None and layer.position != s.position and not own_positions:
            raise unsupported(where, "layers", f"layer {i}'s position", f"{name} has one rope for every layer")
        if position.kind != "rope" or position.fraction != 1.0:
            raise unsupported(where, "layers", f"layer {i}'s position {position.model_dump(mode='json')}",
                              f"{name}'s layers rotate every dimension (rope, fraction 1)")
        if positions.setdefault(kind, position) != position:
            raise unsupported(where, "layers", f"layer {i}'s {_rope_text(position)}",
                              f"{name} has one rope per layer type, its {kind} layers (by block.attention.window) "
                              f"have {_rope_text(positions[kind])}")
        windows.append(b.attention.window)
    sizes = sorted({w for w in windows if w is not None})
    require(len(sizes) <= 1, where, "block.attention.window", sizes,
            f"{name} has one sliding_window for its sliding layers (layers with windows of several sizes)")
    return [FULL if w is None else SLIDING for w in windows], (sizes[0] if sizes else None), positions


def _rope_text(position: Any) -> str:
    scaling = position.scaling
    return f"rope base {position.base:g}" + ("" if scaling is None else f" with {scaling.kind} scaling "
                                             f"{scaling.model_dump(mode='json', exclude={'kind'}, exclude_none=True)}")


def layer_types(*, own_positions: bool = False, full_position=None, position=None) -> Derived:
    """``layer_types`` and ``sliding_window`` <-> the block's window and the full-attention layers'
    pattern (:func:`read_layer_types`, :func:`write_layer_types`); with ``own_positions`` the full
    layers' rope may differ, ``position(c, where)`` and ``full_position(c, where)`` reading each."""

    def read(c: Any, where: str) -> dict:
        if full_position is None:
            return read_layer_types(c, where)
        return read_layer_types(c, where, position(c, where), full_position(c, where))

    def write(s: FamilySpec, where: str) -> dict:
        types, window, _ = write_layer_types(s, where, who(where), own_positions=own_positions)
        # HF builds the sliding mask even without sliding layers, so it needs a window: the context
        return {"layer_types": types, "sliding_window": window if window is not None else s.max_seq_len}

    return Derived("window", read, write, {"block.attention.window": ANY, "layers": ANY})


def _scale_dim(c: Any, where: str) -> dict:
    scalar = c.query_pre_attn_scalar
    if scalar != int(scalar):
        raise unsupported(where, "query_pre_attn_scalar", scalar, "zoo's scale_dim is a whole number")
    return {"block.attention.scale_dim": None if int(scalar) == c.head_dim else int(scalar)}


def _post_norms(s: FamilySpec, z: str, h: str) -> list:
    return [rule(f"{z}.attn_post_norm.weight", f"{h}.post_attention_layernorm.weight"),
            rule(f"{z}.ffn_post_norm.weight", f"{h}.post_feedforward_layernorm.weight")]


GEMMA2 = table(
    GEMMA,
    gated_ffn(LLAMA_ACTS, "hidden_activation"),  # Gemma 2 reads "gelu" as exact GELU
    Fixed("block.kind", "sandwich", why="a norm before and after each sub-layer (sandwich)"),
    Derived("scale_dim", _scale_dim, lambda s, where: {"query_pre_attn_scalar": s.block.attention.scale_size(s.d_model)},
            {"block.attention.scale_dim": ANY}),
    softcaps(),
    layer_types(),
    Tensors("post norms", _post_norms),
)


class Gemma2(Gemma):
    name = "Gemma2ForCausalLM"
    config_name = "Gemma2Config"
    model_type = "gemma2"
    base = "Gemma2Model"
    norm_names = ("input_layernorm", "pre_feedforward_layernorm")
    table = GEMMA2
