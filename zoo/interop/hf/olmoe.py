"""OLMoE: ``OlmoeForCausalLM`` <-> a zoo decoder laid out as LLaMA with an RMSNorm on the whole q and k
projections before the heads are split (``block.attention.qk_norm: {kind: rmsnorm, scope: all}``, as
OLMo 2: ``q_norm`` [H*K], ``k_norm`` [G*K], the blocks' eps), one ``attention_bias`` for the four
projections, the head size d_model / n_heads, pre-norm blocks, and every FFN a mixture of
``num_experts`` experts ``intermediate_size`` wide, ``num_experts_per_tok`` per token, with
``norm_topk_prob`` (:class:`~zoo.interop.hf.moe.MoEDecoder`). ``clip_qkv`` (clamping q, k and v)
zoo does not have: a config that sets it is refused."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims
from zoo.interop.common import Rule
from zoo.interop.hf.base import MOE_CLAIMS, refuse_config
from zoo.interop.hf.llama import Llama, qk_norm_rules, rms_qk_norm
from zoo.interop.hf.moe import MoEDecoder
from zoo.spec import FamilySpec

__all__ = ["Olmoe"]


class Olmoe(MoEDecoder):
    name = "OlmoeForCausalLM"
    config_name = "OlmoeConfig"
    model_type = "olmoe"
    base = "OlmoeModel"
    head_dim_field: ClassVar[bool] = False
    claims: ClassVar[Claims] = {**Llama.claims, **MOE_CLAIMS, "block.ffn.router.norm_topk_prob": ANY,
                                "block.attention.qk_norm": ANY}
    token_defaults: ClassVar[dict[str, int | None]] = {"eos_token_id": 50279, "pad_token_id": 1}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        refuse_config(c, where, {"clip_qkv": (None, "zoo does not clamp the queries, keys and values")})
        s["block"]["attention"].update(bias=c.attention_bias, qk_norm={"kind": "rmsnorm", "scope": "all", "eps": c.rms_norm_eps})

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        rms_qk_norm(s, where, scope="all", who="OLMoE", what="the whole q and k projections")
        c.update(attention_bias=s.block.attention.bias, clip_qkv=None)

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        return qk_norm_rules(z, h)
