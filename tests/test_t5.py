"""T5 (``T5ForConditionalGeneration``) both ways, against random-init HF models with odd sizes: 36 wide,
3 heads of d_kv 10 (30 != 36), 8 buckets saturating at distance 20 on sequences of 27 and 25, a
right-padded source. v1.0 (ReLU, the head tied and its input scaled) and v1.1 / Flan-T5 (gated GELU,
tanh approximation, an untied head). The relative-bias tables are drawn 10x wider than the other
weights so a wrong bucket shows in the logits."""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, randomize
from torch import nn

import zoo
from zoo.components.position import relative_buckets
from zoo.interop import ConversionError, from_hf, to_hf

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
V, ATOL = 90, 1e-4
T5 = {
    "v1.0: relu, tied and scaled head": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1.1: gated gelu, untied head": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def reference(layers: tuple[int, int] = (2, 3), seed: int = 0, **kw) -> nn.Module:
    kw = {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 20, **kw}
    config = transformers.T5Config(vocab_size=V, d_model=36, d_kv=10, d_ff=44, num_layers=layers[0],
                                   num_decoder_layers=layers[1], num_heads=3, dropout_rate=0.0, decoder_start_token_id=0, **kw)
    hf = randomize(transformers.T5ForConditionalGeneration(config), seed)
    if not config.scale_decoder_outputs:  # as from_pretrained leaves a v1.1 checkpoint: transformers 5 ties at construction
        hf.lm_head.weight = nn.Parameter(torch.randn(V, 36, generator=torch.Generator().manual_seed(seed + 1)) * 0.2)
    with torch.no_grad():
        for stack in (hf.encoder, hf.decoder):
            stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(10)
    return hf


def source(batch: int = 3, length: int = 27, seed: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(2, V, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[1, length - 6:] = False
    mask[-1, 9:] = False
    return src, mask


def logits(hf: nn.Module, src: torch.Tensor, mask: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    return hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits


def test_buckets_are_t5s():
    """Every distance from -60 to 60, both directions, against HF's own bucketing function."""
    relative = torch.arange(-60, 61)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20), (6, 7)):
            theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
                relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance)
            ours = relative_buckets(relative, num_buckets=buckets, max_distance=distance, bidirectional=bidirectional)
            assert torch.equal(ours, theirs), (bidirectional, buckets, distance)


@pytest.mark.parametrize("name", T5)
def test_t5_both_ways_and_through_a_zoo_file(name, tmp_path):
    hf = reference(**T5[name])
    model = from_hf(hf)
    s = model.spec
    assert s.position.kind == "relative_bias" and s.block.attention.scale_dim == 1
    assert (s.head.tied, s.head.scale_input) == ((True, True) if "v1.0" in name else (False, False))
    assert [p.bidirectional for p in (model.encoder.positions[0], model.decoder.positions[0])] == [True, False]
    src, mask = source()
    tgt = torch.randint(2, V, (3, 25), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(src, tgt, mask)
        assert max_diff(out, logits(hf, src, mask, tgt)) < ATOL
        back = to_hf(model).eval()
        assert max_diff(logits(back, src, mask, tgt), out) < ATOL
        zoo.save(model, tmp_path / "t5.safetensors")
        assert torch.equal(zoo.load(tmp_path / "t5.safetensors")(src, tgt, mask), out)
    assert (back.lm_head.weight is back.shared.weight) == s.head.tied
    ours, theirs = hf.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_t5_greedy_and_beam_search_equal_hfs_through_the_cache():
    """Flan-T5's layout with 8 buckets saturating at distance 6, so 10 new tokens reach past it
    through zoo's KV cache and HF's: greedy, then beam search (4 beams, HF's length penalty 0.6, an
    eos greedy produces, zoo finishing from the beams as HF) give HF's tokens and scores. HF's
    decoder cache is sized by the encoder's layers, so here the encoder is the deeper stack."""
    hf = reference((3, 2), relative_attention_max_distance=6, **T5["v1.1: gated gelu, untied head"])
    model = from_hf(hf)
    src, mask = source(2, 13)
    hf_kw = dict(attention_mask=mask.long(), do_sample=False, max_new_tokens=10, pad_token_id=0)
    theirs = hf.generate(src, num_beams=1, eos_token_id=None, **hf_kw)[:, 1:]  # after the start token (pad, 0)
    ours = zoo.generate(model, src, padding_mask=mask, num_beams=1, max_new_tokens=10, bos_id=0)
    assert torch.equal(ours.tokens, theirs)
    eos = int(theirs[0, 3])
    out = hf.generate(src, num_beams=4, eos_token_id=eos, length_penalty=0.6, early_stopping="never",
                      return_dict_in_generate=True, output_scores=True, **hf_kw)
    beams = zoo.generate(model, src, padding_mask=mask, num_beams=4, max_new_tokens=10, bos_id=0, eos_id=eos,
                         length_norm="power", alpha=0.6, finish_from="beams")
    got = [row[: row.index(eos) + 1] if eos in row else row for row in beams.tokens.tolist()]
    assert got == [row[: row.index(eos) + 1] if eos in row else row for row in out.sequences[:, 1:].tolist()]
    torch.testing.assert_close(beams.scores, out.sequences_scores, atol=1e-4, rtol=1e-5)


def test_cached_bias_equals_the_full_pass():
    """Decoding one token at a time, each step's bias (its query position past the cache start) is
    the full pass's row: the logits agree with the uncached decoder, past the last bucket."""
    model = from_hf(reference())
    src, mask = source()
    tgt = torch.randint(2, V, (3, 25), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = model.decode(tgt, memory, mask)
        cache = model.new_cache(25)
        steps = [model.decode(tgt[:, :7], memory, mask, cache=cache)]
        steps += [model.decode(tgt[:, t:t + 1], memory, mask, cache=cache) for t in range(7, 25)]
    assert max_diff(torch.cat(steps, 1), full) < 1e-5


REFUSED = {
    "dropout rates that differ": (["dropout.attention=0.2"], "dropout.attention=0.2"),
    "scaled scores": (["block.attention.scale_dim=null"], "block.attention.scale_dim=None"),
    "biases": (["block.attention.bias=true"], "block.attention.bias=True"),
    "separate embeddings": (["share_embeddings=false", "src_vocab_size=70"], "share_embeddings=False"),
    "layernorm": (["block.norm.kind=layernorm"], "block.norm.kind='layernorm'"),
    "post-norm": (["block.kind=post"], "block.kind='post'"),
    "grouped keys": (["block.attention.kind=gqa", "block.attention.n_kv_heads=1"], "block.attention.kind='gqa'"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_t5_cannot_express_is_refused_by_name(case):
    overrides, message = REFUSED[case]
    model = zoo.build("t5-tiny", overrides, device="meta")
    with pytest.raises(ConversionError, match=message):
        to_hf(model, "T5ForConditionalGeneration")
    with pytest.raises(ConversionError, match="feed_forward_proj='gated-tanh'"):
        from_hf(transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=V, d_model=16, d_kv=4, d_ff=20, num_layers=1, num_heads=2, feed_forward_proj="gated-tanh")))
