"""BART and mBART: HF ``BartForConditionalGeneration`` and ``MBartForConditionalGeneration`` <->
zoo encoder-decoders, exactly.

Random-init references at odd sizes (d_model 36, 3 heads, 2 encoder and 3 decoder layers, FFN 52,
a vocabulary of 89, 40 positions), every parameter random (the learned position tables, the
embedding LayerNorms, mBART's final norms) and ``final_logits_bias`` too. In fp32, eval mode:

- the variants beside the conformance table's tied BART and mBART (untied, scaled, ReLU, gelu-tanh),
  through its checks: logits within 1e-4 of HF's, unpadded and with a right-padded source and
  target, both ways, and every tensor equal after the round trip;
- zoo's cached greedy decoding and beam search give HF's ``generate`` tokens (and beam scores).
  BART starts the decoder with ``decoder_start_token_id`` = eos (2) and HF's generation config adds
  ``forced_bos_token_id`` / ``forced_eos_token_id`` (the releases force bos first and eos at the
  length limit). Both sides are set to plain decoding from token 2: HF with
  ``decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=None`` (mBART the same
  start), zoo with ``bos_id=2``; beams compared as tests/test_beam_hf.py does (``early_stopping="never"``,
  ``finish_from="beams"`` where there is an eos). The generation models are untied: a random model
  whose output projection is its input embedding repeats its last token, which would compare little.
- the ``bart-base`` preset is facebook/bart-base's config (the parameter count of the HF class on
  the meta device, the spec of the config and back), and ``bart-tiny`` converts to HF exactly.
"""

from __future__ import annotations

import pytest
import torch
from conformance_checks import check_config, check_outputs, check_round_trip
from conftest import max_diff, randomize

import zoo
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V, NEW, START = 89, 8, 2

CLASSES = {"bart": ("BartConfig", "BartForConditionalGeneration"), "mbart": ("MBartConfig", "MBartForConditionalGeneration")}
CASES = {  # (class, config fields)
    "bart, untied, scaled, relu": ("bart", {"tie_word_embeddings": False, "scale_embedding": True, "activation_function": "relu"}),
    "mbart, tied, gelu-tanh": ("mbart", {"activation_function": "gelu_new"}),
    "mbart, untied, scaled": ("mbart", {"tie_word_embeddings": False, "scale_embedding": True}),
}


def reference(kind: str, seed: int = 0, **kw) -> torch.nn.Module:
    config, model = CLASSES[kind]
    kw = {"vocab_size": V, "d_model": 36, "encoder_layers": 2, "decoder_layers": 3, "encoder_attention_heads": 3,
          "decoder_attention_heads": 3, "encoder_ffn_dim": 52, "decoder_ffn_dim": 52, "max_position_embeddings": 40, **kw}
    return randomize(getattr(transformers, model)(getattr(transformers, config)(**kw)), seed, buffers=("final_logits_bias",))


def padded(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, length - 3:] = False
    mask[2, 2:] = False
    return x, mask


def hf_logits(hf, src, src_mask, tgt, tgt_mask):
    return hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits


@pytest.mark.parametrize("case", CASES)
def test_variant_reads_its_options_and_converts_both_ways(case):
    """The spec says what the class does; then the conformance suite's checks (tests/conformance_checks.py):
    the same logits both ways, unpadded and with a right-padded source and target; every tensor back
    (apart, HF keeps a shared embedding no forward pass reads); the config written reads back."""
    kind, kw = CASES[case]
    hf = reference(kind, **kw)
    s, tied = from_hf(hf).spec, kw.get("tie_word_embeddings", True)
    assert (s.block.kind, s.position.offset, s.share_positions, s.embedding.norm) == (
        "post" if kind == "bart" else "pre", 2, False, True)
    assert s.head.bias and s.head.tied == s.share_embeddings == tied and s.embedding.scale == kw.get("scale_embedding", False)
    check_outputs(hf)
    check_round_trip(hf, unread=() if tied else ("model.shared.weight",))
    check_config(hf)


def hf_generate(hf, src, src_mask, *, beams: int, eos: int | None, penalty: float = 1.0):
    out = hf.generate(src, attention_mask=src_mask.long(), num_beams=beams, do_sample=False, max_new_tokens=NEW,
                      eos_token_id=eos, pad_token_id=1, decoder_start_token_id=START, forced_bos_token_id=None,
                      forced_eos_token_id=None, length_penalty=penalty, early_stopping="never", num_return_sequences=1,
                      return_dict_in_generate=True, output_scores=True)
    return out.sequences[:, 1:], getattr(out, "sequences_scores", None)  # after the start token


def rows(tokens: torch.Tensor, eos: int) -> list[list[int]]:
    return [row[: row.index(eos) + 1] if eos in row else row for row in tokens.tolist()]


@pytest.mark.parametrize("kind", CLASSES)
def test_greedy_and_beam_search_equal_hf_generate(kind):
    hf = reference(kind, seed=3, tie_word_embeddings=False)  # a seed whose BART does not repeat one token
    model = from_hf(hf)
    src, src_mask = padded(3, 7, seed=3)

    theirs, _ = hf_generate(hf, src, src_mask, beams=1, eos=None)
    ours = zoo.generate(model, src, padding_mask=src_mask, num_beams=1, bos_id=START, max_new_tokens=NEW)
    assert theirs.shape == (3, NEW) and torch.equal(ours.tokens, theirs)
    assert len(set(theirs.flatten().tolist())) > 3  # not one token repeated

    theirs, their_scores = hf_generate(hf, src, src_mask, beams=4, eos=None)
    ours = zoo.generate(model, src, padding_mask=src_mask, num_beams=4, bos_id=START, max_new_tokens=NEW,
                        length_norm="power", alpha=1.0)
    assert torch.equal(ours.tokens, theirs)
    torch.testing.assert_close(ours.scores, their_scores, atol=1e-4, rtol=1e-5)

    eos = int(theirs[0, 2])  # a token the beams produce: hypotheses now stop at different lengths
    theirs, their_scores = hf_generate(hf, src, src_mask, beams=4, eos=eos, penalty=0.0)  # no length penalty
    ours = zoo.generate(model, src, padding_mask=src_mask, num_beams=4, bos_id=START, eos_id=eos, max_new_tokens=NEW,
                        length_norm="none", finish_from="beams")
    assert rows(ours.tokens, eos) == rows(theirs, eos)
    torch.testing.assert_close(ours.scores, their_scores, atol=1e-4, rtol=1e-5)
    assert any(row[-1] == eos for row in rows(theirs, eos))  # a stopped hypothesis wins somewhere


# ------------------------------------------------------------------------------------ presets
BART_BASE = {  # facebook/bart-base's config.json, its architecture fields
    "vocab_size": 50265, "d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
    "decoder_attention_heads": 12, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "max_position_embeddings": 1024,
    "activation_function": "gelu", "dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1, "init_std": 0.02,
    "scale_embedding": False, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "tie_word_embeddings": True,
    "normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": True, "add_bias_logits": False,
    "static_position_embeddings": False, "architectures": ["BartModel"],
}
NOT_SPEC = {"architectures", "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_eos_token_id",
            "normalize_before", "add_final_layer_norm", "normalize_embedding", "add_bias_logits", "static_position_embeddings"}


def test_bart_base_preset_is_the_release_config():
    config = transformers.BartConfig(**BART_BASE)
    with torch.device("meta"):
        ref = transformers.BartForConditionalGeneration(config)
    model = zoo.build("bart-base", device="meta")
    assert zoo.count_parameters(model) == sum(p.numel() for p in ref.parameters()) == 139_420_416
    assert model.spec.model_dump(exclude={"name"}) == hf_spec(config).model_dump(exclude={"name"})
    back = hf_config(model.spec).to_dict()
    assert {k: v for k, v in back.items() if k not in NOT_SPEC} == \
        {k: v for k, v in config.to_dict().items() if k not in NOT_SPEC}


def test_bart_tiny_converts_to_hf_exactly():
    model = randomize(zoo.build("bart-tiny", seed=0))
    hf = to_hf(model).eval()
    assert type(hf).__name__ == "BartForConditionalGeneration"
    assert hf_spec(hf.config).model_dump(exclude={"name"}) == model.spec.model_dump(exclude={"name"})
    src, src_mask = padded(3, 30, seed=6)
    tgt, tgt_mask = padded(3, 20, seed=7)
    src, tgt = src * 91 % 8192, tgt * 89 % 8192  # ids across the 8k vocabulary
    with torch.no_grad():
        out = model(src, tgt, src_mask, tgt_mask)
        assert out.abs().max() > 1.0  # O(1) logits: the tolerance below is a real test
        tol = max(ATOL, 2e-5 * out.abs().max().item())  # fp32 rounding grows with the logits (~11 here), as in test_presets_hf
        assert max_diff(hf_logits(hf, src, src_mask, tgt, tgt_mask), out, tgt_mask) < tol


def test_tying_the_head_without_sharing_is_refused_by_name():
    hf = reference("bart")
    hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())  # untie the head only
    with pytest.raises(ConversionError, match="tie_word_embeddings"):
        from_hf(hf)
