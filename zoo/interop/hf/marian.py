"""Marian: ``MarianMTModel`` <-> a zoo encoder-decoder (Post-Norm, sinusoidal positions, scaled embeddings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from zoo.components.position import sinusoid_table
from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import ConversionError, Rule
from zoo.interop.hf.seq2seq import SEQ2SEQ_CLAIMS, Seq2Seq, seq2seq
from zoo.interop.hf.table import Check, Derived, Fixed, Tokens, table
from zoo.spec import FamilySpec

__all__ = ["Marian", "permute_model_dim"]


def _last_id(s: FamilySpec) -> int:
    return min(s.vocab_size, s.src_vocab_size) - 1  # Marian's convention: the last id pads


class Marian(Seq2Seq):
    name = "MarianMTModel"
    config_name = "MarianConfig"
    model_type = "marian"
    claims: ClassVar[Claims] = {
        **SEQ2SEQ_CLAIMS, "src_vocab_size": ANY, "block.kind": one_of("post"),
        "position.kind": one_of("sinusoidal"), "position.base": one_of(10000.0), "position.layout": ANY,
    }
    table = table(
        seq2seq("post"), Fixed("embedding.norm", False),
        Fixed("position.kind", "sinusoidal"), Fixed("position.base", 10000.0), Fixed("position.layout", "concat"),
        Fixed("head.kind", "lm"),
        Check("head.tied", lambda s: s.head.tied or not s.share_embeddings,
              lambda s: "HF Marian shares source and target embeddings only when it also ties the output projection; "
                        "set share_embeddings: false or head.tied: true"),
        Derived("vocabularies", lambda c, where: {},  # read with the ties (spec)
                lambda s, where: {"vocab_size": s.src_vocab_size, "decoder_vocab_size": s.vocab_size,
                                  "share_encoder_decoder_embeddings": s.share_embeddings}),
        Tokens({"pad_token_id": _last_id, "decoder_start_token_id": _last_id}),
    )

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        s = super().spec(c, None)
        if hf is None:
            shared, tied, bias = c.share_encoder_decoder_embeddings and c.tie_word_embeddings, c.tie_word_embeddings, False
        else:
            shared, tied, bias = cls.read_ties(hf)
        vocab = {"vocab_size": c.vocab_size} if shared else {"vocab_size": c.decoder_vocab_size, "src_vocab_size": c.vocab_size}
        s["head"].update(tied=tied, bias=bias)  # final_logits_bias: a head bias where it is not zero
        return {**s, **vocab, "share_embeddings": shared}

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        return cls.common_rules(s)

    @staticmethod
    def sinusoids(s: FamilySpec, like: Tensor) -> Tensor:
        return sinusoid_table(s.max_seq_len, s.d_model, base=10000.0, layout="concat").to(like)

    @classmethod
    def check_from(cls, hf: nn.Module, s: FamilySpec, ref: dict[str, Tensor]) -> list[str]:
        """Tensors zoo holds no copy of, checked instead: the position tables and a zero logits bias."""
        handled = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
        for name in handled:
            t = ref[name]
            if t.device.type != "meta" and not torch.allclose(t.float(), cls.sinusoids(s, t).float(), atol=1e-6):
                raise ConversionError(f"MarianMTModel -> zoo: {name} is not the sinusoid table zoo computes "
                                      f"(max difference {(t.float() - cls.sinusoids(s, t).float()).abs().max().item():.3g})")
        return handled + cls.unread(s, ref)

    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        like = state["head.weight"]
        out = {f"model.{k}.embed_positions.weight": cls.sinusoids(s, like) for k in ("encoder", "decoder")}
        return out | cls.zero_bias(state, s, shapes)

    @staticmethod
    def prepare_to(state: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        """Interleaved sinusoids (the paper's layout) reach Marian's concat layout by permuting the
        model dimension everywhere: LayerNorm and attention do not depend on the order of the D axis,
        so the permuted model computes the same logits (and trains the same)."""
        if s.position.layout == "concat":
            return state
        return permute_model_dim(state, torch.cat([torch.arange(0, s.d_model, 2), torch.arange(1, s.d_model, 2)]))


_MODEL_AXES = (  # (name suffix, the axis of size d_model) for zoo encoder-decoder tensors; None: none
    ("emb.weight", 1), ("head.weight", 1), ("head.bias", None),
    ("attn.qkv.weight", 1), ("cross_attn.q.weight", 1), ("cross_attn.kv.weight", 1), ("ffn.fc1.weight", 1),
    ("attn.qkv.bias", None), ("cross_attn.q.bias", None), ("cross_attn.kv.bias", None), ("ffn.fc1.bias", None),
    ("attn.out.weight", 0), ("attn.out.bias", 0), ("ffn.fc2.weight", 0), ("ffn.fc2.bias", 0),
    ("_norm.weight", 0), ("_norm.bias", 0),
)


def permute_model_dim(state: dict[str, Tensor], perm: Tensor) -> dict[str, Tensor]:
    """A zoo encoder-decoder state dict with its d_model axis reordered by ``perm``."""
    out = {}
    for name, t in state.items():
        axis = next((a for suffix, a in _MODEL_AXES if name.endswith(suffix)), "unknown")
        if axis == "unknown":
            raise ConversionError(f"zoo -> MarianMTModel: no rule to reorder the model dimension of {name!r}")
        out[name] = t if axis is None else t.index_select(axis, perm.to(t.device))
    return out
