"""Mistral: ``MistralForCausalLM`` <-> a zoo decoder laid out as LLaMA, with sliding-window attention
(``sliding_window``: each token sees itself and the window - 1 tokens before it) and no biases."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec

__all__ = ["Mistral"]


class Mistral(Llama):
    name = "MistralForCausalLM"
    config_name = "MistralConfig"
    model_type = "mistral"
    base = "MistralModel"
    claims: ClassVar[Claims] = {**Llama.claims, "block.attention.window": ANY, "block.attention.bias": one_of(False),
                                "block.attention.out_bias": one_of(None, False),
                                "block.ffn.bias": one_of(False)}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=False, window=c.sliding_window)

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        c["sliding_window"] = s.block.attention.window
