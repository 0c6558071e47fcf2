"""Gemma 3 (text): ``Gemma3ForCausalLM`` (config ``Gemma3TextConfig``) <-> a zoo decoder as Gemma 2
(:mod:`zoo.interop.hf.gemma2`) with Gemma 3's differences: a (1 + w) RMSNorm on each query and key
head (``block.attention.qk_norm: {kind: rmsnorm, scope: head, unit_offset: true}``, eps the
blocks'), five local layers per global one by default (``layer_types``), each type with its own
RoPE base (``rope_parameters``: ``rope_local_base_freq`` 10 000 on the sliding layers, ``rope_theta``
1 000 000 on the global ones), and no attention soft-capping (its config keeps
``attn_logit_softcapping``, but its attention never applies it)::

    block: {kind: sandwich, attention: {window: 512, qk_norm: {kind: rmsnorm, unit_offset: true}, ...}, ...}
    position: {kind: rope, base: 10000.0}
    layers: [{at: "5::6", block: {attention: {window: null}}, position: {kind: rope, base: 1000000.0}}]

Rope scaling (the linear factor 8 on the global layers of the 4B and larger models) does not
convert yet: zoo's rope has the default frequencies.
"""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import require
from zoo.interop.hf.gemma2 import FULL, SLIDING, Gemma2
from zoo.spec import FamilySpec

__all__ = ["Gemma3"]


def rope_bases(c: Any, where: str) -> dict[str, float]:
    """Each layer type's ``rope_theta`` from Gemma 3's ``rope_parameters`` ({layer type: rope});
    scaled rope is refused by name."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    for key in sorted(set(rope) - {FULL, SLIDING}):
        raise unsupported(where, f"rope_parameters.{key}", rope[key], f"Gemma 3 has a rope per layer type ({FULL}, {SLIDING})")
    bases = {}
    for kind, params in rope.items():
        params = dict(params or {"rope_type": "default"})
        if params.get("rope_type", "default") != "default":
            raise unsupported(where, f"rope_parameters.{kind}.rope_type", params["rope_type"],
                              "a rope scaling per layer type (Gemma 3's linear factor on its global layers, 4B and up) "
                              "does not convert yet")
        for key in sorted(set(params) - {"rope_type", "rope_theta"}):
            raise unsupported(where, f"rope_parameters.{kind}.{key}", params[key],
                              "zoo's rope rotates every dimension with the default frequencies")
        bases[kind] = params.get("rope_theta", 10000.0)
    return bases


class Gemma3(Gemma2):
    name = "Gemma3ForCausalLM"
    config_name = "Gemma3TextConfig"
    model_type = "gemma3_text"
    base = "Gemma3TextModel"
    own_positions: ClassVar[bool] = True
    claims: ClassVar[Claims] = {**{k: v for k, v in Gemma2.claims.items() if k not in ("block.attention.softcap", "position.scaling")},
                                "block.attention.qk_norm": ANY}

    @classmethod
    def rope(cls, c: Any, where: str) -> dict:
        bases = rope_bases(c, where)
        kind = SLIDING if SLIDING in c.layer_types else FULL
        return {"kind": "rope", "base": bases.get(kind, 10000.0)}

    @classmethod
    def attention_softcap(cls, c: Any, where: str) -> float | None:
        if c.attn_logit_softcapping is not None:
            raise unsupported(where, "attn_logit_softcapping", c.attn_logit_softcapping,
                              "Gemma3ForCausalLM keeps it in its config but never applies it; set it to None")
        return None

    @classmethod
    def full_base(cls, c: Any) -> float | None:
        return rope_bases(c, f"{cls.name} -> zoo").get(FULL)

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
    def write_rope(cls, s: FamilySpec, c: dict, bases: dict) -> None:
        base = s.position.base
        c["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": bases.get(kind, base)} for kind in (SLIDING, FULL)}

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        return super().layer_rules(s, z, h) + [rule(f"{z}.attn.{n}.weight", f"{h}.self_attn.{n}.weight")
                                               for n in ("q_norm", "k_norm")]
