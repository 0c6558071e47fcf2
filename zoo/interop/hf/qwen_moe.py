"""Qwen's mixture-of-experts decoders (:class:`~zoo.interop.hf.moe.MoEDecoder`), each with dense
layers where ``decoder_sparse_step`` and ``mlp_only_layers`` say (a layer pattern in zoo):

``Qwen2MoeForCausalLM`` (Qwen1.5-MoE, Qwen2-57B-A14B) <-> Qwen2's attention (biases on q, k and v by
``qkv_bias``, none on the output, the head size d_model / n_heads, sliding windows per layer by
``layer_types``: :func:`~zoo.interop.hf.qwen2.read_windows`) and MoE blocks of ``num_experts``
experts ``moe_intermediate_size`` wide plus a shared expert (``shared_expert_intermediate_size``)
scaled by the sigmoid of its gate.

``Qwen3MoeForCausalLM`` (Qwen3-30B-A3B, Qwen3-235B-A22B) <-> Qwen3's attention (an RMSNorm on each
query and key head, its own ``head_dim``, one ``attention_bias``), ``sliding_window`` on every layer
or none (``use_sliding_window``), and MoE blocks without a shared expert."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule
from zoo.interop.hf.base import MOE_CLAIMS, same_layers
from zoo.interop.hf.llama import Llama, qk_norm_rules, rms_qk_norm
from zoo.interop.hf.moe import MoEDecoder
from zoo.interop.hf.qwen2 import read_windows, write_windows
from zoo.spec import FamilySpec

__all__ = ["Qwen2Moe", "Qwen3Moe"]

# the model's block may be dense with MoE layers in a pattern, or the other way round
_QWEN_MOE_CLAIMS: Claims = {**Llama.claims, **MOE_CLAIMS, "block.ffn.kind": one_of("moe", "swiglu", "geglu"),
                            "block.ffn.bias": one_of(False), "block.ffn.router.norm_topk_prob": ANY, "layers": ANY}


class Qwen2Moe(MoEDecoder):
    name = "Qwen2MoeForCausalLM"
    config_name = "Qwen2MoeConfig"
    model_type = "qwen2_moe"
    base = "Qwen2MoeModel"
    head_dim_field: ClassVar[bool] = False
    one_bias: ClassVar[bool] = False
    expert_field: ClassVar[str] = "moe_intermediate_size"
    shared: ClassVar[bool] = True
    dense_layers: ClassVar[bool] = True
    claims: ClassVar[Claims] = {**_QWEN_MOE_CLAIMS, "block.ffn.shared_hidden": ANY, "block.ffn.shared_gate": one_of(True),
                                "block.attention.window": ANY, "block.attention.out_bias": one_of(False)}
    token_defaults: ClassVar[dict[str, int | None]] = {}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=c.qkv_bias, out_bias=False)
        read_windows(c, s, where)

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        c["qkv_bias"] = s.block.attention.bias
        write_windows(s, c, where, "Qwen2-MoE", parts=("ffn",))


class Qwen3Moe(MoEDecoder):
    name = "Qwen3MoeForCausalLM"
    config_name = "Qwen3MoeConfig"
    model_type = "qwen3_moe"
    base = "Qwen3MoeModel"
    expert_field: ClassVar[str] = "moe_intermediate_size"
    dense_layers: ClassVar[bool] = True
    claims: ClassVar[Claims] = {**_QWEN_MOE_CLAIMS, "block.attention.qk_norm": ANY, "block.attention.window": ANY}
    token_defaults: ClassVar[dict[str, int | None]] = {}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        window = c.sliding_window if c.use_sliding_window else None
        s["block"]["attention"].update(bias=c.attention_bias, window=window,
                                       qk_norm={"kind": "rmsnorm", "scope": "head", "eps": c.rms_norm_eps})

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        rms_qk_norm(s, where, scope="head", who="Qwen3-MoE", what="each query and key head")
        same_layers(s, where, parts=("ffn",))  # one window for every layer
        window = s.block.attention.window
        c.update(attention_bias=s.block.attention.bias, use_sliding_window=window is not None, sliding_window=window)

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        return qk_norm_rules(z, h)
