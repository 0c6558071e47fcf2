"""Qwen2: ``Qwen2ForCausalLM`` <-> a zoo decoder laid out as LLaMA, with biases on the q, k and v
projections but none on the output projection (``bias: true, out_bias: false``), optionally with
sliding-window attention on every layer."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.common import unsupported
from zoo.interop.hf.base import require
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec

__all__ = ["Qwen2"]


class Qwen2(Llama):
    name = "Qwen2ForCausalLM"
    config_name = "Qwen2Config"
    model_type = "qwen2"
    head_dim_field: ClassVar[bool] = False
    variants: ClassVar[tuple[str, ...]] = ("window", "out_bias")
    token_defaults: ClassVar[dict[str, int | None]] = {}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        types = set(c.layer_types)
        if types == {"full_attention"}:
            window = None
        elif types == {"sliding_attention"} and c.sliding_window is not None:
            window = c.sliding_window
        else:
            raise unsupported(where, "layer_types", c.layer_types,
                              "zoo's sliding window applies to every layer or none (set max_window_layers to 0 "
                              "or num_hidden_layers, or use_sliding_window false)")
        s["block"]["attention"].update(bias=True, out_bias=False, window=window)

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        att = s.block.attention
        require(not s.embedding.scale, where, "embedding.scale", True, "Qwen2 does not scale its embeddings")
        require(att.bias, where, "block.attention.bias", False, "Qwen2 has biases on its q, k and v projections")
        require(not att.has_out_bias, where, "block.attention.out_bias", att.out_bias,
                "Qwen2's output projection has no bias (set block.attention.out_bias: false)")
        require(not s.block.ffn.bias, where, "block.ffn.bias", True, "Qwen2's MLP has no biases")
        c.update(use_sliding_window=att.window is not None, sliding_window=att.window)
        if att.window is not None:
            c["max_window_layers"] = 0  # every layer slides
