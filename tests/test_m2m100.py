"""M2M100 and NLLB-200: fairseq's sinusoidal positions against HF's module, and
``M2M100ForConditionalGeneration`` <-> zoo beyond the conformance table's checks.

- the table of ``position: {kind: sinusoidal, spacing: fairseq, padding_idx: p}`` is HF's
  ``M2M100SinusoidalPositionalEmbedding.get_embedding`` bit for bit (even and odd widths, several
  padding indices), and what a model adds for a padded batch, or for one token after k cached ones
  (a padding id among them), is what HF's module adds;
- a left-padded source and target (padding ids where the mask is false) give HF's logits at real
  tokens; cached decoding through a target holding the padding id gives HF's cached logits step by
  step; a decoder with these positions decodes through its cache as its full pass computes;
- the ``nllb-200-distilled-600m`` and ``m2m100-418m`` presets are the releases' configs (the HF
  class's parameter count on the meta device, the spec of the config and back), ``m2m100-tiny``
  converts to HF with the same logits and greedy decoding;
- what zoo cannot express is refused naming the field: layer drop, a config without a padding id,
  NLLB-MoE's experts, another spacing or layout of the sinusoids, a pad_token_id off the padding index.
"""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, randomize

import zoo
from zoo.components.position import SinusoidalPosition
from zoo.components.stack import positions_for
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf

transformers = pytest.importorskip("transformers")
m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V = 61
FIELDS = dict(vocab_size=V, max_position_embeddings=40, d_model=36, encoder_layers=2, decoder_layers=3,
              encoder_attention_heads=3, decoder_attention_heads=3, encoder_ffn_dim=52, decoder_ffn_dim=52,
              encoder_layerdrop=0.0, decoder_layerdrop=0.0)


def reference(seed: int = 0, **kw) -> torch.nn.Module:
    config = transformers.M2M100Config(**{**FIELDS, **kw})
    return randomize(transformers.M2M100ForConditionalGeneration(config), seed)


def padded(batch: int, length: int, side: str, pad: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens above the special ids, padded on ``side`` with the padding id (rows 1 and 2 short)."""
    x = torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, length - 3:], mask[2, 2:] = False, False
    mask = mask if side == "right" else mask.flip(1)
    return x.masked_fill(~mask, pad), mask


# ------------------------------------------------------------------------------------------ the table
@pytest.mark.parametrize("dim,pad", [(24, 1), (25, 0), (64, 5)])
def test_fairseq_table_is_hf_modules(dim, pad):
    ours = SinusoidalPosition(dim, 30, layout="concat", spacing="fairseq", padding_idx=pad)
    theirs = m2m.M2M100SinusoidalPositionalEmbedding.get_embedding(30 + pad + 1, dim, pad)
    assert ours.max_len == 30 and torch.equal(ours.weight, theirs)
    ours.weight.zero_()
    ours.reset_buffers()  # as zoo.load recomputes it after building on the meta device
    assert torch.equal(ours.weight, theirs)


@pytest.mark.parametrize("side", ["right", "left"])
def test_added_positions_are_hf_modules_padded_and_cached(side):
    pad, dim = 1, 24
    ours = SinusoidalPosition(dim, 16, layout="concat", spacing="fairseq", padding_idx=pad)
    theirs = m2m.M2M100SinusoidalPositionalEmbedding(16, dim, pad)
    ids, mask = padded(3, 9, side, pad, seed=1)
    zero = torch.zeros(3, 9, dim)
    added = ours.add(zero, ours.added_positions(positions_for(mask, 9, ids.device), mask, ids))
    assert torch.equal(added, theirs(ids))
    # one new token after k cached ones (decoding): row k + pad + 1, the padding id's row zero
    for k, token in ((0, 7), (4, 9), (5, pad), (6, 11)):
        step = torch.tensor([[token]])
        assert torch.equal(ours.add(torch.zeros(1, 1, dim), ours.added_positions(torch.tensor([k]), None, step)),
                           theirs(step, cache_length=k))


# ------------------------------------------------------------------------------------------ the model
@pytest.mark.parametrize("tie", [True, False])
def test_left_padded_source_and_target_give_hf_logits(tie):
    ref = reference(tie_word_embeddings=tie)
    model = from_hf(ref)
    assert model.spec.position.padding_idx == 1 and model.spec.share_embeddings == tie
    src, src_mask = padded(3, 11, "left", 1, seed=2)
    tgt, tgt_mask = padded(3, 7, "left", 1, seed=3)
    with torch.no_grad():
        theirs = ref(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt,
                     decoder_attention_mask=tgt_mask.long()).logits
        assert max_diff(model(src, tgt, src_mask, tgt_mask), theirs, tgt_mask) < ATOL
        back = to_hf(model).eval()
        assert max_diff(back(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt,
                             decoder_attention_mask=tgt_mask.long()).logits, theirs, tgt_mask) < ATOL


def test_cached_decoding_through_a_padding_id_gives_hf_cached_logits():
    """HF numbers a decoding step by the cache's length and gives a padding id the zero row; so does zoo."""
    ref = reference(seed=1, tie_word_embeddings=False)
    model = from_hf(ref)
    src, src_mask = padded(3, 9, "right", 1, seed=4)
    tgt = torch.randint(3, V, (3, 6), generator=torch.Generator().manual_seed(5))
    tgt[:, 0], tgt[:, 3] = 2, 1  # the start token, then the padding id at step 3
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = model.new_cache(8)
        enc = ref.model.encoder(input_ids=src, attention_mask=src_mask.long())
        past = None
        for t in range(tgt.shape[1]):
            out = ref(encoder_outputs=enc, attention_mask=src_mask.long(), decoder_input_ids=tgt[:, t:t + 1],
                      cache=past, use_cache=True)
            past = out.cache
            ours = model.decode(tgt[:, t:t + 1], memory, src_padding_mask=src_mask, cache=cache)
            assert max_diff(ours, out.logits) < ATOL, f"step {t}"


@pytest.mark.parametrize("position", [{"kind": "sinusoidal", "layout": "concat", "spacing": "fairseq", "padding_idx": 0},
                                      {"kind": "learned", "padding_idx": 0}])
def test_a_decoder_with_fairseq_positions_decodes_as_its_full_pass(position):
    spec = {"family": "decoder", "vocab_size": V, "d_model": 32, "n_layers": 2, "max_seq_len": 24,
            "block": {"attention": {"kind": "mha", "n_heads": 4}}, "position": position}
    model = zoo.build(spec, seed=0).eval()
    tokens, mask = padded(3, 10, "left", 0, seed=6)
    with torch.no_grad():
        full = model(tokens, mask)
        cache = model.new_cache(16)
        steps = [model(tokens[:, :6], mask[:, :6], cache)]
        steps += [model(tokens[:, t:t + 1], mask[:, t:t + 1], cache) for t in range(6, 10)]
        assert max_diff(torch.cat(steps, dim=1), full, mask) < 1e-5
        unpadded = model(tokens[:1], None)  # row 0 is whole: padding moves no position of another row
        assert max_diff(full[:1], unpadded) < 1e-5


# ------------------------------------------------------------------------------------------ presets
RELEASES = {  # config.json of each release, its architecture fields
    "nllb-200-distilled-600m": (615_073_792, {"vocab_size": 256206, "encoder_layerdrop": 0, "decoder_layerdrop": 0}),
    # M2M-100 trains with layer drop 0.05, which zoo refuses: the preset is the release without it
    "m2m100-418m": (483_905_536, {"vocab_size": 128112, "encoder_layerdrop": 0, "decoder_layerdrop": 0}),
}
COMMON = {"d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
          "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "max_position_embeddings": 1024,
          "activation_function": "relu", "dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.0,
          "init_std": 0.02, "scale_embedding": True, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
          "decoder_start_token_id": 2, "tie_word_embeddings": True}


@pytest.mark.parametrize("name", RELEASES)
def test_presets_are_the_release_configs(name):
    count, fields = RELEASES[name]
    config = transformers.M2M100Config(**COMMON, **fields)
    with torch.device("meta"):
        ref = transformers.M2M100ForConditionalGeneration(config)
    model = zoo.build(name, device="meta")
    assert zoo.count_parameters(model) == sum(p.numel() for p in ref.parameters()) == count
    assert model.head.weight is model.tgt_emb.weight and model.src_emb is model.tgt_emb
    assert model.spec.model_dump(exclude={"name"}) == hf_spec(config).model_dump(exclude={"name"})
    back, theirs = hf_config(model.spec).to_dict(), config.to_dict()
    assert {k: back[k] for k in [*COMMON, *fields]} == {k: theirs[k] for k in [*COMMON, *fields]}


def test_tiny_preset_converts_to_hf_and_decodes_the_same():
    model = randomize(zoo.build("m2m100-tiny", ["vocab_size=97", "n_layers=2"], seed=0))
    hf = to_hf(model).eval()
    assert type(hf).__name__ == "M2M100ForConditionalGeneration" and hf.config.pad_token_id == 0
    src, mask = padded(3, 12, "right", 0, seed=7)
    tgt = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert max_diff(model(src, tgt, mask), hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits) < ATOL
    ours = zoo.generate(model, src, padding_mask=mask, num_beams=1, max_new_tokens=8, bos_id=2).tokens
    theirs = hf.generate(src, attention_mask=mask.long(), max_new_tokens=8, do_sample=False, eos_token_id=None,
                         pad_token_id=0, decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=None)
    assert torch.equal(ours, theirs[:, 1:])


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("fields,named", [
    ({"encoder_layerdrop": 0.05}, "encoder_layerdrop"), ({"decoder_layerdrop": 0.1}, "decoder_layerdrop"),
    ({"pad_token_id": None}, "pad_token_id"), ({"num_experts": 4}, "num_experts"),
])
def test_configs_zoo_cannot_express_are_refused_by_name(fields, named):
    with pytest.raises(ConversionError, match=named):
        hf_spec(transformers.M2M100Config(**{**FIELDS, **fields}))


def test_nllb_moe_does_not_convert():
    config = transformers.NllbMoeConfig(vocab_size=V, d_model=24, encoder_layers=1, decoder_layers=1)
    with pytest.raises(ConversionError, match="nllb-moe"):
        hf_spec(config)


def test_specs_m2m100_cannot_express_are_refused_by_name():
    spec = zoo.load_spec("m2m100-tiny")
    for override, named in (("position.spacing=paper", "position.spacing"), ("position.layout=interleaved", "position.layout"),
                            ("share_embeddings=false", "head.tied"), ("block.kind=post", "block.kind")):
        with pytest.raises(ConversionError, match=named):
            hf_config(zoo.load_spec("m2m100-tiny", [override]), "M2M100ForConditionalGeneration")
    with pytest.raises(ConversionError, match="pad_token_id"):
        hf_config(spec, "M2M100ForConditionalGeneration", pad_token_id=3)
    with pytest.raises(ConversionError, match="position.spacing"):  # Marian's sinusoids are the paper's
        hf_config(zoo.load_spec("m2m100-tiny", ["block.kind=post"]), "MarianMTModel")
