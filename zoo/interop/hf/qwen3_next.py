"""Qwen3-Next: ``Qwen3NextForCausalLM`` <-> a zoo decoder whose layers mix Qwen3-Next's gated
attention with gated DeltaNet linear attention (``layer_types``; by default every
``full_attention_interval``-th layer is full attention), over MoE blocks with a gated shared expert
(Qwen2-MoE's, :class:`~zoo.interop.hf.moe.MoEDecoder`)::

    block: {attention: {kind: gqa, gate: true, qk_norm: {kind: rmsnorm, unit_offset: true}, ...},
            norm: {kind: rmsnorm, unit_offset: true}, ffn: {kind: moe, shared_hidden: 512, ...}}
    position: {kind: rope, fraction: 0.25, base: 1.0e7}
    layers: [{at: "0::4", block: {attention: {kind: gated_deltanet, n_heads: 32, key_heads: 16, ...}},
              position: {kind: none}}, ...]               # and "1::4", "2::4"; the mixer reads no positions

Full attention: ``q_proj`` holds each head's query rows then its gate's (zoo's ``attn.qkv`` is
[q_proj | k_proj | v_proj] as it stands, ``attention.gate``), an RMSNorm by (1 + weight) on each
query and key head, partial rotary (``partial_rotary_factor``). Linear attention
(``linear_attn``, :class:`zoo.components.deltanet.GatedDeltaNet`): ``in_proj_qkvz`` ->
``attn.qkvz``, ``in_proj_ba`` -> ``attn.ba``, ``conv1d`` -> ``attn.conv``, ``A_log``, ``dt_bias``,
``norm`` and ``out_proj`` -> ``attn.out``; its heads and sizes are ``linear_num_value_heads``
(n_heads), ``linear_num_key_heads`` (key_heads), ``linear_key_head_dim`` (head_dim),
``linear_value_head_dim`` (v_head_dim), ``linear_conv_kernel_dim`` (conv_kernel), its norm's eps
``rms_norm_eps`` and its convolution's activation ``hidden_act`` (silu). Every norm scales by
(1 + weight). Checkpoints' multi-token prediction weights (``mtp.*``) HF drops on loading; zoo refuses
them by name unless the caller passes ``skip_mtp`` (:meth:`Qwen3Next.mtp_names`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import fused, require, weights
from zoo.interop.hf.llama import LLAMA
from zoo.interop.hf.moe import MoEDecoder, MoEFields, at_of, moe_ffn
from zoo.interop.hf.table import Derived, Fixed, Tokens, table
from zoo.interop.hf.traits import qk_norm, rope
from zoo.spec import FamilySpec, GatedDeltaNetSpec

__all__ = ["Qwen3Next"]

FULL, LINEAR = "full_attention", "linear_attention"


def _read_linear(c: Any, where: str) -> dict:
    n = c.num_hidden_layers
    types = list(c.layer_types)[:n]
    unknown = sorted(set(types) - {FULL, LINEAR})
    require(not unknown and len(types) == n, where, "layer_types", unknown[0] if unknown else types,
            f"Qwen3-Next's layers are {FULL} or {LINEAR}, one per layer ({n})")
    linear = [i for i, t in enumerate(types) if t == LINEAR]
    if not linear:
        return {}
    require(c.hidden_act == "silu", where, "hidden_act", c.hidden_act,
            "the linear attention's convolution is zoo's with SiLU (hidden_act silu)")
    require(c.linear_num_value_heads % c.linear_num_key_heads == 0, where, "linear_num_key_heads",
            c.linear_num_key_heads, f"each key head serves a whole number of the {c.linear_num_value_heads} value heads")
    attention = {"kind": "gated_deltanet", "n_heads": c.linear_num_value_heads, "key_heads": c.linear_num_key_heads,
                 "head_dim": c.linear_key_head_dim, "v_head_dim": c.linear_value_head_dim,
                 "conv_kernel": c.linear_conv_kernel_dim, "norm_eps": c.rms_norm_eps,
                 # what the model's gated attention has and the mixer has not
                 "n_kv_heads": None, "qk_norm": None, "gate": False, "bias": False}
    return {"layers": [{"at": at, "block": {"attention": attention}, "position": {"kind": "none"}} for at in _linear_at(types)]}


def _linear_at(types: list[str]) -> list:
    """The ``at`` of the linear-attention layers: with a full-attention layer every k-th (HF's
    ``full_attention_interval``), one slice "r::k" per other residue, so a model of any depth reads
    alike; else one list."""
    n, full = len(types), [i for i, t in enumerate(types) if t == FULL]
    linear = [i for i, t in enumerate(types) if t == LINEAR]
    k = full[0] + 1 if full else 0
    if k > 1 and full == list(range(k - 1, n, k)):
        return [f"{r}::{k}" for r in range(k - 1)]
    return [at_of(linear, n)]


def _write_linear(s: FamilySpec, where: str) -> dict:
    types, mixers = [], set()
    for i, layer in enumerate(s.stack_layers()):
        att = layer.block.attention
        if isinstance(att, GatedDeltaNetSpec):
            mixers.add(att)
            types.append(LINEAR)
            continue
        require(att == s.block.attention, where, "layers", f"layer {i}'s attention",
                "Qwen3-Next's full-attention layers share one setting (the block's)")
        require(layer.position is None or layer.position == s.position, where, "layers", f"layer {i}'s position",
                "Qwen3-Next's full-attention layers share the model's rope")
        types.append(FULL)
    c: dict = {"layer_types": types}
    if mixers:
        require(len(mixers) == 1, where, "layers", "linear attention settings",
                "Qwen3-Next's linear-attention layers share one setting")
        m = mixers.pop()
        require(m.norm_eps == s.block.norm.eps, where, "attention.norm_eps", m.norm_eps,
                f"Qwen3-Next has one rms_norm_eps for every norm (block.norm.eps is {s.block.norm.eps})")
        d = s.d_model
        c.update(linear_num_value_heads=m.n_heads, linear_num_key_heads=m.key_heads, linear_key_head_dim=m.qk_size(d),
                 linear_value_head_dim=m.v_size(d), linear_conv_kernel_dim=m.conv_kernel)
    return c


def _gate(c: Any, where: str) -> dict:
    return {"block.attention.gate": True}


def _write_gate(s: FamilySpec, where: str) -> dict:
    att = s.block.attention
    require(att.gate, where, "block.attention.gate", att.gate, "Qwen3-Next's full attention gates its output (gate: true)")
    require(att.v_size(s.d_model) == att.qk_size(s.d_model), where, "block.attention.v_head_dim", att.v_head_dim,
            "Qwen3-Next's heads have one head_dim for queries, keys and values")
    return {}


class Qwen3Next(MoEDecoder):
    name = "Qwen3NextForCausalLM"
    config_name = "Qwen3NextConfig"
    model_type = "qwen3_next"
    base = "Qwen3NextModel"
    moe = MoEFields(expert="moe_intermediate_size", shared=True, dense_layers=True)
    table = table(LLAMA, rope(partial=True), qk_norm("head", "Qwen3-Next", "each query and key head", unit_offset=True),
                  Fixed("block.norm.unit_offset", True, why="RMSNorm scaling by (1 + weight)"),
                  Derived("gate", _gate, _write_gate, {"block.attention.gate": one_of(True)}),
                  Derived("linear attention", _read_linear, _write_linear, {"layers": ANY}),
                  Tokens({}), moe_ffn(moe))

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        att = s.block.attention
        rules = [rule("tok_emb.weight", "model.embed_tokens.weight")]
        for i, layer in enumerate(s.stack_layers()):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            rules += [*weights(f"{z}.attn_norm", f"{h}.input_layernorm", bias=False),
                      *weights(f"{z}.ffn_norm", f"{h}.post_attention_layernorm", bias=False)]
            if isinstance(layer.block.attention, GatedDeltaNetSpec):
                a = f"{h}.linear_attn"
                rules += [rule(f"{z}.attn.qkvz.weight", f"{a}.in_proj_qkvz.weight"),
                          rule(f"{z}.attn.ba.weight", f"{a}.in_proj_ba.weight"),
                          rule(f"{z}.attn.conv.weight", f"{a}.conv1d.weight"),
                          rule(f"{z}.attn.A_log", f"{a}.A_log"), rule(f"{z}.attn.dt_bias", f"{a}.dt_bias"),
                          rule(f"{z}.attn.norm.weight", f"{a}.norm.weight"),
                          rule(f"{z}.attn.out.weight", f"{a}.out_proj.weight")]
            else:
                a = f"{h}.self_attn"
                rules += [*fused(f"{z}.attn.qkv", [f"{a}.{p}" for p in cls.qkv], bias=att.bias),
                          *weights(f"{z}.attn.out", f"{a}.o_proj", bias=att.has_out_bias),
                          *(rule(f"{z}.attn.{n}.weight", f"{a}.{n}.weight") for n in ("q_norm", "k_norm"))]
            rules += cls.ffn_rules(layer.block.ffn, z, h)
        return rules + [*weights("stack.norm", "model.norm", bias=False), rule("head.weight", "lm_head.weight")]

    @classmethod
    def mtp_names(cls, config: Any, names: Collection[str]) -> list[str]:
        """The checkpoint's ``mtp.*`` tensors, which HF's class does not hold."""
        return [k for k in names if k.startswith("mtp.")]

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        if s.block.attention.kind == "gated_deltanet":
            raise unsupported(f"zoo -> {cls.name}", "block.attention.kind", "gated_deltanet",
                              "Qwen3-Next's block is its gated attention, the linear-attention layers a layer pattern")
        return super().config(s, given)
