"""Generation: KV-cache decoding equals recomputation; greedy, sampling and beam search against
hand computations and exhaustive search."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import zoo
from conftest import pairwise, tiny_model
from zoo.generate import _beam_search, _filter, _Stepper, length_divisor

POSITIONS = ["none", "sinusoidal", "learned", "rope", "alibi", "relative_bias"]
ATTENTION = {"mha": [], "gqa": ["block.attention.n_kv_heads=2"], "mqa": []}


def left_padded(vocab: int, lengths: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    tokens = torch.randint(0, vocab, (len(lengths), T), generator=g)
    mask = torch.arange(T)[None, :] >= torch.tensor([T - n for n in lengths])[:, None]
    return tokens, mask


FAMILIES = ["decoder", "encoder_decoder"]
_PAIRS = pairwise(FAMILIES, POSITIONS, list(ATTENTION))  # the fast lane's share: every pair of choices


@pytest.mark.parametrize("family,position,attention", [
    pytest.param(*c, id="-".join(c), marks=() if c in _PAIRS else pytest.mark.slow)
    for c in itertools.product(FAMILIES, POSITIONS, ATTENTION)])
def test_cached_decoding_equals_full_recomputation(family, position, attention):
    model = tiny_model(family, [f"position.kind={position}", f"block.attention.kind={attention}", *ATTENTION[attention]]).eval()
    check_cached_decoding(model, family)


@pytest.mark.parametrize("scope", ["head", "all"])
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_cached_decoding_with_qk_norm_and_layer_scale(family, scope):
    """Keys are normalised before they are cached (and before RoPE), in self- and cross-attention."""
    qk = f"block.attention.qk_norm={{kind: rmsnorm, scope: {scope}}}"
    model = tiny_model(family, ["position.kind=rope", "block.attention.kind=gqa", "block.attention.n_kv_heads=2", qk,
                                "block.layer_scale=0.5"]).eval()
    assert model.spec.block.cross.qk_norm is not None
    check_cached_decoding(model, family)


def check_cached_decoding(model, family):
    V = model.spec.vocab_size
    g = torch.Generator().manual_seed(1)
    steps = 6
    with torch.no_grad():
        if family == "decoder":
            prompt, mask = left_padded(V, [5, 2, 4])
            cont = torch.randint(0, V, (3, steps), generator=g)
            full_tokens = torch.cat([prompt, cont], dim=1)
            full_mask = torch.cat([mask, torch.ones_like(cont, dtype=torch.bool)], dim=1)
            full = model(full_tokens, full_mask)
            cache = model.new_cache(full_tokens.shape[1])
            got = [model(prompt, mask, cache=cache)]
            for t in range(steps):
                got.append(model(cont[:, t : t + 1], cache=cache))
            got = torch.cat(got, dim=1)
            real = full_mask  # padded positions' outputs are free
            torch.testing.assert_close(got[real], full[real], rtol=0, atol=1e-5)
        else:
            src = torch.randint(0, V, (3, 7), generator=g)
            src_mask = torch.ones_like(src, dtype=torch.bool)
            src_mask[1, 4:] = False
            tgt = torch.randint(0, V, (3, steps), generator=g)
            memory = model.encode(src, src_mask)
            full = model.decode(tgt, memory, src_mask)
            cache = model.new_cache(steps)
            got = torch.cat([model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(steps)], dim=1)
            torch.testing.assert_close(got, full, rtol=0, atol=1e-5)
            assert got.argmax(-1).equal(full.argmax(-1))


# Decoder options of Mistral, Qwen2, GPT-NeoX, OLMo 2 and Gemma; the window is shorter than the prompts
# plus the new tokens, so the sliding cache drops keys while it decodes, padded rows included.
VARIANTS = {
    "window 3": ["block.attention.window=3"],
    "window 1": ["block.attention.window=1"],
    "qkv bias only, partial rope": ["block.attention.out_bias=false", "position.fraction=0.5"],
    "parallel": ["block.kind=parallel"],
    "post-sublayer norms, gemma norms": ["block.kind=post_sublayer", "block.norm.kind=rmsnorm",
                                         "block.norm.unit_offset=true", "embedding.scale=true", "embedding.round_scale=true"],
}


VARIANT_CASES = [(v, p, a) for v in VARIANTS for p in ("rope", "alibi") for a in ATTENTION
                 if p == "rope" or "position.fraction=0.5" not in VARIANTS[v]]  # partial rotary is a rope option
_VARIANT_PAIRS = {c for c in pairwise(list(VARIANTS), ["rope", "alibi"], list(ATTENTION)) if c in VARIANT_CASES}


@pytest.mark.parametrize("variant,position,attention", [
    pytest.param(*c, id="-".join(c), marks=() if c in _VARIANT_PAIRS else pytest.mark.slow) for c in VARIANT_CASES])
def test_cached_decoding_equals_full_recomputation_for_variants(variant, position, attention):
    overrides = [f"position.kind={position}", f"block.attention.kind={attention}", *ATTENTION[attention], *VARIANTS[variant]]
    model = tiny_model("decoder", overrides).eval()
    V, steps = model.spec.vocab_size, 6
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        prompt, mask = left_padded(V, [5, 2, 4])
        cont = torch.randint(0, V, (3, steps), generator=g)
        full_mask = torch.cat([mask, torch.ones_like(cont, dtype=torch.bool)], dim=1)
        full = model(torch.cat([prompt, cont], dim=1), full_mask)
        cache = model.new_cache(prompt.shape[1] + steps)
        got = [model(prompt, mask, cache=cache)]
        got += [model(cont[:, t : t + 1], cache=cache) for t in range(steps)]
        torch.testing.assert_close(torch.cat(got, dim=1)[full_mask], full[full_mask], rtol=0, atol=1e-5)
        window = model.spec.block.attention.window
        if window is not None:  # the cache holds the window's keys only
            assert cache.layers[0].k.shape[2] == window - 1


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_last_only_logits_are_the_last_position_of_the_full_logits(family):
    model = tiny_model(family, []).eval()
    V = model.spec.vocab_size
    with torch.no_grad():
        if family == "decoder":
            tokens, mask = left_padded(V, [5, 2, 4])
            full, last = model(tokens, mask), model(tokens, mask, last_only=True)
        else:
            src = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(2))
            tgt = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(3))
            memory = model.encode(src)
            full, last = model.decode(tgt, memory), model.decode(tgt, memory, last_only=True)
    assert last.shape == (3, 1, V)
    torch.testing.assert_close(last, full[:, -1:], rtol=0, atol=1e-6)


def test_cache_capacity_and_position_table_limits_are_clear():
    model = tiny_model("decoder").eval()
    cache = model.new_cache(4)
    model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"3 cached \+ 2 new tokens exceed its capacity \(4\)"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
    long_cache = model.new_cache(64)
    model(torch.zeros(1, 30, dtype=torch.long), cache=long_cache)
    with pytest.raises(ValueError, match=r"length 33 exceeds max_seq_len \(32\)"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=long_cache)


def test_length_penalties_by_hand():
    assert float(length_divisor(5, "gnmt", 0.6)) == pytest.approx((10 / 6) ** 0.6)
    assert float(length_divisor(1, "gnmt", 0.6)) == pytest.approx(1.0)
    assert float(length_divisor(5, "power", 0.6)) == pytest.approx(5**0.6)
    assert float(length_divisor(5, "none", 0.6)) == 1.0
    with pytest.raises(ValueError, match="unknown kind 'x'"):
        length_divisor(3, "x")


def test_an_hf_style_length_penalty_is_refused_with_its_translation():
    model = tiny_model("decoder")
    with pytest.raises(ValueError, match="length_norm='power', alpha=x"):
        zoo.generate(model, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, num_beams=2, length_norm=0.6)


def greedy_by_recomputation(model, prompt, n):
    """Greedy decoding the slow way: a full forward for every new token."""
    tokens = prompt
    for _ in range(n):
        nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens[:, prompt.shape[1]:]


@pytest.mark.slow
def test_greedy_equals_recomputation_and_batch_equals_rows():
    model = tiny_model("decoder", ["position.kind=rope"]).eval()
    prompt, mask = left_padded(61, [4, 2, 5], seed=3)
    out = zoo.generate(model, prompt, padding_mask=mask, max_new_tokens=8)
    assert out.tokens.shape == (3, 8) and out.lengths.tolist() == [8, 8, 8]
    for i in range(3):
        row = prompt[i : i + 1, mask[i]]  # the real tokens only
        alone = zoo.generate(model, row, max_new_tokens=8)
        assert alone.tokens.equal(out.tokens[i : i + 1])
        assert alone.tokens.equal(greedy_by_recomputation(model, row, 8))
        torch.testing.assert_close(alone.scores, out.scores[i : i + 1], atol=1e-5, rtol=1e-5)


def test_greedy_scores_are_the_sum_of_log_probs_and_eos_stops_rows():
    model = tiny_model("decoder").eval()
    prompt = torch.randint(0, 61, (2, 3))
    free = zoo.generate(model, prompt, max_new_tokens=6)
    seq = torch.cat([prompt, free.tokens], dim=1)
    logp = model(seq).log_softmax(-1)[:, 2:-1].gather(2, free.tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(free.scores, logp.sum(1), atol=1e-5, rtol=1e-5)
    eos = int(free.tokens[0, 2])  # make row 0's third token the stop token
    stopped = zoo.generate(model, prompt, max_new_tokens=6, eos_id=eos, pad_id=60)
    assert stopped.lengths[0] <= 3 and (stopped.tokens[0, int(stopped.lengths[0]):] == 60).all()
    first = int((free.tokens[1] == eos).nonzero()[0]) + 1 if (free.tokens[1] == eos).any() else 6
    assert int(stopped.lengths[1]) == first


def test_sampling_top_k_1_is_greedy_and_seeds_reproduce():
    model = tiny_model("decoder").eval()
    prompt = torch.randint(0, 61, (4, 3))
    greedy = zoo.generate(model, prompt, max_new_tokens=10)
    k1 = zoo.generate(model, prompt, max_new_tokens=10, do_sample=True, top_k=1, generator=torch.Generator().manual_seed(5))
    assert k1.tokens.equal(greedy.tokens)
    a = zoo.generate(model, prompt, max_new_tokens=10, do_sample=True, top_p=0.9, generator=torch.Generator().manual_seed(7))
    b = zoo.generate(model, prompt, max_new_tokens=10, do_sample=True, top_p=0.9, generator=torch.Generator().manual_seed(7))
    c = zoo.generate(model, prompt, max_new_tokens=10, do_sample=True, generator=torch.Generator().manual_seed(8))
    assert a.tokens.equal(b.tokens) and not a.tokens.equal(c.tokens)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.05, 0.4, 0.3, 0.15, 0.1]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(_filter(logits, 1.0, 0, p))[0].tolist()  # noqa: E731
    assert kept(0.4) == [False, True, False, False, False]  # 0.4 alone reaches 0.4
    assert kept(0.5) == [False, True, True, False, False]  # 0.4 + 0.3
    assert kept(0.85) == [False, True, True, True, False]  # 0.4 + 0.3 + 0.15 = 0.85
    assert kept(0.86) == [False, True, True, True, True]
    assert kept(1.0) == [True] * 5
    top2 = torch.isfinite(_filter(logits, 1.0, 2, 1.0))[0].tolist()
    assert top2 == [False, True, True, False, False]
    torch.testing.assert_close(_filter(logits, 2.0, 0, 1.0), logits / 2)


def test_beam_size_1_equals_greedy():
    model = tiny_model("encoder_decoder").eval()
    src = torch.randint(0, 61, (3, 6))
    greedy = zoo.generate(model, src, num_beams=1, bos_id=1, max_new_tokens=7)
    stepper = _Stepper(model, src, None, repeat=1, capacity=8, bos_id=1)
    beam1 = _beam_search(stepper, 3, 1, torch.full((3,), 7), torch.tensor([], dtype=torch.long), 0, "none", 0.0, 0)
    assert beam1.tokens.equal(greedy.tokens)
    torch.testing.assert_close(beam1.scores, greedy.scores, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def exhaustive_best(model, prompt, vocab, eos, max_new, kind, alpha):
    """Score every hypothesis (ending at its first EOS, or reaching max_new without one) by brute force.

    One full forward over every sequence of max_new tokens scores all their prefixes too: the model
    is causal, so a prefix's log-probabilities do not depend on what follows it."""
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=max_new)))  # (V^N, N)
    tokens = torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1)
    logp = model(tokens).log_softmax(-1)[:, prompt.shape[1] - 1 : -1].gather(2, seqs[..., None]).squeeze(-1)
    cum = logp.cumsum(dim=1)  # (V^N, N): log P of each prefix
    best, best_seq = -math.inf, None
    for row, seq in enumerate(seqs.tolist()):
        n = seq.index(eos) + 1 if eos in seq else max_new
        score = float(cum[row, n - 1]) / float(length_divisor(n, kind, alpha))
        if score > best:
            best, best_seq = score, seq[:n]
    return best, best_seq


@pytest.mark.slow
@pytest.mark.parametrize("kind,alpha", [("gnmt", 0.6), ("gnmt", 2.0), ("power", 1.0), ("none", 0.0)])
def test_large_beam_finds_the_exhaustive_best(kind, alpha):
    V, eos, max_new = 5, 4, 4
    lengths = set()
    for seed in range(6):
        model = zoo.build(
            "gpt2-small",
            ["d_model=16", "n_layers=1", "block.attention.n_heads=2", f"vocab_size={V}", "max_seq_len=16",
             "head.bias=true", "head.tied=false"],
            seed=seed,
        ).eval()
        with torch.no_grad():  # peaked distributions and a less likely EOS, so the best length varies
            model.head.weight.normal_(0, 2.0, generator=torch.Generator().manual_seed(seed))
            model.head.bias[eos] = -1.0
        prompt = torch.tensor([[0, 1]])
        best, best_seq = exhaustive_best(model, prompt, V, eos, max_new, kind, alpha)
        out = zoo.generate(model, prompt, num_beams=V**max_new, eos_id=eos, max_new_tokens=max_new,
                           length_norm=kind, alpha=alpha)
        got = out.tokens[0, : int(out.lengths[0])].tolist()
        assert got == best_seq, (seed, got, best_seq)
        assert float(out.scores[0]) == pytest.approx(best, abs=1e-4)
        lengths.add(len(best_seq))
    assert len(lengths) > 1  # the cases exercise both stopping early and running to the limit


def test_beam_search_batched_equals_one_by_one_and_defaults_follow_the_paper():
    model = tiny_model("encoder_decoder").eval()
    src = torch.randint(0, 61, (3, 6))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[0, 3:] = False
    mask[2, 5:] = False
    out = zoo.generate(model, src, padding_mask=mask, bos_id=1, eos_id=2, max_len_b=5)  # beam 4, gnmt 0.6, src + b
    assert out.lengths.max() <= 6 + 5
    for i in range(3):
        real = src[i : i + 1, mask[i]]
        alone = zoo.generate(model, real, bos_id=1, eos_id=2, max_len_b=5)
        n = int(alone.lengths[0])
        assert int(out.lengths[i]) == n <= real.shape[1] + 5
        assert out.tokens[i, :n].equal(alone.tokens[0, :n])
        torch.testing.assert_close(out.scores[i], alone.scores[0], atol=1e-5, rtol=1e-5)


def test_decoder_beam_search_with_left_padding_equals_rows():
    model = tiny_model("decoder", ["position.kind=alibi", "block.attention.kind=mqa"]).eval()
    prompt, mask = left_padded(61, [3, 5], seed=9)
    out = zoo.generate(model, prompt, padding_mask=mask, num_beams=3, eos_id=4, max_new_tokens=6)
    for i in range(2):
        alone = zoo.generate(model, prompt[i : i + 1, mask[i]], num_beams=3, eos_id=4, max_new_tokens=6)
        n = int(alone.lengths[0])
        assert out.tokens[i, :n].equal(alone.tokens[0, :n])


def test_bad_arguments_fail_clearly():
    dec, ed = tiny_model("decoder"), tiny_model("encoder_decoder")
    x = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="give max_new_tokens"):
        zoo.generate(dec, x)
    with pytest.raises(ValueError, match="needs bos_id"):
        zoo.generate(ed, x)
    with pytest.raises(ValueError, match="not both"):
        zoo.generate(dec, x, max_new_tokens=2, num_beams=2, do_sample=True)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        zoo.generate(dec, x, max_new_tokens=2, do_sample=True, temperature=0)
    with pytest.raises(ValueError, match="inputs must be token ids"):
        zoo.generate(dec, torch.zeros(3, dtype=torch.long), max_new_tokens=2)


def test_the_family_says_how_it_decodes():
    """generate asks the model's family (decodes_from), not which methods the model happens to have."""
    assert tiny_model("decoder").decodes_from == "prompt" and tiny_model("encoder_decoder").decodes_from == "source"
    for family in ("encoder", "vit"):
        model = tiny_model(family)
        assert model.decodes_from is None
        with pytest.raises(ValueError, match=f"a {type(model).__name__} does not generate"):
            zoo.generate(model, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2)


def test_requests_that_cannot_be_met_are_refused_and_an_empty_batch_is_empty():
    dec, ed = tiny_model("decoder"), tiny_model("encoder_decoder")
    V = dec.spec.vocab_size
    x = torch.zeros(1, 3, dtype=torch.long)
    for kwargs, message in [
        ({"max_new_tokens": -1}, "max_new_tokens must be >= 0, got -1"),
        ({"max_new_tokens": 2, "do_sample": True, "temperature": float("nan")}, "temperature must be > 0 and finite, got nan"),
        ({"max_new_tokens": 2, "num_beams": 2, "alpha": float("inf")}, "alpha must be >= 0 and finite"),
        ({"max_new_tokens": 2, "eos_id": V}, rf"eos_id / stop_tokens {V} is not a token of the model's vocabulary \(0..{V - 1}\)"),
        ({"max_new_tokens": 2, "stop_tokens": [3, -1]}, r"eos_id / stop_tokens -1 is not a token"),
        ({"max_new_tokens": 2, "stop_tokens": 3}, r"stop_tokens is a list of token ids, got 3; e.g. stop_tokens=\[2\]"),
        ({"max_new_tokens": 2, "stop_tokens": [1.5]}, r"stop_tokens must be integer token ids, got \[1.5\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            zoo.generate(dec, x, **kwargs)
    with pytest.raises(ValueError, match=rf"bos_id {ed.spec.vocab_size} is not a token"):
        zoo.generate(ed, x, bos_id=ed.spec.vocab_size)
    with pytest.raises(ValueError, match="max_len_a must be a finite number >= 0, got nan"):
        zoo.generate(ed, x, bos_id=1, max_len_a=float("nan"))
    with pytest.raises(ValueError, match="padding_mask: row 1 has no real token; every prompt"):
        zoo.generate(dec, torch.zeros(2, 3, dtype=torch.long), padding_mask=torch.tensor([[True] * 3, [False] * 3]), max_new_tokens=2)
    with pytest.raises(ValueError, match="padding_mask: row 0 has no real token"):
        zoo.generate(ed, torch.zeros(1, 3, dtype=torch.long), padding_mask=torch.zeros(1, 3, dtype=torch.bool), bos_id=1)
    with pytest.raises(ValueError, match="inputs has no tokens"):
        zoo.generate(dec, torch.zeros(2, 0, dtype=torch.long), max_new_tokens=2)
    for model, kwargs in ((dec, {"max_new_tokens": 3}), (ed, {"bos_id": 1}), (dec, {"max_new_tokens": 3, "num_beams": 2})):
        out = zoo.generate(model, torch.zeros(0, 4, dtype=torch.long), **kwargs)
        assert out.tokens.shape[0] == out.scores.shape[0] == out.lengths.shape[0] == 0
