"""StableLM: ``StableLmForCausalLM`` <-> a zoo decoder laid out as LLaMA (``model.layers.{i}.self_attn.
{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``) with StableLM's differences, each a table entry
(:mod:`zoo.interop.hf.table`): LayerNorm with biases (``layer_norm_eps``), partial rotary
(``partial_rotary_factor``: ``position.fraction``), biases on the q, k and v projections by
``use_qkv_bias`` and none on the output or the MLP, the head size hidden_size / heads, and with
``use_parallel_residual`` one norm feeding attention and MLP side by side (``block.kind:
parallel``, ``shared_norm: true``; ``post_attention_layernorm`` is then absent).

What zoo does not compute is refused by name: ``qk_layernorm`` (a LayerNorm per head, each head
with weights of its own, where zoo's qk-norm shares one across the heads) and ``hidden_dropout``
(dropout on the MLP's output alone, where zoo's ``dropout.residual`` drops both sub-layers').
"""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import one_of
from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Derived, Drop, Fixed, Refuse, Tokens, table
from zoo.interop.hf.traits import heads, layernorm, qkv_bias, rope
from zoo.spec import FamilySpec

__all__ = ["StableLm"]


def _block(c: Any, where: str) -> dict:
    return {"block.kind": "parallel", "block.shared_norm": True} if c.use_parallel_residual else {"block.kind": "pre"}


def _write_block(s: FamilySpec, where: str) -> dict:
    return {"use_parallel_residual": s.block.kind == "parallel"}


class StableLm(Llama):
    name = "StableLmForCausalLM"
    config_name = "StableLmConfig"
    model_type = "stablelm"
    base = "StableLmModel"
    table = table(
        LLAMA, rope(partial=True), heads(head_dim_field=False),
        layernorm(),
        qkv_bias("use_qkv_bias"), Fixed("block.ffn.bias", False),
        Drop("block.kind"), Derived("block", _block, _write_block, {"block.kind": one_of("pre", "parallel"),
                                                                    "block.shared_norm": one_of(True)}),
        Refuse("qk_layernorm", False, "StableLM's qk_layernorm is a LayerNorm per head with weights of its own for each "
               "head; zoo's qk_norm shares one across the heads"),
        Refuse("hidden_dropout", 0.0, "StableLM drops the MLP's output alone; zoo's dropout.residual drops both "
               "sub-layers' outputs"),
        Tokens({"bos_token_id": 0, "eos_token_id": 0}),
    )
