"""Mistral: ``MistralForCausalLM`` <-> a zoo decoder laid out as LLaMA, with sliding-window attention
(``sliding_window``: each token sees itself and the window - 1 tokens before it) and no biases."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.hf.base import require
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec

__all__ = ["Mistral"]


class Mistral(Llama):
    name = "MistralForCausalLM"
    config_name = "MistralConfig"
    model_type = "mistral"
    variants: ClassVar[tuple[str, ...]] = ("window",)

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=False, window=c.sliding_window)

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        att = s.block.attention
        require(not s.embedding.scale, where, "embedding.scale", True, "Mistral does not scale its embeddings")
        require(not att.bias and not att.has_out_bias, where, "block.attention.bias", True, "Mistral's attention has no biases")
        require(not s.block.ffn.bias, where, "block.ffn.bias", True, "Mistral's MLP has no biases")
        c["sliding_window"] = att.window
