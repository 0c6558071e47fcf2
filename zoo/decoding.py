"""Static decoding: the model's step on a preallocated KV cache (:mod:`zoo.components.static_cache`),
optionally compiled, for :func:`zoo.generate` with ``cache="static"``.

The prompt (a decoder's) or the first target token (an encoder-decoder's, whose cross-attention
keys/values are then computed once) runs eagerly; every later step feeds one token per row through
:meth:`StaticStepper.step`, whose shapes never change: the write position is a tensor in the cache,
attention reads the whole buffer through a mask. With ``compile`` the step is
``torch.compile(fullgraph=True)``: one graph, compiled at the first step, no recompilation from step
to step. The compiled function is shared by every call (one per mode), with the rows, the capacity
and the source length marked dynamic: one graph serves every batch (one for steps that reorder beams,
one for those that do not), so the translation recipe's batches of many shapes compile it once. On
CUDA the default mode
is ``reduce-overhead`` (CUDA graphs: the cache's buffers are marked as static addresses and written
and reordered in place; the graph is recorded once per distinct shape).

Shapes: B sentences, K beams, R = B*K rows, V vocabulary.
"""

from __future__ import annotations

import functools

import einops
import torch
from torch import Tensor, nn

from zoo.protocols import Generates

__all__ = ["StaticStepper", "compile_mode", "decodes_from"]


def decodes_from(model: nn.Module) -> str:
    """How ``model`` generates, as its family declares (:class:`zoo.protocols.Generates`): ``"prompt"``
    (a decoder continues its input) or ``"source"`` (an encoder-decoder encodes it, then decodes)."""
    how = model.decodes_from if isinstance(model, Generates) else None
    if how not in ("prompt", "source"):
        raise ValueError(f"generate: a {type(model).__name__} does not generate (it declares decodes_from "
                         f"{how!r}); generate from a decoder or an encoder-decoder")
    return how


def compile_mode(compile: bool | str, device: torch.device) -> str | None:
    """The ``torch.compile`` mode for generate's ``compile`` argument: None (no compilation), the
    mode a string names, or for True ``reduce-overhead`` on CUDA (CUDA graphs) and ``default`` elsewhere."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return "reduce-overhead" if device.type == "cuda" else "default"
    if isinstance(compile, str) and compile in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        return compile
    raise ValueError(f"generate: compile must be True, False or a torch.compile mode ('default', 'reduce-overhead', "
                     f"'max-autotune', 'max-autotune-no-cudagraphs'), got {compile!r}")


def refusal(model: nn.Module, compiled: bool) -> str | None:
    """Why ``model`` cannot decode with a static cache (compiled: or compile its step), or None."""
    decodes_from(model)
    cached = model.kv_cache()  # the stack whose keys and values decoding caches (zoo.models.Family)
    if cached is None:
        return f"{type(model).__name__} has no decoder stack to cache"
    stack = cached[0]
    if compiled:
        for pos in [model.position, *stack.positions]:
            if pos.reads_host:
                return ("a dynamic RoPE scaling sets its frequencies from the longest position on the host at every "
                        "step; use compile=False (the static cache itself works)")
    return None


def _step(stepper: StaticStepper, tokens: Tensor, rows: Tensor | None) -> Tensor:
    if rows is not None:  # beam search's reordering, in the same graph as the step
        stepper.cache.reorder(rows)
    return stepper.forward(tokens)


@functools.cache
def compiled_step(mode: str):
    """``torch.compile`` of one decoding step in ``mode``, made once per process and mode."""
    return torch.compile(_step, fullgraph=True, mode=mode)


class StaticStepper:
    """Feeds a model one step at a time through a static cache; the interface of generate's
    ``_Stepper`` (``first``, ``step``, ``reorder``). ``new_tokens``: the most tokens generated per row."""

    def __init__(self, model: nn.Module, inputs: Tensor, mask: Tensor | None, *, repeat: int, new_tokens: int,
                 bos_id: int | None, mode: str | None = None) -> None:
        why = refusal(model, mode is not None)
        if why:
            raise ValueError(f"generate: cache='static'{' with compile' if mode else ''}: {why}")
        self.model = model
        self.encdec = decodes_from(model) == "source"
        device = inputs.device
        rows = inputs.shape[0] * repeat
        stack = model.kv_cache()[0]
        if self.encdec:
            if bos_id is None:
                raise ValueError("generate: an encoder-decoder needs bos_id, the token the target starts with")
            memory = model.encode(inputs, mask)
            self.memory = einops.repeat(memory, "b s d -> (b k) s d", k=repeat)  # each sentence's beams in a row
            # a copy of its own (marked static below), never the caller's tensor
            self.mask = einops.repeat(mask, "b s -> (b k) s", k=repeat).clone() if mask is not None else None
            self.prompt = torch.full((rows, 1), bos_id, dtype=torch.long, device=device)
            self.prompt_mask = None
            capacity = new_tokens
        else:
            self.memory = self.mask = None
            self.prompt = einops.repeat(inputs, "b t -> (b k) t", k=repeat)
            self.prompt_mask = einops.repeat(mask, "b t -> (b k) t", k=repeat) if mask is not None else None
            capacity = inputs.shape[1] + new_tokens
        # slots used: the prompt and every generated token but the last (never fed back)
        used = capacity - 1
        for pos in [model.position, *stack.positions]:
            if pos.max_len is not None and used > pos.max_len:
                raise ValueError(f"generate: prompt and new tokens ({used}) exceed max_seq_len ({pos.max_len}) of the "
                                 f"position table; ask for fewer new tokens or truncate the input")
        if self.mask is not None:
            torch._dynamo.mark_static_address(self.mask)  # read by every step in place
        self.cache = stack.new_static_cache(capacity, rows, device)
        self.mode = mode
        self.graphs = mode in ("reduce-overhead", "max-autotune") and device.type == "cuda"
        self._step = _step if mode is None else compiled_step(mode)
        self.rows: Tensor | None = None  # a reordering that waits for the next step

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [R, T] -> the last position's logits [R, V], through the cache."""
        if self.encdec:  # the memory's keys/values are in the cache since the first call
            out = self.model.decode(tokens, None, self.mask, None, cache=self.cache, last_only=True)
        else:
            out = self.model(tokens, None, cache=self.cache, last_only=True)
        return out[:, -1]

    def first(self) -> Tensor:
        """The prompt (or the start token), eagerly: its length is not a step's."""
        if self.encdec:
            logits = self.model.decode(self.prompt, self.memory, self.mask, None, cache=self.cache, last_only=True)
            for layer in self.cache.layers:  # the memory's keys/values, computed now: every step reads them in place
                for t in layer.memory_kv or ():
                    torch._dynamo.mark_static_address(t)
            logits = logits[:, -1]
        else:
            logits = self.model(self.prompt, self.prompt_mask, cache=self.cache, last_only=True)[:, -1]
        if self.mode is not None:
            self._sizes_vary()
        return logits

    def _sizes_vary(self) -> None:
        """Compile the step for any rows, capacity and source length at once (the translation
        recipe's batches differ in all three), rather than once for the first shapes and again
        (torch's automatic dynamic shapes)."""
        mark = torch._dynamo.maybe_mark_dynamic
        c = self.cache
        for t in (c.real, c.key_positions, c.next_position, c.slot_ids, self.mask):
            if t is not None:
                for d in range(t.dim()):
                    mark(t, d)
        for layer in c.layers:
            for t in (layer.k, layer.v, *(layer.memory_kv or ())):
                if t is not None:
                    mark(t, 0)
                    mark(t, 2)

    def step(self, tokens: Tensor) -> Tensor:
        """One token per row [R] -> logits [R, V] (with CUDA graphs: valid until the next step)."""
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        rows, self.rows = self.rows, None
        tokens = tokens[:, None]
        if self.mode is not None:
            torch._dynamo.maybe_mark_dynamic(tokens, 0)
            if rows is not None:
                torch._dynamo.maybe_mark_dynamic(rows, 0)
        return self._step(self, tokens, rows)

    def reorder(self, rows: Tensor) -> None:
        """Row i becomes old row ``rows[i]``: applied by the next step, in its graph."""
        self.rows = rows if self.rows is None else self.rows[rows]
