"""Gemma: ``GemmaForCausalLM`` <-> a zoo decoder laid out as LLaMA, with Gemma's details: embeddings
times sqrt(d_model) rounded to the weights' dtype (``embedding.scale`` and ``round_scale``), RMSNorm
scaling by (1 + weight) (``unit_offset``), GeGLU with tanh GELU, and a head size of its own
(``head_dim``, 256 in the released models)."""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Fixed, Refuse, Tokens, table
from zoo.interop.hf.traits import gated_ffn

__all__ = ["GEMMA", "Gemma"]

GEMMA = table(
    LLAMA,
    # GemmaConfig reads hidden_act "gelu" as its tanh approximation, so exact GeGLU does not convert
    gated_ffn({("geglu", "tanh"): "gelu_pytorch_tanh", ("swiglu", "none"): "silu"}),
    Fixed("embedding.scale", True, why="embeddings times sqrt(d_model) rounded to their dtype (scale and round_scale: true)"),
    Fixed("embedding.round_scale", True, why="embeddings times sqrt(d_model) rounded to their dtype (scale and round_scale: true)"),
    Fixed("block.norm.unit_offset", True, why="RMSNorm scaling by (1 + weight)"),
    Fixed("block.ffn.bias", False),
    Refuse("use_bidirectional_attention", False, "zoo decoders attend causally", write=False, falsy=True),
    # GemmaConfig's token ids, but no pad_token_id: its embedding would then keep the pad row's gradient at zero
    Tokens({"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": None}),
)


class Gemma(Llama):
    name = "GemmaForCausalLM"
    config_name = "GemmaConfig"
    model_type = "gemma"
    base = "GemmaModel"
    table = GEMMA
