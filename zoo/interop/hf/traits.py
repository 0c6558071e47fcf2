"""Traits: the features HF's LLaMA-like decoders compose, each as table entries
(:mod:`zoo.interop.hf.table`) with the claims it brings and, where it has tensors, their rules.

The parts of every such decoder, which a class picks among: :func:`heads` (the attention heads,
with or without a ``head_dim`` field of its own), :func:`gated_ffn` (the MLP's activation and
width), :func:`rope` (``rope_parameters``, with partial rotary where the class reads it), and its
features: :func:`one_bias` or :func:`qkv_bias`, :func:`sliding_window` (one window on every
layer), :func:`layer_windows` (Qwen2's per-layer ``layer_types``), :func:`qk_norm` and its scope,
:func:`softcaps`, :func:`residual_dropout`.
"""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY, one_of, predicate
from zoo.interop.common import rule, unsupported
from zoo.interop.hf.base import GATED, TWO_LAYER, act_name, ffn_of, require, same_layers
from zoo.interop.hf.rope import read_rope, write_rope
from zoo.interop.hf.table import Check, Claim, Derived, Drop, Field, Fixed, Tensors
from zoo.spec import FamilySpec

__all__ = ["FULL", "SLIDING", "decoder", "gated_ffn", "heads", "hidden_dropout", "layer_windows", "layernorm", "mha", "no_bias", "one_bias", "qk_norm",
           "qkv_bias", "read_windows", "residual_dropout", "rope", "sliding_window", "softcaps", "two_layer_ffn", "who",
           "write_windows"]

FULL, SLIDING = "full_attention", "sliding_attention"


def who(where: str) -> str:
    """The reference class of a converter's ``where`` (``zoo -> LlamaForCausalLM``)."""
    return where.rsplit(" ", 1)[-1] if where.startswith("zoo") else where.split(" ", 1)[0]


# ------------------------------------------------------------------------------------ the parts
def decoder(*, positions: str = "max_position_embeddings", width: str = "hidden_size", layers: str = "num_hidden_layers",
            init: str = "initializer_range") -> tuple:
    """A decoder's sizes (``vocab_size`` and the config's names of the others), its LM head without
    a bias, tied by ``tie_word_embeddings``, its plain embeddings and normal init."""
    return (Fixed("family", "decoder"), Field("vocab_size", "vocab_size"), Field(positions, "max_seq_len"),
            Field(width, "d_model"), Field(layers, "n_layers"),
            Fixed("head.kind", "lm"), Fixed("head.bias", False), Field("tie_word_embeddings", "head.tied"),
            Fixed("embedding.scale", False), Fixed("embedding.norm", False),
            Fixed("init.scheme", "normal"), Field(init, "init.std"))


def heads(*, head_dim_field: bool = True) -> Derived:
    """``num_attention_heads``, ``num_key_value_heads`` and (``head_dim_field``) ``head_dim`` <->
    the attention's kind (mha, gqa, mqa by the key/value heads), heads and head sizes. Without a
    ``head_dim`` field the head size is hidden_size / heads; queries, keys and values share one."""

    def read(c: Any, where: str) -> dict:
        h, g, d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size
        head_dim = getattr(c, "head_dim", None)
        head_dim = head_dim if head_dim and head_dim * h != d else None
        kind = "mha" if g == h else ("mqa" if g == 1 else "gqa")
        a = "block.attention"
        return {f"{a}.kind": kind, f"{a}.n_heads": h, f"{a}.n_kv_heads": g if kind == "gqa" else None,
                f"{a}.head_dim": head_dim, f"{a}.v_head_dim": head_dim}

    def write(s: FamilySpec, where: str) -> dict:
        att, d = s.block.attention, s.d_model
        require(att.qk_size(d) == att.v_size(d), where, "block.attention.v_head_dim", att.v_size(d),
                f"{who(where)} has one head size for queries, keys and values (head_dim {att.qk_size(d)})")
        c = {"num_attention_heads": att.n_heads, "num_key_value_heads": att.n_kv_heads}
        if head_dim_field:
            c["head_dim"] = att.qk_size(d)
        else:
            require(att.qk_size(d) * att.n_heads == d, where, "block.attention.head_dim", att.qk_size(d),
                    f"{who(where)}'s head size is hidden_size / num_attention_heads ({d} / {att.n_heads})")
        return c

    return Derived("heads", read, write, {"block.attention.kind": one_of("mha", "gqa", "mqa"), "block.attention.n_heads": ANY,
                                          "block.attention.n_kv_heads": ANY, "block.attention.head_dim": ANY,
                                          "block.attention.v_head_dim": ANY})


def gated_ffn(acts: dict[tuple[str, str], str], field: str = "hidden_act") -> Derived:
    """The MLP: its activation ``field`` (a gated FFN by ``acts``: {(zoo kind, approximate): HF
    name}) and its width ``intermediate_size``; its bias is another entry's."""

    def read(c: Any, where: str) -> dict:
        return {"block.ffn": {**ffn_of(GATED, getattr(c, field), where, field), "hidden": c.intermediate_size}}

    def write(s: FamilySpec, where: str) -> dict:
        return {"intermediate_size": s.block.ffn.hidden_size(s.d_model), field: act_name(s.block.ffn, acts, where)}

    return Derived("ffn", read, write, {"block.ffn.kind": one_of(*dict.fromkeys(k for k, _ in acts)),
                                        "block.ffn.hidden": ANY, "block.ffn.approximate": ANY})


def mha(field: str = "num_attention_heads") -> Derived:
    """Multi-head attention only, ``field`` heads of hidden_size / heads for queries, keys and values."""

    def write(s: FamilySpec, where: str) -> dict:
        att, d = s.block.attention, s.d_model
        require(att.n_kv_heads == att.n_heads, where, "block.attention.n_kv_heads", att.n_kv_heads,
                f"{who(where)} has multi-head attention only (n_kv_heads == n_heads)")
        sizes = (att.qk_size(d), att.v_size(d))
        require(d % att.n_heads == 0 and sizes == (d // att.n_heads,) * 2, where, "block.attention.head_dim", sizes,
                f"{who(where)}'s head size is d_model / n_heads for queries, keys and values")
        return {field: att.n_heads}

    return Derived("heads", lambda c, where: {"block.attention.kind": "mha", "block.attention.n_heads": getattr(c, field)},
                   write, {"block.attention.kind": one_of("mha", "gqa", "mqa"), "block.attention.n_heads": ANY,
                           "block.attention.n_kv_heads": ANY, "block.attention.head_dim": ANY,
                           "block.attention.v_head_dim": ANY})


def two_layer_ffn(acts: dict[tuple[str, str], str], field: str = "hidden_act", width: str = "intermediate_size",
                  default_width: Any = None) -> Derived:
    """A two-layer MLP: its activation ``field`` (by ``acts``: {(zoo kind, approximate): HF name})
    and its width ``width`` (``default_width(config)`` where the config leaves it None)."""

    def read(c: Any, where: str) -> dict:
        hidden = getattr(c, width)
        hidden = default_width(c) if hidden is None and default_width is not None else hidden
        return {"block.ffn": {**ffn_of(TWO_LAYER, getattr(c, field), where, field), "hidden": hidden}}

    def write(s: FamilySpec, where: str) -> dict:
        return {width: s.block.ffn.hidden_size(s.d_model), field: act_name(s.block.ffn, acts, where)}

    return Derived("ffn", read, write, {"block.ffn.kind": one_of("relu", "gelu", "silu", "swiglu", "geglu"),
                                        "block.ffn.hidden": ANY, "block.ffn.approximate": ANY})


def layernorm(eps: str = "layer_norm_eps") -> tuple:
    """LayerNorm with biases, its epsilon ``eps``."""
    return Fixed("block.norm.kind", "layernorm"), Field(eps, "block.norm.eps"), Fixed("block.norm.bias", True)


def rope(*, partial: bool = False) -> Derived:
    """``rope_parameters`` <-> the rope position: its base, any scaling zoo expresses and, with
    ``partial``, its ``partial_rotary_factor`` (``position.fraction``; else refused below 1)."""
    rotary = predicate("rotary positions (rope; a decoder with learned positions converts to GPT2LMHeadModel)")
    claims = {"position.kind": rotary(lambda kind: kind == "rope"), "position.base": ANY, "position.scaling": ANY}
    return Derived("rope", lambda c, where: {"position": read_rope(c, where, partial=partial)},
                   lambda s, where: {"rope_parameters": write_rope(s.position, partial=partial)},
                   claims | ({"position.fraction": ANY} if partial else {}))


# ------------------------------------------------------------------------------------ features
_ONE_BIAS = Check("block.attention.out_bias", lambda s: s.block.attention.has_out_bias == s.block.attention.bias,
                  lambda s: f"this architecture has one bias setting for every attention projection (bias is {s.block.attention.bias})",
                  name="one bias")


def one_bias(field: str = "attention_bias") -> tuple:
    """One bias setting ``field`` for the q, k, v and output projections."""
    return Field(field, "block.attention.bias"), _ONE_BIAS


def qkv_bias(field: str | None = None) -> tuple:
    """Biases on the q, k and v projections (by ``field``; None: always) and none on the output."""
    bias = Fixed("block.attention.bias", True) if field is None else Field(field, "block.attention.bias")
    return bias, Fixed("block.attention.out_bias", False), Drop(_ONE_BIAS.key)


def no_bias() -> tuple:
    """No attention bias (none on the output projection either) and none in the MLP."""
    return (Fixed("block.attention.bias", False), Claim("block.attention.out_bias", one_of(None, False)), Drop(_ONE_BIAS.key),
            Fixed("block.ffn.bias", False))


def sliding_window() -> tuple:
    """``sliding_window`` <-> one window on every layer (None: attention to every earlier token)."""
    return (Field("sliding_window", "block.attention.window", default=None),)


def hidden_dropout(field: str = "hidden_dropout") -> Derived:
    """``field``: one dropout rate on the embeddings and on each sub-layer's output."""

    def write(s: FamilySpec, where: str) -> dict:
        require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                f"{who(where)}'s {field} is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        return {field: s.dropout.residual}

    return Derived("dropout", lambda c, where: {"dropout.embedding": getattr(c, field), "dropout.residual": getattr(c, field)},
                   write, {"dropout.embedding": ANY, "dropout.residual": ANY})


def residual_dropout(field: str = "resid_pdrop") -> tuple:
    """``field``: dropout on each sub-layer's output."""
    return (Field(field, "dropout.residual"),)


def softcaps() -> tuple:
    """Soft-capped attention logits and final logits (Gemma 2)."""
    return (Field("attn_logit_softcapping", "block.attention.softcap"), Field("final_logit_softcapping", "head.softcap"))


def read_windows(c: Any, where: str) -> dict:
    """The config's ``layer_types`` and ``sliding_window`` as spec paths: the block's window where
    every layer slides, a layer pattern where some do."""
    types = list(c.layer_types)
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise unsupported(where, "layer_types", unknown[0], f"zoo reads {FULL} and {SLIDING} layers")
    if SLIDING in types and not c.sliding_window:
        raise unsupported(where, "sliding_window", c.sliding_window, "sliding_attention layers need a window")
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    if len(sliding) == len(types):
        return {"block.attention.window": c.sliding_window}
    if sliding:
        n = len(types)
        at = f"{sliding[0]}:" if sliding == list(range(sliding[0], n)) else sliding
        return {"layers": [{"at": at, "block": {"attention": {"window": c.sliding_window}}}]}
    return {}


def write_windows(s: FamilySpec, where: str, name: str, *, parts: tuple[str, ...] = ()) -> dict:
    """The spec's windows as ``use_sliding_window``, ``sliding_window``, ``layer_types`` and the
    ``max_window_layers`` that gives them; layers that differ otherwise (but for the block ``parts``
    the caller checks), or two sizes, are refused."""
    same_layers(s, where, but=("window",), parts=parts)
    windows = [layer.block.attention.window for layer in s.stack_layers()]
    sizes = sorted({w for w in windows if w is not None})
    require(len(sizes) <= 1, where, "block.attention.window", sizes, f"{name} has one sliding_window for its sliding layers")
    types = [FULL if w is None else SLIDING for w in windows]
    c = {"use_sliding_window": bool(sizes), "sliding_window": sizes[0] if sizes else None, "layer_types": types}
    if sizes:
        first = types.index(SLIDING)
        c["max_window_layers"] = first if types[first:] == [SLIDING] * (len(types) - first) else len(types)
    return c


def layer_windows(name: str, *, parts: tuple[str, ...] = ()) -> tuple:
    """Qwen2's windows: ``layer_types`` (from ``use_sliding_window`` and ``max_window_layers``: the
    layers from that index on slide) <-> the block's window, or a layer pattern of windows::

        block: {attention: {window: null, ...}}
        layers: [{at: "2:", block: {attention: {window: 4096}}}]     # max_window_layers 2
    """
    return (Derived("window", read_windows, lambda s, where: write_windows(s, where, name, parts=parts),
                    {"block.attention.window": ANY, "layers": ANY}),)


def qk_norm(scope: str, name: str, what: str, *, unit_offset: bool = False) -> tuple:
    """An RMSNorm over ``scope`` (``what`` it normalises, in words) on queries and keys, with the
    block norm's ``rms_norm_eps`` (by weight, or with ``unit_offset`` by 1 + weight); its weights
    ``self_attn.q_norm`` and ``k_norm``."""
    want = {"kind": "rmsnorm", "scope": scope, "unit_offset": unit_offset}
    words = "(1 + weight)" if unit_offset else "weight, not 1 + weight"
    spelled = f"{{kind: rmsnorm, scope: {scope}" + (", unit_offset: true}" if unit_offset else "}")

    def write(s: FamilySpec, where: str) -> dict:
        qk, norm = s.block.attention.qk_norm, s.block.norm
        require(qk is not None and (qk.kind, qk.scope, qk.unit_offset) == tuple(want.values()) and qk.affine, where,
                "block.attention.qk_norm", qk.model_dump() if qk is not None else None,
                f"{name} applies RMSNorm (by {words}) to {what} (qk_norm: {spelled})")
        require(qk.eps == norm.eps, where, "block.attention.qk_norm.eps", qk.eps,
                f"{name} has one rms_norm_eps for every norm (block.norm.eps is {norm.eps})")
        return {}

    return (Derived("qk_norm", lambda c, where: {"block.attention.qk_norm": {**want, "eps": c.rms_norm_eps}}, write,
                    {"block.attention.qk_norm": ANY}),
            Tensors("qk_norm", lambda s, z, h: [rule(f"{z}.attn.{n}.weight", f"{h}.self_attn.{n}.weight") for n in ("q_norm", "k_norm")]))
