"""Nemotron: ``NemotronForCausalLM`` <-> a zoo decoder laid out as LLaMA (``model.layers.{i}.self_attn.
{q,k,v,o}_proj``) with Nemotron's differences, each a table entry (:mod:`zoo.interop.hf.table`): LayerNorm
with biases scaling by (1 + weight), the weight stored minus one (``layernorm1p``: ``block.norm: {kind:
layernorm, unit_offset: true}``, eps ``norm_eps``), a two-layer MLP ``down_proj(act(up_proj(x)))`` with
squared ReLU (``hidden_act: relu2``: ``block.ffn.kind: relu2``; any other ungated activation zoo has) and
biases by ``mlp_bias``, partial rotary (``partial_rotary_factor``: ``position.fraction``), one bias setting
``attention_bias`` for the attention's projections, and a head size of its own (``head_dim``).
"""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule
from zoo.interop.hf.base import TWO_LAYER, act_name, ffn_of, weights
from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Derived, Field, Fixed, Tokens, table
from zoo.interop.hf.traits import rope
from zoo.spec import FamilySpec

__all__ = ["Nemotron"]

ACTS = {("relu2", "none"): "relu2", ("relu", "none"): "relu", ("gelu", "none"): "gelu",
        ("gelu", "tanh"): "gelu_pytorch_tanh", ("silu", "none"): "silu"}
_READ = {**TWO_LAYER, "relu2": {"kind": "relu2"}}


def _read_ffn(c: Any, where: str) -> dict:
    return {"block.ffn": {**ffn_of(_READ, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size}}


def _write_ffn(s: FamilySpec, where: str) -> dict:
    return {"intermediate_size": s.block.ffn.hidden_size(s.d_model), "hidden_act": act_name(s.block.ffn, ACTS, where)}


class Nemotron(Llama):
    name = "NemotronForCausalLM"
    config_name = "NemotronConfig"
    model_type = "nemotron"
    base = "NemotronModel"
    table = table(
        LLAMA, rope(partial=True),
        Derived("ffn", _read_ffn, _write_ffn, {"block.ffn.kind": one_of("relu2", "relu", "gelu", "silu"),
                                               "block.ffn.hidden": ANY, "block.ffn.approximate": ANY}),
        Field("mlp_bias", "block.ffn.bias"),
        Fixed("block.norm.kind", "layernorm", why="LayerNorm scaling by (1 + weight) (layernorm, unit_offset: true)"),
        Field("norm_eps", "block.norm.eps"),
        Fixed("block.norm.bias", True, why="LayerNorm with biases (bias: true)"),
        Fixed("block.norm.unit_offset", True, why="LayerNorm scaling by (1 + weight) (unit_offset: true)"),
        Tokens({"bos_token_id": 2, "eos_token_id": 3, "pad_token_id": None}),
    )

    @classmethod
    def ffn_rules(cls, ffn, z: str, h: str) -> list[Rule]:
        """``up_proj`` and ``down_proj``: the two-layer MLP, without a gate."""
        return [*weights(f"{z}.ffn.fc1", f"{h}.mlp.up_proj", bias=ffn.bias),
                *weights(f"{z}.ffn.fc2", f"{h}.mlp.down_proj", bias=ffn.bias)]
