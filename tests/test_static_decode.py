"""The static KV cache and the compiled decoding step: token for token what the dynamic cache decodes
(itself tested against full recomputation and HF's generate), for greedy, seeded sampling and beam
search, on left-padded decoders (learned positions, RoPE + GQA, a sliding window, ALiBi, a mixture of
experts, DeepSeek-V3's latent attention and router) and an encoder-decoder; the compiled step has one graph, no graph break and no recompilation
from step to step, and decodes as the eager one does."""

from __future__ import annotations

import pytest
import torch

import zoo
from conftest import tiny_model, tiny_spec
from zoo import decoding
from zoo.decoding import StaticStepper
from zoo.generate import Generation

V = 61
SMALL = ["d_model=32", "n_layers=2", "block.attention.n_heads=4", f"vocab_size={V}", "max_seq_len=40"]
DECODERS = {
    "gpt2 learned": lambda: tiny_spec("decoder"),
    "llama rope gqa": lambda: zoo.load_spec("llama-tiny", SMALL + ["block.attention.n_kv_heads=2", "block.ffn.hidden=48"]),
    "mistral window": lambda: zoo.load_spec("mistral-tiny", SMALL + ["block.attention.n_kv_heads=2", "block.ffn.hidden=48",
                                                                     "block.attention.window=3"]),
    "alibi": lambda: tiny_spec("decoder", ["position.kind=alibi"]),
    "mixtral moe": lambda: zoo.load_spec("mixtral-tiny", SMALL + ["block.attention.n_kv_heads=2",
                                                                  "block.ffn.expert.hidden=24"]),
    "deepseek mla": lambda: zoo.load_spec("deepseek-tiny", SMALL + [
        "block.attention.q_lora_rank=12", "block.attention.kv_lora_rank=10", "block.attention.qk_nope_head_dim=6",
        "block.attention.qk_rope_head_dim=4", "block.attention.v_head_dim=8", "block.ffn.expert.hidden=24",
        "block.ffn.shared_hidden=24", "layers=[{at: [0], block: {ffn: {kind: swiglu, hidden: 48, bias: false}}}]"]),
}
STRATEGIES = {
    "greedy": {"num_beams": 1},
    "sampling": {"num_beams": 1, "do_sample": True, "temperature": 0.9, "top_k": 20, "top_p": 0.9},
    "beam": {"num_beams": 3},
}


def left_padded(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    tokens = torch.randint(3, V, (len(lengths), T), generator=g)
    mask = torch.arange(T)[None, :] >= torch.tensor([T - n for n in lengths])[:, None]
    return tokens.masked_fill(~mask, 0), mask


def decode(model, inputs, mask, strategy: str, **kw) -> Generation:
    g = torch.Generator().manual_seed(7)
    return zoo.generate(model, inputs, padding_mask=mask, generator=g, eos_id=4, **STRATEGIES[strategy], **kw)


def assert_same(got, want) -> None:
    assert got.tokens.equal(want.tokens)
    assert got.lengths.equal(want.lengths)
    torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def decoders():
    return {name: zoo.build(make(), seed=1).eval() for name, make in DECODERS.items()}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", DECODERS)
def test_static_cache_decodes_as_the_dynamic_cache(decoders, name, strategy):
    model = decoders[name]
    x, mask = left_padded([6, 2, 5])
    want = decode(model, x, mask, strategy, max_new_tokens=9, min_new_tokens=2)
    got = decode(model, x, mask, strategy, max_new_tokens=9, min_new_tokens=2, cache="static")
    assert_same(got, want)
    assert got.tokens.shape[1] > 3  # decoded past the window (mistral's 3) and the shortest prompt
    assert bool((got.lengths >= 2).all())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_static_cache_decodes_an_encoder_decoder_as_the_dynamic_cache(strategy):
    model = tiny_model("encoder_decoder", ["max_seq_len=40"], seed=2).eval()
    src = torch.randint(3, V, (3, 7), generator=torch.Generator().manual_seed(3))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 4:] = False  # right padding, the encoder's
    kw = {"bos_id": 1, "max_len_b": 8}
    want = decode(model, src, src_mask, strategy, **kw)
    got = decode(model, src, src_mask, strategy, cache="static", **kw)
    assert_same(got, want)


def test_static_cache_reorders_in_place_and_hides_unwritten_slots():
    model = zoo.build(DECODERS["mistral window"](), seed=1).eval()
    x, mask = left_padded([4, 2])
    with torch.no_grad():
        stepper = StaticStepper(model, x, mask, repeat=2, new_tokens=5, bos_id=None)
        stepper.first()
        cache = stepper.cache
        k = cache.layers[0].k
        assert k.shape[2] == cache.capacity == 4 + 5 and int(cache.pos) == 4
        address = k.data_ptr()
        before = k.clone()
        cache.reorder(torch.tensor([1, 1, 3, 2]))
        assert cache.layers[0].k.data_ptr() == address
        assert cache.layers[0].k.equal(before[[1, 1, 3, 2]])
        assert cache.next_position.tolist() == [4, 4, 2, 2]
        positions, _, _ = cache.extend(None, 1, 4, x.device)  # the next token: slot 4
        assert positions.flatten().tolist() == [4, 4, 2, 2] and int(cache.pos) == 5
        allowed = lambda row, window: cache.mask(1, window, None)[row, 0, 0].nonzero().flatten().tolist()
        assert cache.mask(1, None, None).shape == (4, 1, 1, cache.capacity)
        assert allowed(0, None) == [0, 1, 2, 3, 4] and allowed(0, 3) == [2, 3, 4]  # a window of 3 slots
        assert allowed(2, None) == [2, 3, 4] and allowed(2, 2) == [3, 4]  # two padding slots hidden


def test_static_decoding_refuses_clearly():
    model = zoo.build(DECODERS["gpt2 learned"](), seed=1).eval()
    x, mask = left_padded([3, 2])
    with pytest.raises(ValueError, match="compile needs cache='static'"):
        zoo.generate(model, x, padding_mask=mask, max_new_tokens=3, compile=True)
    with pytest.raises(ValueError, match="cache must be 'dynamic' or 'static'"):
        zoo.generate(model, x, padding_mask=mask, max_new_tokens=3, cache="ring")
    with pytest.raises(ValueError, match="compile must be True, False or a torch.compile mode"):
        zoo.generate(model, x, padding_mask=mask, max_new_tokens=3, cache="static", compile="fastest")
    with pytest.raises(ValueError, match="check_every must be >= 1"):
        zoo.generate(model, x, padding_mask=mask, max_new_tokens=3, cache="static", check_every=0)
    with pytest.raises(ValueError, match=r"exceed max_seq_len \(32\)"):
        zoo.generate(model, x, padding_mask=mask, max_new_tokens=40, cache="static")
    dynamic_rope = zoo.build(tiny_spec("decoder", ["position.kind=rope", "position.scaling={kind: dynamic, factor: 2.0}"]))
    with pytest.raises(ValueError, match="dynamic RoPE scaling"):
        zoo.generate(dynamic_rope, x, padding_mask=mask, max_new_tokens=3, cache="static", compile=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODERS)
def test_the_static_step_is_one_graph_without_breaks(decoders, name):
    model = decoders[name]
    x, mask = left_padded([6, 2, 5])
    with torch.no_grad():
        stepper = StaticStepper(model, x, mask, repeat=1, new_tokens=6, bos_id=None)
        tok = stepper.first().argmax(-1)
        rows = torch.tensor([2, 0, 0])  # a beam search's reordering goes into the step's graph
        explained = torch._dynamo.explain(decoding._step)(stepper, tok[:, None], rows)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def compiled_run(model, inputs, mask, strategy, **kw):
    """Decode with the compiled step; assert one graph, compiled once, over every step."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = decode(model, inputs, mask, strategy, cache="static", compile=True, **kw)
    assert counters["stats"]["unique_graphs"] == 1
    return got


@pytest.mark.slow
def test_compiled_beam_search_equals_eager_and_does_not_recompile(decoders):
    model = decoders["mistral window"]
    x, mask = left_padded([6, 2, 5])
    got = compiled_run(model, x, mask, "beam", max_new_tokens=8, check_every=100)  # >= 7 compiled steps
    assert_same(got, decode(model, x, mask, "beam", max_new_tokens=8, cache="static"))
    assert_same(got, decode(model, x, mask, "beam", max_new_tokens=8))


@pytest.mark.slow
def test_compiled_encoder_decoder_greedy_equals_eager_and_does_not_recompile():
    model = tiny_model("encoder_decoder", ["position.kind=relative_bias"], seed=2).eval()
    src = torch.randint(3, V, (2, 6), generator=torch.Generator().manual_seed(4))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[0, 3:] = False
    kw = {"bos_id": 1, "max_new_tokens": 7}
    got = compiled_run(model, src, src_mask, "greedy", **kw)
    assert_same(got, decode(model, src, src_mask, "greedy", **kw))


def test_translation_recipe_decodes_alike_with_either_cache():
    from translate_eval import decode_batches  # recipes/, on pytest's path

    model = tiny_model("encoder_decoder", ["max_seq_len=40"], seed=3).eval()
    g = torch.Generator().manual_seed(5)
    src = [torch.randint(4, V, (int(n),), generator=g).tolist() for n in (5, 9, 3, 7, 6)]
    settings = {"beams": 4, "max_len_b": 6, "batch_tokens": 48}  # several batches of different shapes
    want = decode_batches(model, src, **settings)  # auto on CPU: the dynamic cache
    assert decode_batches(model, src, cache="static", **settings) == want
    with pytest.raises(ValueError, match="compile needs the static cache"):
        decode_batches(model, src, cache="dynamic", compile=True, **settings)
