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
path unpads), zoo counts real tokens: the same for right padding."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, unsupported
from zoo.interop.hf.base import GATED, TEXT_CLAIMS, Architecture, act_name, ffn_of, require, token_ids, weights
from zoo.spec import FamilySpec

__all__ = ["ModernBert"]

FULL, SLIDING = "full_attention", "sliding_attention"
_ACTS = {("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh", ("swiglu", "none"): "silu"}


def _theta(c: Any, kind: str, where: str) -> float:
    params = (getattr(c, "rope_parameters", None) or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default" or set(params) - {"rope_type", "rope_theta"}:
        raise unsupported(where, f"rope_parameters.{kind}", params, "zoo reads ModernBERT's plain rope (rope_type default)")
    return float(params["rope_theta"])


class ModernBert(Architecture):
    name = "ModernBertForMaskedLM"
    config_name = "ModernBertConfig"
    model_type = "modernbert"
    base = "ModernBertModel"
    prefix = "model"
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "family": one_of("encoder"), "embedding.norm": one_of(True), "position.kind": one_of("rope"),
        "position.base": ANY, "block.kind": one_of("pre"), "block.attn_norm": ANY, "block.norm.kind": one_of("layernorm"),
        "block.norm.bias": ANY, "block.attention.out_bias": ANY, "block.attention.window": ANY, "layers": ANY,
        "head.kind": one_of("mlm"), "head.transform": one_of(True), "head.transform_bias": ANY, "head.bias": ANY,
        "dropout.embedding": ANY, "dropout.ffn": ANY,
    }

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "ModernBertForMaskedLM -> zoo"
        if c.classifier_activation not in ("gelu", "gelu_python"):
            raise unsupported(where, "classifier_activation", c.classifier_activation,
                              "zoo's masked-LM head transform uses exact GELU")
        require(c.attention_dropout == 0, where, "attention_dropout", c.attention_dropout,
                "ModernBERT drops the attention weights and the attention's output at one rate, which zoo does not")
        kinds = list(c.layer_types)
        for kind in sorted(set(kinds) - {FULL, SLIDING}):
            raise unsupported(where, "layer_types", kind, f"ModernBERT's layers are {FULL} or {SLIDING}")
        ffn = {**ffn_of(GATED, c.hidden_activation, where, "hidden_activation"), "hidden": c.intermediate_size, "bias": c.mlp_bias}
        local = [i for i, k in enumerate(kinds) if k == SLIDING]
        layers: list[dict] = [{"at": 0, "block": {"attn_norm": False}}]
        if local:
            layers.append({"at": local, "block": {"attention": {"window": c.local_attention}},
                           "position": {"kind": "rope", "base": _theta(c, SLIDING, where)}})
        tied = c.tie_word_embeddings if hf is None else hf.decoder.weight is hf.model.embeddings.tok_embeddings.weight
        return {
            "family": "encoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings, "type_vocab_size": 0,
            "d_model": c.hidden_size, "n_layers": c.num_hidden_layers, "embedding": {"scale": False, "norm": True},
            "position": {"kind": "rope", "base": _theta(c, FULL, where)},
            "head": {"kind": "mlm", "transform": True, "transform_bias": c.classifier_bias, "bias": c.decoder_bias, "tied": tied},
            "block": {
                "kind": "pre",
                "attention": {"kind": "mha", "n_heads": c.num_attention_heads, "bias": c.attention_bias},
                "ffn": ffn,
                "norm": {"kind": "layernorm", "eps": c.norm_eps, "bias": c.norm_bias},
            },
            "layers": layers,
            "dropout": {"embedding": c.embedding_dropout, "residual": 0.0, "attention": 0.0, "ffn": c.mlp_dropout},
            "init": {"scheme": "trunc_normal", "std": c.initializer_range},
        }

    @staticmethod
    def config(s: FamilySpec, given: dict) -> dict:
        where = "zoo -> ModernBertForMaskedLM"
        d, att, ffn = s.d_model, s.block.attention, s.block.ffn
        require(att.n_kv_heads == att.n_heads, where, "block.attention.n_kv_heads", att.n_kv_heads,
                "ModernBERT has multi-head attention only (n_kv_heads == n_heads)")
        require(d % att.n_heads == 0 and (att.qk_size(d), att.v_size(d)) == (d // att.n_heads,) * 2, where,
                "block.attention.head_dim", att.qk_size(d), "ModernBERT's head size is d_model / n_heads")
        require(att.has_out_bias == att.bias, where, "block.attention.out_bias", att.out_bias,
                "ModernBERT has one attention_bias for its Wqkv and Wo")
        act = act_name(ffn, _ACTS, where)
        require(s.type_vocab_size == 0, where, "type_vocab_size", s.type_vocab_size, "ModernBERT has no segment embeddings")
        windows, thetas = set(), {FULL: set(), SLIDING: set()}
        kinds = []
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
        c = {
            "vocab_size": s.vocab_size, "hidden_size": d, "intermediate_size": ffn.hidden_size(d), "num_hidden_layers": s.n_layers,
            "num_attention_heads": att.n_heads, "hidden_activation": act, "max_position_embeddings": s.max_seq_len,
            "initializer_range": s.init.std, "norm_eps": s.block.norm.eps, "norm_bias": s.block.norm.bias,
            "attention_bias": att.bias, "attention_dropout": 0.0, "layer_types": kinds,
            "rope_parameters": {k: {"rope_type": "default", "rope_theta": base[k]} for k in (FULL, SLIDING)},
            "local_attention": next(iter(windows)) if windows else 128, "embedding_dropout": s.dropout.embedding,
            "mlp_bias": ffn.bias, "mlp_dropout": s.dropout.ffn, "decoder_bias": s.head.bias,
            "classifier_bias": getattr(s.head, "transform_bias", False),  # a backbone's head is none
            "classifier_activation": "gelu", "tie_word_embeddings": s.head.tied,
        }
        require(s.dropout.residual == 0 and s.dropout.attention == 0, where, "dropout.residual", s.dropout.residual,
                "ModernBERT has no residual dropout of its own (its attention_dropout is not zoo's)")
        v = s.vocab_size
        token_ids(c, v, {"pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281, "cls_token_id": 50281,
                         "sep_token_id": 50282}, given)
        return c

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
