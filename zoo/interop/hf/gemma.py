"""Gemma: ``GemmaForCausalLM`` <-> a zoo decoder laid out as LLaMA, with Gemma's details: embeddings
times sqrt(d_model) rounded to the weights' dtype (``embedding.scale`` and ``round_scale``), RMSNorm
scaling by (1 + weight) (``unit_offset``), GeGLU with tanh GELU, and a head size of its own
(``head_dim``, 256 in the released models)."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import Claims, one_of
from zoo.interop.common import unsupported
from zoo.interop.hf.base import require
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec

__all__ = ["Gemma"]


class Gemma(Llama):
    name = "GemmaForCausalLM"
    config_name = "GemmaConfig"
    model_type = "gemma"
    base = "GemmaModel"
    # GemmaConfig reads hidden_act "gelu" as its tanh approximation, so exact GeGLU does not convert
    acts: ClassVar[dict[tuple[str, str], str]] = {("geglu", "tanh"): "gelu_pytorch_tanh", ("swiglu", "none"): "silu"}
    claims: ClassVar[Claims] = {**Llama.claims, "block.norm.unit_offset": one_of(True), "embedding.scale": one_of(True),
                                "embedding.round_scale": one_of(True),
                                "block.ffn.bias": one_of(False)}
    # GemmaConfig's token ids, but no pad_token_id: its embedding would then keep the pad row's gradient at zero
    token_defaults: ClassVar[dict[str, int | None]] = {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": None}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        if getattr(c, "use_bidirectional_attention", None):
            raise unsupported(where, "use_bidirectional_attention", True, "zoo decoders attend causally")
        s["embedding"].update(scale=True, round_scale=True)
        s["block"]["attention"]["bias"] = c.attention_bias
        s["block"]["norm"]["unit_offset"] = True

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        att, e = s.block.attention, s.embedding
        require(e.scale and e.round_scale, where, "embedding", e.model_dump(),
                "Gemma multiplies its embeddings by sqrt(d_model) rounded to their dtype (scale: true, round_scale: true)")
        require(s.block.norm.unit_offset, where, "block.norm.unit_offset", False, "Gemma's RMSNorm scales by (1 + weight)")
        c["attention_bias"] = att.bias
