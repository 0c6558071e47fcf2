"""Generation for GPT-style decoders and encoder-decoders: greedy, sampling, beam search.

Every strategy decodes incrementally with the model's KV cache, a whole batch per forward (beams
included), with no Python loop over sentences or beams: the only loop is over time steps.

Beam search follows the paper's setup (Vaswani et al. 2017, sec. 6.1; Wu et al. 2016): beam 4,
length penalty lp(Y) = ((5 + |Y|) / 6)^alpha with alpha 0.6, hypotheses ranked by
log P(Y|X) / lp(Y), maximum length |X| + 50. |Y| counts the generated tokens, the stop token included.
It stops a sentence as soon as no live beam can beat its best finished hypothesis: log-probabilities
only fall as a hypothesis grows and (for alpha >= 0) lp grows at most to lp(max length), so a live
beam's best reachable score is its score / lp(max length).

Each step keeps the 2K best candidates (beam, token); the K best that do not stop go on. A stop
token finishes a hypothesis wherever it ranks among the 2K (``finish_from="candidates"``, as
tensor2tensor, the paper's code, does), or only among the K best (``finish_from="beams"``: HF
transformers' rule). With ``finish_from="beams"``, ``length_norm="power"`` (or ``"none"``) and HF's
``early_stopping="never"`` (whose bound is the one above), zoo returns HF's ``generate(num_beams=K)``
sequences and scores (tests/test_beam_hf.py): HF's ``length_penalty=x`` is the exponent, zoo's
``length_norm="power", alpha=x``.

Caches: ``cache="dynamic"`` (:class:`zoo.components.cache.KVCache`: the keys so far, a sliding
window's layers keep only the window) or ``cache="static"`` (:mod:`zoo.decoding`: buffers preallocated
for the prompt and every new token, written in place, one step's shapes the same at every step), which
``compile`` turns into one compiled graph (CUDA graphs on CUDA). Both give the same tokens. The loops
read nothing back from the device but every ``check_every`` steps (whether every row has ended).

Shapes: B sentences, K beams, V vocabulary, N new tokens.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable, Iterable, Literal

import einops
import torch
from torch import Tensor, nn

from zoo.decoding import StaticStepper, compile_mode, decodes_from

__all__ = ["generate", "Generation", "length_divisor"]

LengthNorm = Literal["gnmt", "power", "none"]  # how beam search divides a score by the length
Finish = Literal["candidates", "beams"]
Cache = Literal["dynamic", "static"]


@dataclass
class Generation:
    """``tokens`` [B, N]: the new tokens, ``pad_id`` after each row's end; ``scores`` [B]: the sum of
    the tokens' log-probabilities (beam search: divided by the length penalty); ``lengths`` [B]:
    tokens generated per row, the stop token included."""

    tokens: Tensor
    scores: Tensor
    lengths: Tensor


def length_divisor(length: Tensor | int, kind: LengthNorm = "gnmt", alpha: float = 0.6) -> Tensor:
    """What beam search divides a hypothesis's log-probability by: ``gnmt``: ((5 + L) / 6)^alpha (Wu
    et al. 2016, the paper's); ``power``: L^alpha (HF's ``length_penalty=alpha``; 1.0: the mean
    log-probability per token); ``none``: 1."""
    length = torch.as_tensor(length, dtype=torch.float32)
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "power":
        return length**alpha
    if kind == "none":
        return torch.ones_like(length)
    raise ValueError(f"length_norm: unknown kind {kind!r}; use 'gnmt', 'power' (HF's length_penalty is its alpha) or 'none'")


class _Stepper:
    """Feeds a model one step at a time through its KV cache; hides the family's call shape."""

    def __init__(self, model: nn.Module, inputs: Tensor, mask: Tensor | None, *, repeat: int, capacity: int, bos_id: int | None):
        self.model = model
        self.encdec = decodes_from(model) == "source"
        if self.encdec:
            if bos_id is None:
                raise ValueError("generate: an encoder-decoder needs bos_id, the token the target starts with")
            memory = model.encode(inputs, mask)
            self.memory = einops.repeat(memory, "b s d -> (b k) s d", k=repeat)  # each sentence's beams in a row
            self.mask = einops.repeat(mask, "b s -> (b k) s", k=repeat) if mask is not None else None
            self.cache = model.new_cache(capacity)
            self.first_tokens = torch.full((self.memory.shape[0], 1), bos_id, dtype=torch.long, device=inputs.device)
        else:
            self.cache = model.new_cache(inputs.shape[1] + capacity)
            self.prompt = einops.repeat(inputs, "b t -> (b k) t", k=repeat)
            self.mask = einops.repeat(mask, "b t -> (b k) t", k=repeat) if mask is not None else None

    def _call(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        if self.encdec:
            out = self.model.decode(tokens, self.memory, self.mask, None, cache=self.cache, last_only=True)
        else:
            out = self.model(tokens, mask, cache=self.cache, last_only=True)
        return out[:, -1]  # (rows, V)

    def first(self) -> Tensor:
        return self._call(self.first_tokens, None) if self.encdec else self._call(self.prompt, self.mask)

    def step(self, tokens: Tensor) -> Tensor:
        return self._call(tokens[:, None], None)

    def reorder(self, rows: Tensor) -> None:
        self.cache.reorder(rows)  # memory and source mask are equal across beams of one sentence


def _filter(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Logits with temperature applied and tokens outside top-k / the top-p nucleus set to -inf."""
    logits = logits / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return logits


@torch.no_grad()
def generate(
    model: nn.Module,
    inputs: Tensor,
    *,
    padding_mask: Tensor | None = None,
    max_new_tokens: int | None = None,
    num_beams: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    stop_tokens: Iterable[int] = (),
    bos_id: int | None = None,
    pad_id: int = 0,
    length_norm: LengthNorm = "gnmt",
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_new_tokens: int = 0,
    finish_from: Finish = "candidates",
    cache: Cache = "dynamic",
    compile: bool | str = False,
    check_every: int | None = None,
    on_token: Callable[[Tensor], bool | None] | None = None,
) -> Generation:
    """Generate from a decoder (``inputs`` = prompt [B, T], left-padded with ``padding_mask``) or an
    encoder-decoder (``inputs`` = source [B, S], right-padded with ``padding_mask``; needs ``bos_id``).

    Strategy: ``num_beams`` > 1 is beam search (default 4 for encoder-decoders, the paper's, and 1 for
    decoders); otherwise greedy, or sampling with ``do_sample`` (``temperature``, ``top_k``, ``top_p``,
    a seeded ``generator`` makes it reproducible). A row ends at ``eos_id`` or any of ``stop_tokens``.
    Length: ``max_new_tokens``, or for encoder-decoders by default ``max_len_a * source length +
    max_len_b`` per sentence (the paper: source + 50). ``finish_from``: where among a beam step's
    candidates a stop token finishes a hypothesis, any of the 2K kept (``candidates``, the paper's)
    or the K best only (``beams``, HF transformers'). ``length_norm``: what beam search divides a
    hypothesis's log-probability by, with exponent ``alpha`` (:func:`length_divisor`): ``gnmt`` (the
    paper's), ``power`` (|Y|^alpha, HF's ``length_penalty=alpha``) or ``none``.

    ``cache``: ``dynamic`` (the default) or ``static`` (preallocated, the same shapes at every step);
    ``compile`` (static only): compile the step, True for ``torch.compile``'s default mode on CPU and
    ``reduce-overhead`` (CUDA graphs) on CUDA, or a mode's name. ``check_every``: steps between the
    host's checks whether every row has ended (default 1 with the dynamic cache, 8 with the static);
    the tokens are the same, a check costs a device sync.

    ``on_token`` (greedy and sampling): called after each step with its tokens [B] (``pad_id`` in
    rows that have ended), outside any compiled step, e.g. to print text as it comes; returning True
    ends every row there (a stop string found).
    """
    encdec = decodes_from(model) == "source"
    if isinstance(stop_tokens, (int, str, Tensor)) and not (isinstance(stop_tokens, Tensor) and stop_tokens.dim() == 1):
        raise ValueError(f"generate: stop_tokens is a list of token ids, got {stop_tokens!r}; e.g. stop_tokens=[2]")
    try:
        stop_tokens = [operator.index(t) for t in stop_tokens]  # ints, numpy's, 0-d integer tensors; never 1.5
    except TypeError:
        raise ValueError(f"generate: stop_tokens must be integer token ids, got {list(stop_tokens)!r}") from None
    stops = torch.tensor(sorted({*stop_tokens, *([eos_id] if eos_id is not None else [])}), dtype=torch.long)
    K = num_beams if num_beams is not None else (4 if encdec else 1)
    _check_args(inputs, K, temperature, top_k, top_p, alpha, do_sample, finish_from, length_norm)
    _check_request(model, inputs, padding_mask, stops, bos_id, max_new_tokens, max_len_a, max_len_b, min_new_tokens)
    B, device = inputs.shape[0], inputs.device
    if B == 0:  # no prompts, nothing to generate: an empty batch's result
        return Generation(torch.full((0, max_new_tokens or 0), pad_id, dtype=torch.long, device=device),
                          torch.zeros(0, device=device), torch.zeros(0, dtype=torch.long, device=device))
    if cache not in ("dynamic", "static"):
        raise ValueError(f"generate: cache must be 'dynamic' or 'static', got {cache!r}")
    mode = compile_mode(compile, device)
    if mode is not None and cache != "static":
        raise ValueError("generate: compile needs cache='static' (a dynamic cache's shapes grow every step)")
    check_every = check_every if check_every is not None else (8 if cache == "static" else 1)
    if check_every < 1:
        raise ValueError(f"generate: check_every must be >= 1, got {check_every}")
    if on_token is not None and K > 1:
        raise ValueError("generate: on_token follows greedy or sampled tokens; beam search knows its tokens at the end")
    stops = stops.to(device)
    if max_new_tokens is not None:
        max_len = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
    elif encdec:
        src_len = padding_mask.sum(dim=1) if padding_mask is not None else torch.full((B,), inputs.shape[1], device=device)
        max_len = (max_len_a * src_len.float() + max_len_b).long().clamp(min=1)
    else:
        raise ValueError("generate: give max_new_tokens for a decoder-only model")
    N = int(max_len.max())
    was_training = model.training
    model.eval()
    try:
        if cache == "static":
            stepper = StaticStepper(model, inputs, padding_mask, repeat=K, new_tokens=N + 1, bos_id=bos_id, mode=mode)
        else:
            stepper = _Stepper(model, inputs, padding_mask, repeat=K, capacity=N + 1, bos_id=bos_id)
        if K > 1:
            return _beam_search(stepper, B, K, max_len, stops, pad_id, length_norm, alpha, min_new_tokens,
                                finish_from, check_every)
        return _sample(stepper, B, max_len, stops, pad_id, min_new_tokens, do_sample, temperature, top_k, top_p, generator,
                       check_every, on_token)
    finally:
        model.train(was_training)


def _check_args(inputs, K, temperature, top_k, top_p, alpha, do_sample, finish_from, length_norm) -> None:
    if not isinstance(inputs, Tensor) or inputs.dim() != 2:
        raise ValueError(f"generate: inputs must be token ids [batch, length], got {getattr(inputs, 'shape', type(inputs))}")
    if K < 1:
        raise ValueError(f"generate: num_beams must be >= 1, got {K}")
    if K > 1 and do_sample:
        raise ValueError("generate: choose beam search (num_beams > 1) or sampling (do_sample), not both")
    if not 0 < temperature < math.inf:
        raise ValueError(f"generate: temperature must be > 0 and finite, got {temperature}; use greedy for temperature 0")
    if top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"generate: need top_k >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}")
    if not 0 <= alpha < math.inf:
        raise ValueError(f"generate: alpha must be >= 0 and finite (the early stop relies on it), got {alpha}")
    if length_norm not in ("gnmt", "power", "none"):
        raise ValueError(f"generate: length_norm must be 'gnmt', 'power' or 'none', got {length_norm!r}; HF's "
                         f"length_penalty=x is length_norm='power', alpha=x")
    if finish_from not in ("candidates", "beams"):
        raise ValueError(f"generate: finish_from must be 'candidates' (a stop among the 2K candidates finishes, the "
                         f"paper's) or 'beams' (among the K best only, HF's), got {finish_from!r}")


def _check_request(model, inputs, padding_mask, stops, bos_id, max_new_tokens, max_len_a, max_len_b, min_new_tokens) -> None:
    """Lengths that are counts, rows with a real token (a row of padding alone would generate from
    nothing), and token ids the model's vocabulary has (a stop token outside it would never end a
    row; a bos_id outside it fails inside the embedding)."""
    for name, value in (("max_new_tokens", max_new_tokens), ("max_len_b", max_len_b), ("min_new_tokens", min_new_tokens)):
        if value is not None and value < 0:
            raise ValueError(f"generate: {name} must be >= 0, got {value}")
    if not math.isfinite(max_len_a) or max_len_a < 0:
        raise ValueError(f"generate: max_len_a must be a finite number >= 0, got {max_len_a}")
    if inputs.shape[0] and inputs.shape[1] == 0:
        raise ValueError("generate: inputs has no tokens; a prompt (or source) needs at least one, e.g. the bos token")
    if isinstance(padding_mask, Tensor) and padding_mask.shape == inputs.shape and inputs.numel():
        empty = (~padding_mask.bool()).all(dim=1).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"generate: padding_mask: row {empty[0]} has no real token; every prompt (or source) needs "
                             f"one, so leave empty ones out")
    vocab = getattr(getattr(model, "spec", None), "vocab_size", None)
    if vocab is None:
        return
    for name, ids in (("eos_id / stop_tokens", stops.tolist()), ("bos_id", [] if bos_id is None else [bos_id])):
        outside = [i for i in ids if not 0 <= i < vocab]
        if outside:
            raise ValueError(f"generate: {name} {outside[0]} is not a token of the model's vocabulary (0..{vocab - 1}); "
                             f"give ids the tokenizer gives")


def _sample(stepper, B, max_len, stops, pad_id, min_new, do_sample, temperature, top_k, top_p, generator,
            check_every=1, on_token=None) -> Generation:
    device = max_len.device
    N = int(max_len.max())
    tokens = torch.full((B, N), pad_id, dtype=torch.long, device=device)
    scores = torch.zeros(B, device=device)
    lengths = max_len.clone()
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    logits = stepper.first()
    for t in range(N):
        logits = logits.float()
        if t < min_new and len(stops):
            logits = logits.index_fill(1, stops, float("-inf"))
        logp = logits.log_softmax(dim=-1)
        if do_sample:
            probs = _filter(logits, temperature, top_k, top_p).softmax(dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            tok = logits.argmax(dim=-1)
        tok = tok.masked_fill(finished, pad_id)
        scores += logp.gather(1, tok[:, None]).squeeze(1).masked_fill(finished, 0.0)
        tokens[:, t] = tok
        ended = ~finished & (torch.isin(tok, stops) | (t + 1 >= max_len))
        lengths = torch.where(ended, t + 1, lengths)
        finished |= ended
        if on_token is not None and on_token(tok):
            lengths = torch.where(finished, lengths, t + 1)  # every row ends here
            break
        if t + 1 == N or (t + 1) % check_every == 0 and bool(finished.all()):
            break
        logits = stepper.step(tok)
    return Generation(tokens[:, : int(lengths.max())], scores, lengths)


def _beam_search(stepper, B, K, max_len, stops, pad_id, kind, alpha, min_new, finish_from="candidates",
                 check_every=1) -> Generation:
    """Tensor bookkeeping of fixed shapes: the live beams' tokens in a [B*K, N] buffer, the best
    finished hypotheses replaced by ``torch.where``; the host reads ``done`` every ``check_every`` steps."""
    device = max_len.device
    N = int(max_len.max())
    offsets = torch.arange(B, device=device)[:, None] * K  # row of each sentence's first beam
    alive_tokens = torch.full((B * K, N), pad_id, dtype=torch.long, device=device)  # columns past the step: pad
    alive = torch.zeros(B, K, device=device)
    alive[:, 1:] = float("-inf")  # all beams start equal: keep one
    best = torch.full((B,), float("-inf"), device=device)
    best_tokens = torch.full((B, N), pad_id, dtype=torch.long, device=device)
    best_len = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    max_lp = length_divisor(max_len, kind, alpha).to(device)
    columns = torch.arange(N, device=device)
    logits = stepper.first()
    for t in range(N):
        L = t + 1
        logp = logits.float().log_softmax(dim=-1)  # (B*K, V)
        V = logp.shape[-1]
        if t < min_new and len(stops):
            logp = logp.index_fill(1, stops, float("-inf"))
        logp = einops.rearrange(logp, "(b k) v -> b k v", k=K)
        cand = einops.rearrange(alive[..., None] + logp, "b k v -> b (k v)")  # candidate = (beam, token)
        top_s, top_i = cand.topk(min(2 * K, K * V), dim=1)  # (B, 2K), best first
        beam, tok = top_i // V, top_i % V
        is_stop = torch.isin(tok, stops)
        may_finish = is_stop if finish_from == "candidates" else is_stop & (torch.arange(tok.shape[1], device=device) < K)
        lp = float(length_divisor(L, kind, alpha))

        def finish(raw: Tensor, pos: Tensor, allowed: Tensor) -> None:
            """Make candidate ``pos`` of each sentence its best hypothesis where it beats the old one."""
            nonlocal best, best_tokens, best_len
            better = allowed & ~done & (raw / lp > best)
            rows = offsets[:, 0] + beam.gather(1, pos[:, None]).squeeze(1)  # (B,)
            seq = torch.where(columns == t, tok.gather(1, pos[:, None]), alive_tokens[rows])  # (B, N), pad after L
            best_tokens = torch.where(better[:, None], seq, best_tokens)
            best = torch.where(better, raw / lp, best)
            best_len = torch.where(better, L, best_len)

        stop_raw, stop_pos = top_s.masked_fill(~may_finish, float("-inf")).max(dim=1)
        finish(stop_raw, stop_pos, torch.isfinite(stop_raw))
        # the K best candidates that do not stop go on (stable order: stops last)
        n = top_s.shape[1]
        order = (is_stop.long() * n + torch.arange(n, device=device)).argsort(dim=1)[:, :K]
        at_max = L >= max_len
        finish(top_s.gather(1, order[:, :1]).squeeze(1), order[:, 0], at_max & torch.isfinite(top_s[:, 0]))
        alive = top_s.gather(1, order).masked_fill((done | at_max)[:, None], float("-inf"))
        reachable = alive.max(dim=1).values / max_lp
        done = done | at_max | (best >= reachable)
        if t + 1 == N or (t + 1) % check_every == 0 and bool(done.all()):
            break
        rows = einops.rearrange(offsets + beam.gather(1, order), "b k -> (b k)")
        next_tok = einops.rearrange(tok.gather(1, order), "b k -> (b k)")
        alive_tokens = torch.where(columns == t, next_tok[:, None], alive_tokens[rows])
        stepper.reorder(rows)
        logits = stepper.step(next_tok)
    return Generation(best_tokens[:, : int(best_len.max())], best, best_len)
