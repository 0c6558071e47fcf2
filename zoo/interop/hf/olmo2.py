"""OLMo 2: ``Olmo2ForCausalLM`` <-> a zoo decoder laid out as LLaMA, with RMSNorm on the whole q and k
projections before the heads are split (``block.attention.qk_norm``, scope ``all``) and the norms on
each sub-layer's output, before the residual add (``block.norm.placement: post_sublayer``)."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import require
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec

__all__ = ["Olmo2"]


class Olmo2(Llama):
    name = "Olmo2ForCausalLM"
    config_name = "Olmo2Config"
    model_type = "olmo2"
    head_dim_field: ClassVar[bool] = False
    block_kind: ClassVar[str] = "post_sublayer"
    norm_names: ClassVar[tuple[str, str]] = ("post_attention_layernorm", "post_feedforward_layernorm")
    claims: ClassVar[Claims] = {**Llama.claims, "block.kind": one_of("post_sublayer"), "block.attention.qk_norm": ANY,
                                "block.attention.out_bias": ANY, "block.ffn.bias": one_of(False)}
    token_defaults: ClassVar[dict[str, int | None]] = {"eos_token_id": 50279, "pad_token_id": None}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=c.attention_bias, qk_norm={"kind": "rmsnorm", "scope": "all", "eps": c.rms_norm_eps})

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        att, norm = s.block.attention, s.block.norm
        qk = att.qk_norm
        require(qk is not None and (qk.kind, qk.scope, qk.unit_offset) == ("rmsnorm", "all", False), where,
                "block.attention.qk_norm", qk.model_dump() if qk is not None else None,
                "OLMo 2 applies RMSNorm (by weight, not 1 + weight) to the whole q and k projections "
                "(qk_norm: {kind: rmsnorm, scope: all})")
        require(qk.eps == norm.eps, where, "block.attention.qk_norm.eps", qk.eps,
                f"OLMo 2 has one rms_norm_eps for every norm (block.norm.eps is {norm.eps})")
        c["attention_bias"] = att.bias

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        return [rule(f"{z}.attn.{n}.weight", f"{h}.self_attn.{n}.weight") for n in ("q_norm", "k_norm")]
