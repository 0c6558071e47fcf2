"""Granite: ``GraniteForCausalLM`` <-> a zoo decoder laid out as LLaMA with Granite's four
multipliers (muP-style), each a spec field any decoder may use:

    embedding_multiplier   the token embeddings times it          embedding.multiplier
    attention_multiplier   the scores times it (not 1/sqrt(K))    block.attention.scale
    residual_multiplier    each sub-layer's output times it       block.residual_scale
    logits_scaling         the logits divided by it               head.divisor

A multiplier of 1 reads as the field's null; the attention's reads as null where it is 1/sqrt(K)
itself. The head size is hidden_size / heads (Granite's config has no ``head_dim``).
"""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY
from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Derived, Field, table
from zoo.interop.hf.traits import heads
from zoo.spec import FamilySpec

__all__ = ["Granite", "multiplier"]


def multiplier(config: str, path: str) -> Field:
    """``config``, a multiplier whose 1 means none <-> the spec path ``path`` (null: none)."""
    return Field(config, path, read=lambda v: None if v == 1 else float(v), write=lambda v: 1.0 if v is None else v,
                 default=1.0)


def _read_scale(c: Any, where: str) -> dict:
    head_dim = c.hidden_size // c.num_attention_heads
    scale = float(c.attention_multiplier)
    return {"block.attention.scale": None if scale == head_dim ** -0.5 else scale}


def _write_scale(s: FamilySpec, where: str) -> dict:
    att = s.block.attention
    return {"attention_multiplier": att.scale if att.scale is not None else att.qk_size(s.d_model) ** -0.5}


GRANITE = table(
    LLAMA, heads(head_dim_field=False),
    multiplier("embedding_multiplier", "embedding.multiplier"),
    Derived("scale", _read_scale, _write_scale, {"block.attention.scale": ANY}),
    multiplier("residual_multiplier", "block.residual_scale"),
    multiplier("logits_scaling", "head.divisor"),
)


class Granite(Llama):
    name = "GraniteForCausalLM"
    config_name = "GraniteConfig"
    model_type = "granite"
    base = "GraniteModel"
    table = GRANITE
