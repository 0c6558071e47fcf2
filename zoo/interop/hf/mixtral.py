"""Mixtral: ``MixtralForCausalLM`` <-> a zoo decoder laid out as Mistral (RoPE, RMSNorm, GQA, no biases,
``sliding_window`` on every layer or none) whose every FFN is a mixture of ``num_local_experts``
SwiGLU experts, ``num_experts_per_tok`` per token, the top-k probabilities always renormalised
(``router.norm_topk_prob: true``), with ``router_jitter_noise`` as ``router.jitter`` and no shared
expert (:class:`~zoo.interop.hf.moe.MoEDecoder`). Checkpoints name each expert's matrices
``block_sparse_moe.experts.{e}.w1`` (gate), ``w3`` (up) and ``w2`` (down), and the router
``block_sparse_moe.gate``."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.hf.base import MOE_CLAIMS
from zoo.interop.hf.llama import Llama
from zoo.interop.hf.moe import MoEDecoder
from zoo.spec import FamilySpec

__all__ = ["Mixtral"]


class Mixtral(MoEDecoder):
    name = "MixtralForCausalLM"
    config_name = "MixtralConfig"
    model_type = "mixtral"
    base = "MixtralModel"
    n_experts_field: ClassVar[str] = "num_local_experts"
    router_fields: ClassVar[dict[str, str]] = {"jitter": "router_jitter_noise"}
    on_disk: ClassVar[tuple[str, tuple[str, str, str]]] = ("block_sparse_moe", ("w1", "w3", "w2"))
    claims: ClassVar[Claims] = {**Llama.claims, **MOE_CLAIMS, "block.ffn.router.norm_topk_prob": one_of(True),
                                "block.ffn.router.jitter": ANY, "block.attention.window": ANY,
                                "block.attention.bias": one_of(False), "block.attention.out_bias": one_of(None, False)}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=False, window=c.sliding_window)
        s["block"]["ffn"]["router"]["norm_topk_prob"] = True

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        c["sliding_window"] = s.block.attention.window
        if c["head_dim"] * c["num_attention_heads"] == c["hidden_size"] and s.position.scaling is None:
            c["head_dim"] = None  # as the released configs (null: hidden_size / heads); HF's rope scalings need it set
