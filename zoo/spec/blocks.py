"""The specs of one layer and of layers that differ.

A **block** is a registered part like any other: ``block.kind`` picks how a layer arranges its
sub-layers, norms and residuals (``pre``, ``post``, ``post_sublayer``, ``parallel``, ``sandwich``,
or a kind a user registers), and each kind's spec class declares what the rest of zoo needs to know of it:

* ``final_norm``: the stack ends with a norm (a Pre-Norm stack would end unnormalised without it;
  a Post-Norm stack already ends in one);
* ``takes_cross``: it can hold cross-attention (a decoder of an encoder-decoder).

A **layer pattern** (``layers: [...]`` in a model spec) gives the layers it selects (``at``) a block
of their own, written as the changes to the model's ``block`` (a partial mapping, merged over it),
and/or a position of their own for what acts inside attention (another RoPE base, or none)::

    block: {attention: {kind: gqa, n_heads: 8, n_kv_heads: 4, window: 512}, ...}
    layers:
      - at: "5::6"                             # layers 5, 11, 17, ... (a Python slice), or [0, 3], or 7
        block: {attention: {window: null}}     # attend to every earlier token
        position: {kind: rope, base: 1.0e6}    # their own RoPE base

Patterns apply in order (a later one wins where two select a layer); :func:`resolve` turns a
model's block and patterns into one resolved :class:`Layer` per layer, which everything that walks a
stack reads (build, summary, KV cache, converters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator

from zoo.registry import RegistryError, registry
from zoo.spec.base import ComponentSpec, Dispatch, Spec, register_specs
from zoo.validation import problem_lines
from zoo.spec.parts import AnyAttention, AnyFFN, AnyNorm, AnyPosition, AttentionSpec, LayerNormSpec, ReluFFNSpec, checked_multiplier

__all__ = [
    "AnyBlock", "BlockSpec", "Layer", "LayerPattern", "ParallelBlockSpec", "PostBlockSpec", "PostSublayerBlockSpec",
    "PreBlockSpec", "SandwichBlockSpec", "merge_parts", "resolve", "select_layers",
]


# ------------------------------------------------------------------------------------------- blocks
class BlockSpec(ComponentSpec):
    """One layer: self-attention [+ cross-attention] + FFN, each with a residual and norms placed as
    ``kind`` says.

    ``layer_scale`` (LayerScale, Touvron et al. 2021, CaiT; DeiT III; timm's ``init_values``)
    multiplies each sub-layer's output by a learned per-channel vector, initialised to this value,
    before the residual add; ``residual_scale`` by a fixed number (Granite's residual_multiplier)."""

    final_norm: ClassVar[bool] = True
    takes_cross: ClassVar[bool] = True

    attention: AnyAttention = Field(default_factory=AttentionSpec)
    cross_attention: AnyAttention | None = Field(None, description="encoder-decoder only; default: as attention")
    ffn: AnyFFN = Field(default_factory=ReluFFNSpec)
    norm: AnyNorm = Field(default_factory=LayerNormSpec)
    layer_scale: float | None = Field(
        None, description="initial value of the per-channel scale on each sub-layer's output (e.g. 1e-5); null: none"
    )

    residual_scale: float | None = Field(
        None, description="each sub-layer's output multiplied by this fixed number before the residual add (after "
        "the layer scale, if any; Granite's residual_multiplier, 0.22); null: none",
    )

    @field_validator("residual_scale")
    @classmethod
    def _check_residual_scale(cls, value: float | None) -> float | None:
        return checked_multiplier(value, "residual_scale", "the sub-layers' outputs' factor", "0.22 (Granite's residual_multiplier)")

    @field_validator("layer_scale")
    @classmethod
    def _check_layer_scale(cls, value: float | None) -> float | None:
        if value is not None and not (value > 0 and value != float("inf")):
            raise ValueError(
                f"layer_scale is the initial value of the scales and must be a positive number, got {value!r}; "
                f"use a small value such as 1e-5 (CaiT) or 1e-6 (DeiT III), or null for no layer scale"
            )
        return value

    @property
    def cross(self) -> AttentionSpec:
        """The cross-attention's spec: ``cross_attention``, else the self-attention's."""
        return self.cross_attention or self.attention


class PreBlockSpec(BlockSpec):
    """Pre-Norm (GPT-2, LLaMA, ViT): ``x = x + drop(sublayer(norm(x)))``; the stack ends with a norm."""

    kind: Literal["pre"] = "pre"
    attn_norm: bool = Field(
        True, description="a norm before the attention; false: the attention reads the residual stream as it is "
        "(ModernBERT's first layer, whose input the embedding norm has just normalised)"
    )


class PostBlockSpec(BlockSpec):
    """Post-Norm (the paper, BERT): ``x = norm(x + drop(sublayer(x)))``; no final norm."""

    kind: Literal["post"] = "post"
    final_norm: ClassVar[bool] = False


class PostSublayerBlockSpec(BlockSpec):
    """The norm on each sub-layer's output, inside the residual branch (OLMo 2; Swin V2's
    res-post-norm): ``x = x + drop(norm(sublayer(x)))``; the stack ends with a norm."""

    kind: Literal["post_sublayer"] = "post_sublayer"


class ParallelBlockSpec(BlockSpec):
    """Attention and FFN side by side on the same input, both added to it (Wang & Komatsuzaki 2021,
    GPT-J; GPT-NeoX; PaLM): ``x + attn(norm1(x)) + ffn(norm2(x))``, or with ``shared_norm``
    ``x + attn(norm(x)) + ffn(norm(x))``; the stack ends with a norm. No cross-attention."""

    kind: Literal["parallel"] = "parallel"
    takes_cross: ClassVar[bool] = False
    shared_norm: bool = Field(False, description="one norm feeds attention and FFN (GPT-J, PaLM); false: each has its own (GPT-NeoX)")


class SandwichBlockSpec(BlockSpec):
    """A norm before and after each sub-layer (Gemma 2 and 3; "sandwich" norms, Ding et al. 2021,
    CogView): ``x = x + drop(norm2(sublayer(norm1(x))))``; the stack ends with a norm."""

    kind: Literal["sandwich"] = "sandwich"


AnyBlock = Annotated[ComponentSpec, Dispatch("block", default="pre")]

register_specs("block", BlockSpec, {"pre": PreBlockSpec, "post": PostBlockSpec, "post_sublayer": PostSublayerBlockSpec,
                                    "parallel": ParallelBlockSpec, "sandwich": SandwichBlockSpec})


# ------------------------------------------------------------------------------------ layer patterns
class LayerPattern(Spec):
    """Layers of a stack that differ from the model's ``block`` (see the module docstring)."""

    at: int | list[int] | str = Field(
        description='the layers: an index (negative from the end), a list of indices, or a Python slice such as '
        '"5::6" (every sixth layer from layer 5) or "2:" (layer 2 on)'
    )
    stack: str | None = Field(None, description="which stack of a family with several (encoder or decoder); null: each")
    block: dict[str, Any] | None = Field(
        None, description="these layers' changes to the model's block, a partial block mapping merged over it "
        "(a part given with another kind replaces the model's part)"
    )
    position: AnyPosition | None = Field(
        None, description="these layers' own position for what acts inside attention (rope with another base, "
        "alibi, or none for no positions); null: the model's"
    )

    @field_validator("at")
    @classmethod
    def _check_at(cls, at: int | list[int] | str) -> int | list[int] | str:
        if isinstance(at, str):
            _slice(at)
        elif isinstance(at, list) and not at:
            raise ValueError("an empty list selects no layer; give indices, a slice such as '1::2', or remove the pattern")
        return at


def _slice(text: str) -> slice:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        return slice(*(int(p) if p.strip() else None for p in parts))
    except ValueError:
        raise ValueError(
            f"{text!r} is no slice; write start:stop:step as in Python ('5::6', '2:', ':4'), or give indices"
        ) from None


def select_layers(at: int | list[int] | str, n: int) -> list[int]:
    """The layers of ``n`` that ``at`` selects, in order; a ValueError names what does not fit."""
    if isinstance(at, str):
        s = _slice(at)
        if s.step == 0:
            raise ValueError(f"{at!r}: a slice step cannot be zero")
        chosen = list(range(n))[s]
        if not chosen:
            raise ValueError(f"{at!r} selects no layer of {n}; check start, stop and step")
        return chosen
    indices = [at] if isinstance(at, int) else at
    bad = [i for i in indices if not -n <= i < n]
    if bad:
        raise ValueError(f"layer {bad[0]} is not among the {n} layers (0 to {n - 1}, or -{n} to -1)")
    return sorted({i % n for i in indices})


# the block fields that hold a registered part, and the registry of each
PART_FIELDS = {"attention": "attention", "cross_attention": "attention", "ffn": "ffn", "norm": "norm"}


def merge_parts(base: dict, over: dict, parts: dict[str, str] = PART_FIELDS, registry_name: str = "block") -> dict:
    """``over`` merged into ``base`` (both plain mappings of one spec). A nested mapping merges key by
    key, except that a part given with another ``kind`` keeps only what the new kind's spec knows;
    ``None`` replaces."""
    out = dict(base)
    kind = over.get("kind", base.get("kind"))
    if kind != base.get("kind"):
        out = _known(out, registry_name, kind)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            if key in parts:
                out[key] = merge_parts(old, value, {}, parts[key])
            else:
                out[key] = merge_parts(old, value, {}, "")
        else:
            out[key] = value
    return out


def _known(mapping: dict, registry_name: str, kind: Any) -> dict:
    """The keys of ``mapping`` that the spec of ``kind`` in ``registry_name`` knows (all, if unknown)."""
    if not registry_name:
        return dict(mapping)
    try:
        fields = registry(registry_name).spec(kind).model_fields
    except RegistryError:
        return dict(mapping)
    return {k: v for k, v in mapping.items() if k in fields}


@dataclass(frozen=True)
class Layer:
    """One resolved layer: its block, and its own position (None: the model's)."""

    block: BlockSpec
    position: Any = None  # a PositionSpec


def resolve(block: BlockSpec, patterns: list[LayerPattern], n: int, stack: str | None = None) -> tuple[Layer, ...]:
    """The ``n`` layers of ``stack``: ``block`` with the patterns that select each merged over it.
    Layers with the same patterns share one validated spec. A pattern that does not validate raises
    a ValueError whose lines name ``layers.<i>`` and the field."""
    chosen: list[list[int]] = [[] for _ in range(n)]
    for j, p in enumerate(patterns):
        if p.stack is not None and stack is not None and p.stack != stack:
            continue
        try:
            indices = select_layers(p.at, n)
        except ValueError as e:
            raise ValueError(f"layers.{j}.at: {e}") from None
        for i in indices:
            chosen[i].append(j)
    made: dict[tuple[int, ...], Layer] = {(): Layer(block)}
    base = block.model_dump(mode="json")
    for key in {tuple(c) for c in chosen} - {()}:
        data, position = base, None
        for j in key:
            p = patterns[j]
            if p.block is not None:
                data = merge_parts(data, p.block)
            if p.position is not None:
                position = p.position
        made[key] = Layer(_validate_block(data, key[-1]) if data is not base else block, position)
    return tuple(made[tuple(c)] for c in chosen)


def _validate_block(data: dict, j: int) -> BlockSpec:
    try:
        cls = registry("block").spec(data.get("kind", "pre"))
        return cls.model_validate(data)
    except RegistryError as e:
        raise ValueError(f"layers.{j}.block.kind: {e}") from None
    except ValidationError as e:
        raise ValueError("\n".join(problem_lines(e, f"layers.{j}.block"))) from None


def layer_key(layer: Layer) -> str:
    """A key equal for equal layers (block and position)."""
    pos = None if layer.position is None else layer.position.model_dump(mode="json")
    return json.dumps([layer.block.model_dump(mode="json"), pos], sort_keys=True)
