"""Mistral: ``MistralForCausalLM`` <-> a zoo decoder laid out as LLaMA, with sliding-window attention
(``sliding_window``: each token sees itself and the window - 1 tokens before it) and no biases."""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import table
from zoo.interop.hf.traits import no_bias, sliding_window

__all__ = ["Mistral"]


class Mistral(Llama):
    name = "MistralForCausalLM"
    config_name = "MistralConfig"
    model_type = "mistral"
    base = "MistralModel"
    table = table(LLAMA, no_bias(), sliding_window())
