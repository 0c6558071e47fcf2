"""The text towers people embed with: CLIP's (``CLIPTextModel``, ``CLIPTextModelWithProjection``) and
SigLIP's (``SiglipTextModel``, and ``Siglip2TextModel``, the same layout) <-> a zoo encoder with
``head: none``, its hidden states the reference's ``last_hidden_state`` and its pooled output
(``model.pool``, :func:`zoo.embed` with ``pooling="pooler"``) the reference's ``pooler_output``
or ``text_embeds``.

Both are pre-norm encoders with learned absolute positions (no embedding norm), biases on every
projection, a two-layer MLP (CLIP: ``quick_gelu``; SigLIP: ``gelu_pytorch_tanh``) and a final
LayerNorm. They differ in three things:

- CLIP masks attention causally (``causal: true``); SigLIP does not;
- CLIP pools the end-of-text token (``pool: {kind: eos, token: eos_token_id}``; HF's legacy
  ``eos_token_id: 2`` means the slot of the row's highest id, ``token: null``); SigLIP the last
  slot, padding or not (``pool: last``);
- ``CLIPTextModelWithProjection`` maps the pooled vector by ``text_projection`` without a bias
  (``projection: {dim: projection_dim, bias: false}``, its output ``text_embeds``), ``CLIPTextModel``
  not at all; SigLIP by ``head`` with a bias (``projection: {dim: projection_size, bias: true}``,
  its ``pooler_output``).

``eos_token_id`` is the pool's, so a caller's differing one is refused; ``initializer_factor``
scales only HF's initialisation and is not read. Positions: HF numbers the slots from 0 unless
given ``position_ids``; zoo numbers the real tokens (a left-padded row as if unpadded), which is
HF's with ``position_ids`` counting the real tokens (both equal unpadded and padded on the right)."""

from __future__ import annotations

from typing import Any

from torch import nn

from zoo.interop.claims import ANY, one_of, predicate
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import Architecture, act_name, ffn_of, fused, require, weights
from zoo.interop.hf.table import Claim, Derived, Field, Fixed, Tokens, apply_read, table
from zoo.interop.hf.traits import layernorm, mha, who
from zoo.spec import FamilySpec

__all__ = ["ClipText", "ClipTextProjection", "SiglipText", "Siglip2Text"]

# HF's activation names <-> zoo's two-layer FFNs
_FFNS = {"quick_gelu": {"kind": "quick_gelu"}, "gelu": {"kind": "gelu", "approximate": "none"},
         "gelu_pytorch_tanh": {"kind": "gelu", "approximate": "tanh"}, "gelu_new": {"kind": "gelu", "approximate": "tanh"},
         "relu": {"kind": "relu"}, "silu": {"kind": "silu"}}
_ACTS = {("quick_gelu", "none"): "quick_gelu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_pytorch_tanh",
         ("relu", "none"): "relu", ("silu", "none"): "silu"}
LEGACY_EOS = 2  # CLIPTextModel's eos_token_id before transformers PR #24773: pool the row's highest id


def _ffn(c: Any, where: str) -> dict:
    return {"block.ffn": {**ffn_of(_FFNS, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size}}


def _write_ffn(s: FamilySpec, where: str) -> dict:
    return {"intermediate_size": s.block.ffn.hidden_size(s.d_model), "hidden_act": act_name(s.block.ffn, _ACTS, where)}


def _read_eos(c: Any, where: str) -> dict:
    eos = c.eos_token_id
    if not isinstance(eos, int) or isinstance(eos, bool):
        raise unsupported(where, "eos_token_id", eos, "CLIPTextModel pools the first slot of one end-of-text id")
    return {"pool": {"kind": "eos", "token": None if eos == LEGACY_EOS else eos}}


def _write_eos(s: FamilySpec, where: str) -> dict:
    token = s.pool.token
    require(token != LEGACY_EOS, where, "pool.token", token,
            f"{who(where)} reads eos_token_id {LEGACY_EOS} as its legacy setting, the slot of the row's highest id "
            f"(pool.token: null); give the end-of-text token another id")
    return {"eos_token_id": LEGACY_EOS if token is None else token}


def _pool_claim(kind: str) -> dict:
    return {"pool": predicate(f"pool: {{kind: {kind}}}")(lambda pool: getattr(pool, "kind", None) == kind)}


def _projection(field: str, bias: bool) -> Derived:
    """``field`` <-> ``projection.dim``, the projection's bias fixed at ``bias``."""

    def write(s: FamilySpec, where: str) -> dict:
        p = s.projection
        require(p is not None, where, "projection", None, f"{who(where)} maps the pooled vector by a linear layer; set "
                f"projection: {{dim: N, bias: {str(bias).lower()}}}")
        return {field: p.dim}

    return Derived("projection", lambda c, where: {"projection": {"dim": getattr(c, field), "bias": bias}}, write,
                   {"projection": predicate(f"a projection with bias: {str(bias).lower()}")(
                       lambda p: p is None or p.bias == bias), "projection.dim": ANY})


# the encoder both towers share: sizes, pre-norm blocks, learned positions, the MLP, the final norm
_TOWER = table(
    Fixed("family", "encoder"), Field("vocab_size", "vocab_size"), Field("max_position_embeddings", "max_seq_len"),
    Field("hidden_size", "d_model"), Field("num_hidden_layers", "n_layers"),
    Fixed("head.kind", "none"), Fixed("embedding.scale", False), Fixed("embedding.norm", False),
    Fixed("position.kind", "learned", why="learned absolute positions"),
    mha(), Fixed("block.attention.bias", True), Claim("block.attention.out_bias", one_of(None, True)),
    Derived("ffn", _ffn, _write_ffn, {"block.ffn.kind": one_of("quick_gelu", "gelu", "relu", "silu"),
                                      "block.ffn.approximate": ANY, "block.ffn.hidden": ANY}),
    Fixed("block.ffn.bias", True), layernorm(), Fixed("block.kind", "pre"),
    Field("attention_dropout", "dropout.attention"),
)
CLIP_TEXT = table(
    _TOWER, Fixed("causal", True, why="CLIP's causal mask (causal: true)"),
    Derived("pool", _read_eos, _write_eos, _pool_claim("eos")), Fixed("projection", None),
    Field("initializer_range", "init.std"), Fixed("init.scheme", "normal"),
    Tokens({"pad_token_id": 1, "bos_token_id": 49406}),
)
SIGLIP_TEXT = table(
    _TOWER, Fixed("causal", False, why="SigLIP's attention to every token (causal: false)"),
    Derived("pool", lambda c, where: {"pool": {"kind": "last"}}, lambda s, where: {}, _pool_claim("last")),
    _projection("projection_size", bias=True),
    Tokens({"pad_token_id": 1, "bos_token_id": 49406, "eos_token_id": 49407}),
)


def tower_rules(s: FamilySpec, prefix: str = "") -> list[Rule]:
    """The tensors of CLIP's and SigLIP's text encoder, under ``prefix`` (``text_model.`` or nothing)."""
    e = f"{prefix}embeddings"
    rules = [rule("tok_emb.weight", f"{e}.token_embedding.weight"), rule("position.weight", f"{e}.position_embedding.weight")]
    for i in range(s.n_layers):
        z, h = f"stack.blocks.{i}", f"{prefix}encoder.layers.{i}"
        rules += [
            *fused(f"{z}.attn.qkv", [f"{h}.self_attn.{n}_proj" for n in "qkv"], bias=True),
            *weights(f"{z}.attn.out", f"{h}.self_attn.out_proj"), *weights(f"{z}.attn_norm", f"{h}.layer_norm1"),
            *weights(f"{z}.ffn.fc1", f"{h}.mlp.fc1"), *weights(f"{z}.ffn.fc2", f"{h}.mlp.fc2"),
            *weights(f"{z}.ffn_norm", f"{h}.layer_norm2"),
        ]
    return rules + weights("stack.norm", f"{prefix}final_layer_norm")


class _Tower(Architecture):
    """A text tower: its spec read from the config alone (it has no LM head whose tying the model says);
    ``pooled``: ``zoo convert`` records that ``zoo embed`` gives its pooled output (pooling "pooler")."""

    pooled = True

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        return apply_read(cls.table, c, f"{cls.name} -> zoo")


class ClipText(_Tower):
    name = "CLIPTextModel"
    config_name = "CLIPTextConfig"
    model_type = "clip_text_model"
    table = CLIP_TEXT

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        c = super().config(s, given)
        eos = given.get("eos_token_id", c.get("eos_token_id"))
        if "eos_token_id" in c and eos != c["eos_token_id"]:
            raise unsupported(f"zoo -> {cls.name}", "eos_token_id", eos,
                              f"the spec's pool takes the end-of-text id {c['eos_token_id']} (pool.token); change the "
                              f"spec instead")
        return c

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        return tower_rules(s)


class ClipTextProjection(ClipText):
    name = "CLIPTextModelWithProjection"
    table = table(CLIP_TEXT, _projection("projection_dim", bias=False))

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        return tower_rules(s, "text_model.") + [rule("projection.weight", "text_projection.weight")]


class SiglipText(_Tower):
    name = "SiglipTextModel"
    config_name = "SiglipTextConfig"
    model_type = "siglip_text_model"
    table = SIGLIP_TEXT

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        return tower_rules(s) + weights("projection", "head")


class Siglip2Text(SiglipText):
    name = "Siglip2TextModel"
    config_name = "Siglip2TextConfig"
    model_type = "siglip2_text_model"
