"""Mixtral: ``MixtralForCausalLM`` <-> a zoo decoder laid out as Mistral (RoPE, RMSNorm, GQA, no biases,
``sliding_window`` on every layer or none) whose every FFN is a mixture of ``num_local_experts``
SwiGLU experts, ``num_experts_per_tok`` per token, the top-k probabilities always renormalised
(``router.norm_topk_prob: true``), with ``router_jitter_noise`` as ``router.jitter`` and no shared
expert (:class:`~zoo.interop.hf.moe.MoEDecoder`). Checkpoints name each expert's matrices
``block_sparse_moe.experts.{e}.w1`` (gate), ``w3`` (up) and ``w2`` (down), and the router
``block_sparse_moe.gate``."""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA
from zoo.interop.hf.moe import MoEDecoder, MoEFields, moe_ffn
from zoo.interop.hf.table import Derived, table
from zoo.interop.hf.traits import heads, no_bias, sliding_window
from zoo.spec import FamilySpec

__all__ = ["Mixtral"]

_HEADS = heads()


def _write_heads(s: FamilySpec, where: str) -> dict:
    c = dict(_HEADS.write(s, where))
    if c["head_dim"] * c["num_attention_heads"] == s.d_model and s.position.scaling is None:
        c["head_dim"] = None  # as the released configs (null: hidden_size / heads); HF's rope scalings need it set
    return c


class Mixtral(MoEDecoder):
    name = "MixtralForCausalLM"
    config_name = "MixtralConfig"
    model_type = "mixtral"
    base = "MixtralModel"
    moe = MoEFields(n_experts="num_local_experts", router={"jitter": "router_jitter_noise"},
                    fixed_router={"norm_topk_prob": True}, on_disk=("block_sparse_moe", ("w1", "w3", "w2")))
    table = table(LLAMA, Derived("heads", _HEADS.read, _write_heads, _HEADS.claims), no_bias(), sliding_window(), moe_ffn(moe))
