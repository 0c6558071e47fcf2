"""M2M100 and NLLB-200: ``M2M100ForConditionalGeneration`` / ``M2M100Model`` <-> a zoo encoder-decoder.

The layout of fairseq's multilingual translators (M2M-100, NLLB-200 and its distilled releases):
Pre-Norm blocks with a final LayerNorm in each stack (``layer_norm``), MHA with biases, a
two-layer FFN (ReLU in the releases), token embeddings scaled by sqrt(d_model) (``scale_embedding``)
and no norm on the embedding sum, one vocabulary whose embeddings and output projection are tied
all together or not at all (``tie_word_embeddings``), no logits bias. The positions are fairseq's
sinusoids (``M2M100SinusoidalPositionalEmbedding``): sines then cosines at the frequencies
10000^(-i/(D/2-1)), position p reading row p + pad_token_id + 1 and padding the zero row
pad_token_id (``position: {kind: sinusoidal, layout: concat, spacing: fairseq, padding_idx: ...}``);
the table is a buffer no checkpoint holds.

HF numbers positions from the token ids: in a full pass it counts the tokens that are not
``pad_token_id``, in cached decoding it counts every earlier token. zoo counts the tokens the
padding mask keeps, in both, and gives padding (the mask's, and any token whose id is the padding
id) the zero row: the same wherever the padding ids are where the mask says, and in cached
decoding always. HF grows its table past ``max_position_embeddings``; zoo refuses longer sequences.

LayerDrop (``encoder_layerdrop``, ``decoder_layerdrop``; 0.05 in M2M100's config, 0 in NLLB's)
is refused: zoo runs every layer in training. NLLB-MoE (``NllbMoeForConditionalGeneration``) is
another class and does not convert.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, unsupported
from zoo.interop.hf.base import Headless, require, weights
from zoo.interop.hf.seq2seq import SEQ2SEQ_CLAIMS, Seq2Seq, seq2seq
from zoo.interop.hf.table import Check, Derived, Field, Fixed, Refuse, Tokens, table
from zoo.interop.hf.traits import who
from zoo.spec import FamilySpec, LMHeadSpec

__all__ = ["M2M100", "M2M100Backbone"]

_POSITION = {"kind": "sinusoidal", "base": 10000.0, "layout": "concat", "spacing": "fairseq"}


def _positions(c: Any, where: str) -> dict:
    pad = c.pad_token_id
    require(pad is not None and pad >= 0, where, "pad_token_id", pad,
            "its positions start past the padding token's id (pad_token_id), so it needs one")
    return {"max_seq_len": c.max_position_embeddings, "position": {**_POSITION, "padding_idx": pad}}


def _write_positions(s: FamilySpec, where: str) -> dict:
    pad = getattr(s.position, "padding_idx", None)
    require(pad is not None, where, "position.padding_idx", None,
            f"{who(where)}'s positions start past the padding token's id (pad_token_id); set position.padding_idx (1)")
    require(pad < s.vocab_size, where, "position.padding_idx", pad,
            f"it is the padding token's id (pad_token_id), so below vocab_size ({s.vocab_size})")
    return {"max_position_embeddings": s.max_seq_len, "pad_token_id": pad}


def _layerdrop(field: str) -> Refuse:
    return Refuse(field, 0.0, "zoo has no layer drop: every layer runs in training; set it to 0", falsy=True)


class M2M100(Seq2Seq):
    name = "M2M100ForConditionalGeneration"
    config_name = "M2M100Config"
    model_type = "m2m_100"
    base = "M2M100Model"
    prefix = "model"
    claims: ClassVar[Claims] = {
        **SEQ2SEQ_CLAIMS, "src_vocab_size": ANY, "block.kind": one_of("pre"), "embedding.norm": one_of(False),
        "head.bias": one_of(False), "position.kind": one_of("sinusoidal"), "position.base": one_of(10000.0),
        "position.layout": one_of("concat"), "position.spacing": one_of("fairseq"), "position.padding_idx": ANY,
    }
    table = table(
        seq2seq("pre"), _layerdrop("encoder_layerdrop"), _layerdrop("decoder_layerdrop"),
        Refuse("num_experts", None, "NLLB-MoE's experts are NllbMoeForConditionalGeneration's, which does not convert",
               write=False, falsy=True),
        Field("vocab_size", "vocab_size"), Fixed("embedding.norm", False), Fixed("head.kind", "lm"),
        Derived("positions", _positions, _write_positions),
        Check("src_vocab_size", lambda s: s.src_vocab_size == s.vocab_size,
              lambda s: f"M2M100 has one vocabulary (vocab_size {s.vocab_size}) for source and target"),
        Check("head.tied", lambda s: s.head.tied == s.share_embeddings,
              lambda s: f"M2M100 ties the output projection exactly when source and target share their embeddings "
                        f"(share_embeddings is {s.share_embeddings}); set head.tied: {str(s.share_embeddings).lower()}"),
        Tokens({"bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}),
    )

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        s = super().spec(c, None)
        if hf is None:
            shared = c.tie_word_embeddings
        else:
            emb = hf.model.decoder.embed_tokens.weight
            shared, tied = hf.model.encoder.embed_tokens.weight is emb, hf.lm_head.weight is emb
            if shared != tied:
                raise unsupported(f"{cls.name} -> zoo", "tie_word_embeddings", "the source embedding tied but not the head"
                                  if shared else "the head tied but not the source embedding",
                                  f"{cls.name} ties its embeddings and output projection all together or none")
        s["head"].update(tied=shared, bias=False)
        return {**s, "share_embeddings": shared}

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        pad = getattr(s.position, "padding_idx", None)
        require(pad is None or given.get("pad_token_id", pad) == pad, f"zoo -> {cls.name}", "pad_token_id",
                given.get("pad_token_id"), f"the padding token's id is position.padding_idx ({pad}): its positions follow from it")
        return super().config(s, given)

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        rules = [r for r in cls.common_rules(s) if r.ref != ("final_logits_bias",)]
        for stack in ("encoder", "decoder"):
            rules += weights(f"{stack}.norm", f"model.{stack}.layer_norm")
        return rules

    @classmethod
    def shared_name(cls) -> str:
        """The name of HF's ``shared`` embedding in this class's state dict."""
        return "model.shared.weight"

    @classmethod
    def check_from(cls, hf: nn.Module, s: FamilySpec, ref: Mapping[str, Tensor]) -> list[str]:
        """``shared``, which the forward pass does not read where the embeddings are apart."""
        return [cls.shared_name()] if not s.share_embeddings and cls.shared_name() in ref else []

    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        """For embeddings apart, ``shared`` (which no forward pass then reads): a copy of the source embedding."""
        return {} if s.share_embeddings else {cls.shared_name(): state["src_emb.weight"]}

    @classmethod
    def headless(cls) -> type:
        return M2M100Backbone


class M2M100Backbone(Headless, M2M100):
    """M2M100Model: M2M100ForConditionalGeneration's backbone, without its head (:class:`Headless`).
    Its ``tie_word_embeddings`` still says whether the source and target embeddings are one."""

    name = "M2M100Model"
    lm = M2M100
    base = None
    claims: ClassVar[Claims] = {**{p: c for p, c in M2M100.claims.items() if p.split(".")[0] != "head"},
                                "head.kind": one_of("none")}

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        return M2M100.config(s.model_copy(update={"head": LMHeadSpec(tied=s.share_embeddings)}), given)

    @classmethod
    def shared_name(cls) -> str:
        return "shared.weight"

    @classmethod
    def headless(cls) -> type:
        raise TypeError(f"{cls.name} names no backbone class (base)")
