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

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import require
from zoo.interop.hf.gemma2 import FULL, SLIDING, Gemma2
from zoo.interop.hf.rope import rope_position, write_rope
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


class Gemma3(Gemma2):
    name = "Gemma3ForCausalLM"
    config_name = "Gemma3TextConfig"
    model_type = "gemma3_text"
    base = "Gemma3TextModel"
    own_positions: ClassVar[bool] = True
    claims: ClassVar[Claims] = {**{k: v for k, v in Gemma2.claims.items() if k != "block.attention.softcap"},
                                "block.attention.qk_norm": ANY}

    @classmethod
    def rope(cls, c: Any, where: str) -> dict:
        """The sliding layers' rope (the full layers' in a model without sliding layers)."""
        kind = SLIDING if SLIDING in c.layer_types else FULL
        return rope_positions(c, where).get(kind, {"kind": "rope", "base": 10000.0})

    @classmethod
    def attention_softcap(cls, c: Any, where: str) -> float | None:
        if c.attn_logit_softcapping is not None:
            raise unsupported(where, "attn_logit_softcapping", c.attn_logit_softcapping,
                              "Gemma3ForCausalLM keeps it in its config but never applies it; set it to None")
        return None

    @classmethod
    def full_position(cls, c: Any, where: str) -> dict | None:
        return rope_positions(c, where).get(FULL)

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        super().read(c, s, where)
        s["block"]["attention"]["qk_norm"] = {"kind": "rmsnorm", "scope": "head", "eps": c.rms_norm_eps, "unit_offset": True}

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        qk, norm = s.block.attention.qk_norm, s.block.norm
        require(qk is not None and (qk.kind, qk.scope, qk.unit_offset) == ("rmsnorm", "head", True), where,
                "block.attention.qk_norm", qk.model_dump() if qk is not None else None,
                "Gemma 3 applies a (1 + w) RMSNorm to each query and key head "
                "(qk_norm: {kind: rmsnorm, scope: head, unit_offset: true})")
        require(qk.eps == norm.eps, where, "block.attention.qk_norm.eps", qk.eps,
                f"Gemma 3 has one rms_norm_eps for every norm (block.norm.eps is {norm.eps})")
        super().write(s, c, where)

    @classmethod
    def write_rope(cls, s: FamilySpec, c: dict, positions: dict) -> None:
        c["rope_parameters"] = {kind: write_rope(positions.get(kind, s.position)) for kind in (SLIDING, FULL)}

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        return super().layer_rules(s, z, h) + [rule(f"{z}.attn.{n}.weight", f"{h}.self_attn.{n}.weight")
                                               for n in ("q_norm", "k_norm")]
