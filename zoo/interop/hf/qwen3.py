"""Qwen3: ``Qwen3ForCausalLM`` <-> a zoo decoder laid out as LLaMA, with RMSNorm on each query and key
head before RoPE (``block.attention.qk_norm: {kind: rmsnorm, scope: head}``, weights [head_dim]
shared by the heads, with the blocks' eps), a head size of its own (``head_dim``), one
``attention_bias`` for the four projections, and Qwen2's sliding windows on every layer, none, or
some (``layer_types``, ``max_window_layers``: :func:`~zoo.interop.hf.qwen2.read_windows`)."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule
from zoo.interop.hf.llama import Llama, qk_norm_rules, rms_qk_norm
from zoo.interop.hf.qwen2 import read_windows, write_windows
from zoo.spec import FamilySpec

__all__ = ["Qwen3"]


class Qwen3(Llama):
    name = "Qwen3ForCausalLM"
    config_name = "Qwen3Config"
    model_type = "qwen3"
    base = "Qwen3Model"
    claims: ClassVar[Claims] = {**Llama.claims, "block.attention.qk_norm": ANY, "block.attention.window": ANY,
                                "block.ffn.bias": one_of(False), "layers": ANY}
    token_defaults: ClassVar[dict[str, int | None]] = {}  # Qwen3Config's are None

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=c.attention_bias, qk_norm={"kind": "rmsnorm", "scope": "head", "eps": c.rms_norm_eps})
        read_windows(c, s, where)

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        rms_qk_norm(s, where, scope="head", who="Qwen3", what="each query and key head")
        c["attention_bias"] = s.block.attention.bias
        write_windows(s, c, where, "Qwen3")

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        return qk_norm_rules(z, h)
