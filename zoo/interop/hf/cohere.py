"""Cohere (Command-R): ``CohereForCausalLM`` <-> a zoo decoder laid out as LLaMA with Cohere's
differences, each a table entry (:mod:`zoo.interop.hf.table`): attention and MLP side by side from
one shared norm (``block.kind: parallel``, ``shared_norm: true``; no ``post_attention_layernorm``),
LayerNorm without a bias (``layer_norm_eps``), RoPE in the interleaved layout, pairs (2i, 2i + 1)
(``position.pairs: interleaved``), the logits multiplied by ``logit_scale`` (``head.scale``), no
MLP bias, the head size hidden_size / heads::

    block: {kind: parallel, shared_norm: true, norm: {kind: layernorm, bias: false}, ...}
    position: {kind: rope, base: 8.0e6, pairs: interleaved}
    head: {kind: lm, scale: 0.0625}

What zoo does not compute is refused by name: ``use_qk_norm`` (a LayerNorm per head, each head with
weights of its own, where zoo's qk-norm shares one across the heads).
"""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Field, Fixed, Refuse, Tokens, table
from zoo.interop.hf.traits import heads, layernorm

__all__ = ["Cohere"]

COHERE = table(
    LLAMA, heads(head_dim_field=False),
    layernorm(), Fixed("block.norm.bias", False, why="LayerNorm without a bias (bias: false)"),
    Fixed("block.kind", "parallel", why="attention and MLP side by side from one norm (parallel, shared_norm: true)"),
    Fixed("block.shared_norm", True, why="attention and MLP side by side from one norm (parallel, shared_norm: true)"),
    Fixed("block.ffn.bias", False),
    Fixed("position.pairs", "interleaved", why="rope turning the interleaved pairs (2i, 2i + 1) (pairs: interleaved)"),
    Field("logit_scale", "head.scale", read=lambda v: None if v in (None, 1) else float(v),
          write=lambda v: 1.0 if v is None else v, default=None),
    Refuse("use_qk_norm", False, "Cohere's use_qk_norm is a LayerNorm per head with weights of its own for each head; "
           "zoo's qk_norm shares one across the heads", falsy=True),
    Tokens({"bos_token_id": 5, "eos_token_id": 255001, "pad_token_id": 0}),
)


class Cohere(Llama):
    name = "CohereForCausalLM"
    config_name = "CohereConfig"
    model_type = "cohere"
    base = "CohereModel"
    table = COHERE
