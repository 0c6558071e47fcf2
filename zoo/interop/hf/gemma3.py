"""Gemma 3 (text): ``Gemma3ForCausalLM`` (config ``Gemma3TextConfig``) <-> a zoo decoder as Gemma 2
(:mod:`zoo.interop.hf.gemma2`) with Gemma 3's differences: a (1 + w) RMSNorm on each query and key
head (``block.attention.qk_norm: {kind: rmsnorm, scope: head, unit_offset: true}``, eps the
blocks'), five local layers per global one by default (``layer_types``), each type with a rope of
its own (``rope_parameters``: {layer type: rope}, base and any scaling zoo expresses, as
:mod:`zoo.interop.hf.rope` reads them; 10 000 on the sliding layers, 1 000 000 and from the 4B model
up a linear factor 8 on the global ones), and no attention soft-capping (its config keeps
``attn_logit_softcapping``, but its attention never applies it). The sliding layers' rope is the
model's ``position``, the global layers' their pattern's where it differs::

    block: {kind: sandwich, attention: {window: 1024, qk_norm: {kind: rmsnorm, unit_offset: true}, ...}, ...}
    position: {kind: rope, base: 10000.0}
    layers: [{at: "5::6", block: {attention: {window: null}},
              position: {kind: rope, base: 1000000.0, scaling: {kind: linear, factor: 8.0}}}]
"""

from __future__ import annotations

from typing import Any

from zoo.interop.common import unsupported
from zoo.interop.hf.gemma2 import GEMMA2, Gemma2, layer_types, write_layer_types
from zoo.interop.hf.rope import rope_position, write_rope
from zoo.interop.hf.table import Derived, Drop, Refuse, table
from zoo.interop.hf.traits import FULL, SLIDING, qk_norm, rope, who
from zoo.spec import FamilySpec

__all__ = ["Gemma3"]


def rope_positions(c: Any, where: str) -> dict[str, dict]:
    """Each layer type's zoo rope position from Gemma 3's ``rope_parameters`` ({layer type: rope}):
    its ``rope_theta`` and any scaling zoo expresses; another layer type, rope type or key is
    refused by name."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    for key in sorted(set(rope) - {FULL, SLIDING}):
        raise unsupported(where, f"rope_parameters.{key}", rope[key], f"Gemma 3 has a rope per layer type ({FULL}, {SLIDING})")
    return {kind: rope_position(params, where, field=f"rope_parameters.{kind}") for kind, params in rope.items()}


def _position(c: Any, where: str) -> dict:
    """The sliding layers' rope (the full layers' in a model without sliding layers)."""
    kind = SLIDING if SLIDING in c.layer_types else FULL
    return rope_positions(c, where).get(kind, {"kind": "rope", "base": 10000.0})


def _full_position(c: Any, where: str) -> dict | None:
    return rope_positions(c, where).get(FULL)


def _write_ropes(s: FamilySpec, where: str) -> dict:
    """Each layer type's rope from its position."""
    _, _, positions = write_layer_types(s, where, who(where), own_positions=True)
    return {"rope_parameters": {kind: write_rope(positions.get(kind, s.position)) for kind in (SLIDING, FULL)}}


class Gemma3(Gemma2):
    name = "Gemma3ForCausalLM"
    config_name = "Gemma3TextConfig"
    model_type = "gemma3_text"
    base = "Gemma3TextModel"
    table = table(
        GEMMA2,
        Derived("rope", lambda c, where: {"position": _position(c, where)}, _write_ropes, rope().claims),
        Drop("block.attention.softcap"),
        Refuse("attn_logit_softcapping", None, "Gemma3ForCausalLM keeps it in its config but never applies it; set it to None"),
        layer_types(own_positions=True, full_position=_full_position, position=_position),
        qk_norm("head", "Gemma 3", "each query and key head", unit_offset=True),
    )
