"""ModernBERT (Warner et al. 2024): ``ModernBertForMaskedLM`` <-> a zoo encoder of Pre-Norm blocks
with GeGLU, RoPE and local and global layers; its backbone ``ModernBertModel`` <-> ``head: none``.

Every ``global_attn_every_n_layers``-th layer from the first attends to every token (HF's
``layer_types`` ``full_attention``), the others to the tokens at most ``local_attention // 2`` slots
away on either side (``sliding_attention``: zoo's ``window`` = ``local_attention`` in an encoder),
each kind with its own RoPE base (``rope_parameters``: ``global_rope_theta`` 160 000 and
``local_rope_theta`` 10 000 in the releases). The first layer has no norm before its attention (the
embedding norm precedes it: ``attn_norm: false``); LayerNorms (``norm_bias``), the attention and MLP
biases (``attention_bias``, ``mlp_bias``), a final norm; the head is a linear (``classifier_bias``),
GELU and a norm, then the decoder (``decoder_bias``), tied to the embedding::

    position: {kind: rope, base: 160000.0}
    layers: [{at: 0, block: {attn_norm: false}},
             {at: [1, 2, 4, 5, ...], block: {attention: {window: 128}}, position: {kind: rope, base: 10000.0}}]

HF numbers positions 0, 1, ... along the padded row (eager and SDPA attention; its flash-attention
path unpads), zoo counts real tokens: the same for right padding.

``ModernBertForSequenceClassification`` <-> ``head: none`` with a ``classifier``
(:mod:`zoo.interop.hf.classification`): the first token or the real tokens' mean
(``classifier_pooling``: ``classifier.pool``), the head's ``dense`` (with a bias where
``classifier_bias``: ``classifier.pooler_bias``), ``classifier_activation`` (any of zoo's classifier
activations here: ``classifier.activation``) and ``norm`` (the blocks' LayerNorm: ``classifier.norm``),
dropout (``classifier_dropout``) and the linear ``classifier``. Its config's ``decoder_bias`` is the
masked-LM head's, which it has not: written as HF's default."""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, unsupported
from zoo.interop.hf.base import Architecture, require, weights
from zoo.interop.hf.classification import activation, dropout, sequence_classifier
from zoo.interop.hf.table import Derived, Drop, Field, Fixed, Refuse, Tokens, table
from zoo.interop.hf.traits import gated_ffn, mha, one_bias
from zoo.spec import FamilySpec

__all__ = ["ModernBert", "ModernBertClassifier"]

FULL, SLIDING = "full_attention", "sliding_attention"


def _theta(c: Any, kind: str, where: str) -> float:
    params = (getattr(c, "rope_parameters", None) or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default" or set(params) - {"rope_type", "rope_theta"}:
        raise unsupported(where, f"rope_parameters.{kind}", params, "zoo reads ModernBERT's plain rope (rope_type default)")
    return float(params["rope_theta"])


def _read_layers(c: Any, where: str) -> dict:
    """The global layers' rope as the model's position; the first layer without its attention norm,
    and the local layers' window and rope as layer patterns."""
    kinds = list(c.layer_types)
    for kind in sorted(set(kinds) - {FULL, SLIDING}):
        raise unsupported(where, "layer_types", kind, f"ModernBERT's layers are {FULL} or {SLIDING}")
    local = [i for i, k in enumerate(kinds) if k == SLIDING]
    layers: list[dict] = [{"at": 0, "block": {"attn_norm": False}}]
    if local:
        layers.append({"at": local, "block": {"attention": {"window": c.local_attention}},
                       "position": {"kind": "rope", "base": _theta(c, SLIDING, where)}})
    return {"position": {"kind": "rope", "base": _theta(c, FULL, where)}, "layers": layers}


def _write_layers(s: FamilySpec, where: str) -> dict:
    """``layer_types``, ``local_attention`` and each type's rope from the layers, checked to differ
    only as ModernBERT's do."""
    att, windows, thetas, kinds = s.block.attention, set(), {FULL: set(), SLIDING: set()}, []
    for i, layer in enumerate(s.stack_layers()):
        b = layer.block
        window = b.attention.window
        plain = b.model_copy(update={"attention": b.attention.model_copy(update={"window": att.window}), "attn_norm": s.block.attn_norm})
        require(plain == s.block, where, "layers", f"layer {i}'s block",
                "ModernBERT's layers differ only in their window, rope base and the first one's attention norm")
        require(b.attn_norm == (i > 0), where, "layers", f"layer {i}'s attn_norm",
                "ModernBERT's first layer has no attention norm (attn_norm: false) and every other layer one")
        pos = layer.position or s.position
        require(pos.kind == "rope" and pos.fraction == 1 and pos.scaling is None, where, "layers", f"layer {i}'s position",
                "ModernBERT's layers rotate every dimension with a plain rope")
        kind = FULL if window is None else SLIDING
        kinds.append(kind)
        thetas[kind].add(pos.base)
        if window is not None:
            windows.add(window)
    require(len(windows) <= 1, where, "block.attention.window", sorted(windows), "ModernBERT has one local_attention")
    for kind, bases in thetas.items():
        require(len(bases) <= 1, where, "layers", f"{kind} rope bases {sorted(bases)}", "ModernBERT has one rope per layer type")
    base = {kind: (next(iter(b)) if b else s.position.base) for kind, b in thetas.items()}
    return {"layer_types": kinds, "rope_parameters": {k: {"rope_type": "default", "rope_theta": base[k]} for k in (FULL, SLIDING)},
            "local_attention": next(iter(windows)) if windows else 128}


def _classifier(c: Any, where: str) -> dict:
    if c.classifier_activation not in ("gelu", "gelu_python"):
        raise unsupported(where, "classifier_activation", c.classifier_activation, "zoo's masked-LM head transform uses exact GELU")
    return {}


class ModernBert(Architecture):
    name = "ModernBertForMaskedLM"
    config_name = "ModernBertConfig"
    model_type = "modernbert"
    base = "ModernBertModel"
    prefix = "model"
    tie = ("decoder", "model.embeddings.tok_embeddings")
    table = table(
        Derived("classifier", _classifier, lambda s, where: {"classifier_activation": "gelu"}),
        Refuse("attention_dropout", 0.0, "ModernBERT drops the attention weights and the attention's output at one rate, "
               "which zoo does not"),
        Fixed("family", "encoder"), Field("vocab_size", "vocab_size"), Field("max_position_embeddings", "max_seq_len"),
        Fixed("type_vocab_size", 0, why="no segment embeddings"), Field("hidden_size", "d_model"),
        Field("num_hidden_layers", "n_layers"), Fixed("embedding.scale", False), Fixed("embedding.norm", True),
        Fixed("head.kind", "mlm"), Fixed("head.transform", True),
        Derived("head", lambda c, where: {"head.transform_bias": c.classifier_bias, "head.bias": c.decoder_bias},
                lambda s, where: {"decoder_bias": s.head.bias, "classifier_bias": getattr(s.head, "transform_bias", False)},
                {"head.transform_bias": ANY, "head.bias": ANY}),  # a backbone's head is none
        Field("tie_word_embeddings", "head.tied"),
        Fixed("block.kind", "pre"), mha(), one_bias(),
        gated_ffn({("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh", ("swiglu", "none"): "silu"},
                  "hidden_activation"),
        Field("mlp_bias", "block.ffn.bias"),
        Fixed("block.norm.kind", "layernorm"), Field("norm_eps", "block.norm.eps"), Field("norm_bias", "block.norm.bias"),
        Derived("layers", _read_layers, _write_layers, {"position.kind": one_of("rope"), "position.base": ANY,
                                                         "block.attn_norm": ANY, "block.attention.window": ANY, "layers": ANY}),
        Field("embedding_dropout", "dropout.embedding"), Field("mlp_dropout", "dropout.ffn"),
        Fixed("init.scheme", "trunc_normal"), Field("initializer_range", "init.std"),
        Tokens({"pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281, "cls_token_id": 50281, "sep_token_id": 50282}),
    )

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        a, m, n = s.block.attention.bias, s.block.ffn.bias, s.block.norm.bias
        rules = [*weights("tok_emb", "model.embeddings.tok_embeddings", bias=False),
                 *weights("emb_norm", "model.embeddings.norm", bias=n), *weights("stack.norm", "model.final_norm", bias=n)]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            rules += [*weights(f"{z}.attn.qkv", f"{h}.attn.Wqkv", bias=a), *weights(f"{z}.attn.out", f"{h}.attn.Wo", bias=a),
                      *weights(f"{z}.ffn_norm", f"{h}.mlp_norm", bias=n), *weights(f"{z}.ffn.fc1", f"{h}.mlp.Wi", bias=m),
                      *weights(f"{z}.ffn.fc2", f"{h}.mlp.Wo", bias=m)]
            if i > 0:
                rules += weights(f"{z}.attn_norm", f"{h}.attn_norm", bias=n)
        if s.head.kind != "mlm":
            return rules
        return rules + [*weights("head.transform.0", "head.dense", bias=s.head.transform_bias),
                        *weights("head.transform.2", "head.norm", bias=n), *weights("head.proj", "decoder", bias=s.head.bias)]


# the first token or the mean, dense, classifier_activation, the blocks' norm, dropout, the labels' linear
ModernBertClassifier = sequence_classifier(
    ModernBert, "ModernBertForSequenceClassification", Drop("classifier"), Drop("head"),
    Fixed("classifier.pooler", True, why="the head's dense layer, activation and norm (pooler: true)"),
    Fixed("classifier.norm", True, why="the head's norm after its activation (norm: true)"),
    activation("classifier_activation"), Field("classifier_bias", "classifier.pooler_bias"),
    Field("classifier_pooling", "classifier.pool"), dropout("classifier_dropout", fallback=None),
    dense="head.dense", norm="head.norm")
