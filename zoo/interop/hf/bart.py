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
from zoo.interop.hf.base import weights
from zoo.interop.hf.seq2seq import SEQ2SEQ_CLAIMS, Seq2Seq, seq2seq
from zoo.interop.hf.table import Check, Field, Fixed, Refuse, Tokens, table
from zoo.spec import FamilySpec

__all__ = ["Bart", "MBart"]

OFFSET = 2  # BartLearnedPositionalEmbedding: position p reads row p + 2


def bart(name: str, kind: str, fairseq: dict[str, object], tokens: dict[str, int | None]) -> tuple:
    """BART's table (``name``'s, its blocks ``kind``): :func:`~zoo.interop.hf.seq2seq.seq2seq`'s
    entries, fairseq's options HF's class does not read held at the values that mean what it
    computes (``fairseq``), one vocabulary, an embedding norm, learned positions from row 2 in each
    stack, the head tied exactly when the embeddings are shared, the token ids ``tokens``."""
    blocks = f"{name} does not read it: its blocks are {kind}-norm" + (" with a final LayerNorm in each stack" if kind == "pre" else "")
    return table(
        *(Refuse(field, want, blocks, write=False) for field, want in fairseq.items()),
        Refuse("normalize_embedding", True, f"{name} always has a LayerNorm on the embedding sum", write=False),
        Refuse("static_position_embeddings", False, f"{name}'s positions are learned tables", write=False),
        Refuse("add_bias_logits", False, f"{name}'s logits bias is final_logits_bias, no bias on lm_head", write=False),
        seq2seq(kind), Field("vocab_size", "vocab_size"),
        Fixed("embedding.norm", True), Fixed("head.kind", "lm"),
        Fixed("position.kind", "learned"), Fixed("position.offset", OFFSET), Fixed("share_positions", False),
        Check("src_vocab_size", lambda s: s.src_vocab_size == s.vocab_size,
              lambda s: f"{name} has one vocabulary (vocab_size {s.vocab_size}) for source and target"),
        Check("head.tied", lambda s: s.head.tied == s.share_embeddings,
              lambda s: f"{name} ties the output projection exactly when source and target share their embeddings "
                        f"(share_embeddings is {s.share_embeddings}); set head.tied: {str(s.share_embeddings).lower()}"),
        Tokens(tokens),
    )


class Bart(Seq2Seq):
    name = "BartForConditionalGeneration"
    config_name = "BartConfig"
    model_type = "bart"
    claims: ClassVar[Claims] = {
        **SEQ2SEQ_CLAIMS, "src_vocab_size": ANY, "block.kind": one_of("post"), "embedding.norm": one_of(True),
        "position.kind": one_of("learned"), "position.offset": one_of(OFFSET), "share_positions": one_of(False),
    }
    table = bart(name, "post", {"normalize_before": False, "add_final_layer_norm": False},
                 {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2})

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        s = super().spec(c, None)
        if hf is None:
            shared = tied = c.tie_word_embeddings
            bias = False
        else:
            shared, tied, bias = cls.read_ties(hf)
            if shared != tied:
                raise unsupported(f"{cls.name} -> zoo", "tie_word_embeddings", "the source embedding tied but not the head"
                                  if shared else "the head tied but not the source embedding",
                                  f"{cls.name} ties its embeddings and output projection all together or none")
        s["head"].update(tied=tied, bias=bias)  # final_logits_bias: a head bias where it is not zero
        return {**s, "share_embeddings": shared}

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        rules = cls.common_rules(s)
        for zoo_stack, stack in (("src", "encoder"), ("tgt", "decoder")):
            position = "src_position" if stack == "encoder" else "position"
            rules += [rule(f"{position}.weight", f"model.{stack}.embed_positions.weight"),
                      *weights(f"{zoo_stack}_emb_norm", f"model.{stack}.layernorm_embedding")]
            if s.block.kind == "pre":
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
    claims: ClassVar[Claims] = {**Bart.claims, "block.kind": one_of("pre")}
    table = bart(name, "pre", {"normalize_before": True, "add_final_layer_norm": True},
                 {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2})
