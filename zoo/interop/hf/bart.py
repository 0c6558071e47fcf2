"""BART and mBART: ``BartForConditionalGeneration`` / ``MBartForConditionalGeneration`` <-> a zoo
encoder-decoder.

Both have a learned position table in the encoder and another in the decoder, each
``max_position_embeddings + 2`` rows read from row 2 (``position: {kind: learned, offset: 2}``,
``share_positions: false``), a LayerNorm on the embedding sum in each stack (``layernorm_embedding``:
``embedding.norm``), optionally scaled embeddings, MHA with biases, a two-layer FFN (GELU in the
releases), ``final_logits_bias`` (a head bias where it is not all zeros) and one vocabulary, its
embeddings and output projection tied or all apart (``tie_word_embeddings``). BART's blocks are
Post-Norm; mBART's are Pre-Norm with a final LayerNorm in each stack (``layer_norm``).

Configs written for fairseq's options that HF's classes no longer read (``normalize_before``,
``add_final_layer_norm``, ``normalize_embedding``, ``static_position_embeddings``,
``add_bias_logits``) are refused where they ask for other arithmetic than the class computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import refuse_config, require, token_ids, weights
from zoo.interop.hf.seq2seq import SEQ2SEQ_CLAIMS, Seq2Seq
from zoo.spec import FamilySpec

__all__ = ["Bart", "MBart"]

OFFSET = 2  # BartLearnedPositionalEmbedding: position p reads row p + 2


class Bart(Seq2Seq):
    name = "BartForConditionalGeneration"
    config_name = "BartConfig"
    model_type = "bart"
    block_kind = "post"
    claims: ClassVar[Claims] = {
        **SEQ2SEQ_CLAIMS, "src_vocab_size": ANY, "block.kind": one_of("post"), "embedding.norm": one_of(True),
        "position.kind": one_of("learned"), "position.offset": one_of(OFFSET), "share_positions": one_of(False),
    }
    # config fields of fairseq's options HF's class does not read: the values that mean what it computes
    fairseq: ClassVar[dict[str, object]] = {"normalize_before": False, "add_final_layer_norm": False}
    token_defaults: ClassVar[dict[str, int | None]] = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
                                                       "decoder_start_token_id": 2}

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        where = f"{cls.name} -> zoo"
        refuse_config(c, where, {
            **{field: (want, f"{cls.name} does not read it: its blocks are {cls.block_kind}-norm"
                       + (" with a final LayerNorm in each stack" if cls.block_kind == "pre" else ""))
               for field, want in cls.fairseq.items()},
            "normalize_embedding": (True, f"{cls.name} always has a LayerNorm on the embedding sum"),
            "static_position_embeddings": (False, f"{cls.name}'s positions are learned tables"),
            "add_bias_logits": (False, f"{cls.name}'s logits bias is final_logits_bias, no bias on lm_head"),
        })
        if hf is None:
            shared = tied = c.tie_word_embeddings
            bias = False
        else:
            shared, tied, bias = cls.read_ties(hf)
            if shared != tied:
                raise unsupported(where, "tie_word_embeddings", "the source embedding tied but not the head" if shared else
                                  "the head tied but not the source embedding",
                                  f"{cls.name} ties its embeddings and output projection all together or none")
        return {
            **cls.common_spec(c), "vocab_size": c.vocab_size, "share_embeddings": shared,
            "embedding": {"scale": c.scale_embedding, "norm": True},
            "head": {"kind": "lm", "tied": tied, "bias": bias},  # final_logits_bias: a head bias where it is not zero
            "position": {"kind": "learned", "offset": OFFSET}, "share_positions": False,
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = f"zoo -> {cls.name}"
        pos = s.position
        require(pos.kind == "learned" and pos.offset == OFFSET, where, "position", pos.model_dump(),
                f"{cls.name} has learned positions read from row {OFFSET} (position: {{kind: learned, offset: {OFFSET}}})")
        require(not s.share_positions, where, "share_positions", True,
                f"{cls.name}'s encoder and decoder each have their own position table; set share_positions: false")
        require(s.embedding.norm, where, "embedding.norm", False, f"{cls.name} has a LayerNorm on the embedding sum")
        require(s.src_vocab_size == s.vocab_size, where, "src_vocab_size", s.src_vocab_size,
                f"{cls.name} has one vocabulary (vocab_size {s.vocab_size}) for source and target")
        require(s.head.tied == s.share_embeddings, where, "head.tied", s.head.tied,
                f"{cls.name} ties the output projection exactly when source and target share their embeddings "
                f"(share_embeddings is {s.share_embeddings}); set head.tied: {str(s.share_embeddings).lower()}")
        c = {**cls.common_config(s), "vocab_size": s.vocab_size}
        token_ids(c, s.vocab_size, cls.token_defaults, given)
        return c

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        rules = cls.common_rules(s)
        for zoo_stack, stack in (("src", "encoder"), ("tgt", "decoder")):
            position = "src_position" if stack == "encoder" else "position"
            rules += [rule(f"{position}.weight", f"model.{stack}.embed_positions.weight"),
                      *weights(f"{zoo_stack}_emb_norm", f"model.{stack}.layernorm_embedding")]
            if cls.block_kind == "pre":
                rules += weights(f"{stack}.norm", f"model.{stack}.layer_norm")
        return rules


    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        """A zero logits bias where zoo's head has none, and for embeddings apart ``model.shared``,
        which no forward pass then reads: a copy of the source embedding (HF's input embedding)."""
        out = cls.zero_bias(state, s, shapes)
        return out if s.share_embeddings else out | {"model.shared.weight": state["src_emb.weight"]}


class MBart(Bart):
    name = "MBartForConditionalGeneration"
    config_name = "MBartConfig"
    model_type = "mbart"
    block_kind = "pre"
    claims: ClassVar[Claims] = {**Bart.claims, "block.kind": one_of("pre")}
    fairseq: ClassVar[dict[str, object]] = {"normalize_before": True, "add_final_layer_norm": True}
    token_defaults: ClassVar[dict[str, int | None]] = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
