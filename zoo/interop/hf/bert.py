"""BERT: ``BertForMaskedLM`` <-> a zoo encoder (Post-Norm, masked-LM head); its backbone ``BertModel``
(what sentence-embedding, retrieval and reranking checkpoints ship) <-> the same encoder with
``head: none``, and with HF's pooler (``add_pooling_layer``, the default) as ``pooler: true``
(:class:`~zoo.interop.hf.base.Headless`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import (
    TEXT_CLAIMS,
    Architecture,
    fused,
    layernorm,
    plain_attention,
    refuse_config,
    require,
    weights,
)
from zoo.spec import FamilySpec

__all__ = ["Bert", "bert_layers"]


class Bert(Architecture):
    name = "BertForMaskedLM"
    config_name = "BertConfig"
    model_type = "bert"
    base = "BertModel"
    prefix = "bert"
    base_pooler = "pooler"
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "family": one_of("encoder"), "type_vocab_size": ANY, "embedding.norm": ANY, "position.kind": one_of("learned"),
        "block.kind": one_of("post"), "block.norm.kind": one_of("layernorm"), "block.norm.bias": one_of(True),
        "block.attention.out_bias": ANY, "head.kind": one_of("mlm"), "head.transform": one_of(True), "head.bias": one_of(True),
        "dropout.embedding": ANY, "dropout.residual": ANY, "dropout.attention": ANY,
    }

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "BertForMaskedLM -> zoo"
        refuse_config(c, where, {
            "is_decoder": (False, "zoo encoders are bidirectional"),
            "add_cross_attention": (False, "zoo encoders have no cross-attention"),
            "position_embedding_type": ("absolute", "zoo's BERT layout has absolute learned positions"),
        })
        if c.hidden_act not in ("gelu", "gelu_python"):
            raise unsupported(where, "hidden_act", c.hidden_act,
                              "zoo's masked-LM head transform uses exact GELU, so only hidden_act 'gelu' converts")
        require(c.type_vocab_size > 0, where, "type_vocab_size", c.type_vocab_size, "BERT needs at least one segment type")
        tied = c.tie_word_embeddings if hf is None else hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
        return {
            "family": "encoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings,
            "type_vocab_size": c.type_vocab_size, "d_model": c.hidden_size, "n_layers": c.num_hidden_layers,
            "embedding": {"scale": False, "norm": True}, "head": {"kind": "mlm", "transform": True, "bias": True, "tied": tied},
            "position": {"kind": "learned"},
            "block": {
                "attention": {"kind": "mha", "n_heads": c.num_attention_heads, "bias": True},
                "ffn": {"kind": "gelu", "approximate": "none", "hidden": c.intermediate_size, "bias": True},
                "norm": {"kind": "layernorm", "eps": c.layer_norm_eps},
                "kind": "post",
            },
            "dropout": {"embedding": c.hidden_dropout_prob, "residual": c.hidden_dropout_prob,
                        "attention": c.attention_probs_dropout_prob, "ffn": 0.0},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }

    @staticmethod
    def config(s: FamilySpec, given: dict) -> dict:
        where = "zoo -> BertForMaskedLM"
        require(s.position.kind == "learned", where, "position.kind", s.position.kind, "BERT has learned absolute positions")
        layernorm(s, where, "post")
        plain_attention(s, where)
        ffn = s.block.ffn
        require((ffn.kind, getattr(ffn, "approximate", None)) == ("gelu", "none"), where, "block.ffn.kind", ffn.kind,
                "BERT's hidden_act is shared with the masked-LM head, which zoo computes with exact GELU")
        require(ffn.bias, where, "block.ffn.bias", False, "BERT's FFN has biases")
        require(s.embedding.norm, where, "embedding.norm", False, "BERT normalises the embedding sum (norm: true)")
        require(s.type_vocab_size > 0, where, "type_vocab_size", 0, "BERT has segment embeddings; set type_vocab_size >= 1")
        require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                f"BERT's hidden_dropout_prob is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        return {
            "vocab_size": s.vocab_size, "hidden_size": s.d_model, "num_hidden_layers": s.n_layers,
            "num_attention_heads": s.block.attention.n_heads, "intermediate_size": ffn.hidden_size(s.d_model),
            "hidden_act": "gelu", "hidden_dropout_prob": s.dropout.residual,
            "attention_probs_dropout_prob": s.dropout.attention, "max_position_embeddings": s.max_seq_len,
            "type_vocab_size": s.type_vocab_size, "layer_norm_eps": s.block.norm.eps, "initializer_range": s.init.std,
            "tie_word_embeddings": s.head.tied,
        }

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        e = "bert.embeddings"
        rules = [
            rule("tok_emb.weight", f"{e}.word_embeddings.weight"), rule("position.weight", f"{e}.position_embeddings.weight"),
            rule("type_emb.weight", f"{e}.token_type_embeddings.weight"), *weights("emb_norm", f"{e}.LayerNorm"),
        ]
        rules += bert_layers(s, "bert")
        if getattr(s, "pooler", False):  # BertModel's (the backbone's claims alone take it)
            rules += weights("pooler.dense", "bert.pooler.dense")
        if s.head.kind != "mlm":
            return rules
        p = "cls.predictions"
        return rules + [
            *weights("head.transform.0", f"{p}.transform.dense"), *weights("head.transform.2", f"{p}.transform.LayerNorm"),
            *weights("head.proj", f"{p}.decoder"),
        ]

    @staticmethod
    def check_from(hf: nn.Module, s: FamilySpec, ref: dict[str, Tensor]) -> list[str]:
        # The forward pass reads cls.predictions.decoder.bias; HF ties cls.predictions.bias to it,
        # or (untied embeddings) leaves it unread.
        return ["cls.predictions.bias"] if s.head.kind == "mlm" else []

    @staticmethod
    def extra_to(state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        return {"cls.predictions.bias": state["head.proj.bias"].detach()} if s.head.kind == "mlm" else {}


def bert_layers(s: FamilySpec, prefix: str) -> list[Rule]:
    """The encoder layers of BERT's layout (RoBERTa's too), under ``{prefix}.encoder.layer``."""
    rules = []
    for i in range(s.n_layers):
        z, h = f"stack.blocks.{i}", f"{prefix}.encoder.layer.{i}"
        qkv = [f"{h}.attention.self.{p}" for p in ("query", "key", "value")]
        rules += [
            *fused(f"{z}.attn.qkv", qkv, bias=True),
            *weights(f"{z}.attn.out", f"{h}.attention.output.dense"),
            *weights(f"{z}.attn_norm", f"{h}.attention.output.LayerNorm"),
            *weights(f"{z}.ffn.fc1", f"{h}.intermediate.dense"),
            *weights(f"{z}.ffn.fc2", f"{h}.output.dense"),
            *weights(f"{z}.ffn_norm", f"{h}.output.LayerNorm"),
        ]
    return rules
