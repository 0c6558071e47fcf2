"""What a spec costs: parameters by part, FLOPs, activation memory, KV cache — from a model built on
the meta device, so even the big presets answer at once.

Conventions (tests/test_cli_io.py works a small decoder through by hand and checks the counts
against ``torch.utils.flop_counter`` and what autograd keeps):

* FLOPs count multiply-adds as two and only matrix products (linear layers, the patch convolution,
  the attention scores q·k and the weighted sum of values), as ``torch.utils.flop_counter`` does.
  The score term counts the full T x T matrix even for causal models (fused kernels skip about half).
  "Per token" is one sequence's forward pass divided by its length (an encoder-decoder's: a source
  and a target of that length, per target token); a ViT is counted per image. Training is three
  forward passes (the backward pass costs two).
* Activation memory is what a training step keeps for the backward pass at a batch and length, in
  the given dtype, assuming fused attention (no T x T matrix is stored), plus the logits the loss
  reads and one byte per element of each dropout mask. A soft-capped attention, which runs on
  explicit scores (``zoo.kernels.scores_attention``), counts the three H x T x S tensors it keeps.
  (On CPU, zoo's own attention kernel, ``zoo.kernels.cpu.attention``, keeps the H x T x S weights
  too for the short sequences it takes.)
* The KV cache is the keys and values a decoder keeps per generated token; a layer with a sliding
  window holds the window - 1 tokens before the next one, a global layer every token.
* A mixture of experts counts every expert in ``parameters`` and only what one token uses in
  ``active_parameters`` (the router, ``top_k`` experts and the shared expert: its
  ``active_parameters()`` declaration) and in the FLOPs (its ``flops`` declaration).
* Everything comes from what the family declares (:class:`zoo.models.family.Family`: its stacks,
  FLOPs, saved activations, KV cache, the part of each parameter), so a registered family counts
  like a built-in one.
* :func:`training_memory` plans one process's training memory (fp32 master weights, their gradients,
  AdamW's two moments, the activations) for ``ddp`` (every process holds everything) or ``fsdp``
  (weights, gradients and optimizer state divided over the processes, plus the units FSDP gathers
  whole while they run), with or without activation checkpointing; ``experts`` is the routed experts'
  share of it (FSDP2 splits each stacked expert weight along its first dimension, the experts). It leaves out what the
  framework itself takes (CUDA context, allocator slack, code); ``python -m bench --only memory``
  measures it against real runs.

A block's parts are asked, not recognised: their FLOPs, saved activations and head sizes come from
their declarations or the fallbacks in :mod:`zoo.components.parts`, so registered parts count too.

Shapes: B batch, T tokens, S source tokens, D model width, H heads, G key/value heads, K and V head
sizes, F FFN hidden size, L layers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from zoo.build import build, count_parameters
from zoo.components import parts
from zoo.models.family import Family
from zoo.protocols import Experts
from zoo.spec import FamilySpec

__all__ = ["PARTS", "Summary", "summarize", "parameter_parts", "active_parameters", "expert_parameters", "forward_flops",
           "activation_bytes", "kv_cache_bytes", "MemoryPlan", "training_memory"]

PARTS = ("embeddings", "attention", "ffn", "norms", "head")


@dataclass(frozen=True)
class Summary:
    name: str
    family: str
    dtype: str
    bytes_per_element: int
    parameters: int
    parts: dict[str, int]  # PARTS -> distinct parameters; a tied matrix counts where it is first seen
    tied: dict[str, str]  # alias -> the name that owns the tensor
    tied_parts: dict[str, str]  # alias -> the part it would belong to
    unit: str  # "token" or "image"
    batch: int
    seq: int  # tokens per sequence (a ViT's: patches + class token)
    flops_forward: int | None  # per unit
    flops_training: int | None
    activation_bytes: int | None  # a training step at batch x seq
    kv_cache_bytes_per_token: int | None  # decoders only: every layer's keys and values of one token
    cross_kv_bytes_per_source_token: int | None  # encoder-decoders only
    kv_cache_tokens: int | None = None  # tokens a sequence's cache holds at seq: all, or a sliding window's
    layers: tuple[dict, ...] = ()  # per layer of each stack: parameters, FLOPs per unit, window, KV cache, sinks
    active_parameters: int | None = None  # what one token's forward pass uses (mixtures of experts: top_k experts)
    expert_parameters: int = 0  # the routed experts' parameters, all of them (0: no mixture of experts)
    linear_state_bytes: int | None = None  # linear-attention layers' fixed-size state of one sequence (gated DeltaNet)

    @property
    def weight_bytes(self) -> int:
        return self.parameters * self.bytes_per_element

    @property
    def kv_cache_bytes(self) -> int | None:
        """The self-attention cache of ``batch`` sequences of ``seq`` tokens: each layer's keys and
        values of the tokens it holds (a windowed layer the window - 1 before the next token)."""
        held = [layer["kv_cache_bytes"] for layer in self.layers if layer.get("kv_cache_bytes") is not None]
        return sum(held) * self.batch if held else None

    def to_dict(self) -> dict:
        return {**asdict(self), "weight_bytes": self.weight_bytes, "kv_cache_bytes": self.kv_cache_bytes}


def _family(model: nn.Module):
    """The model's declarations: its own where it is a :class:`Family`, else Family's defaults."""
    return model if isinstance(model, Family) else _Undeclared(model)


class _Undeclared:
    """Family's default declarations for a model that does not subclass it."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __getattr__(self, name: str):
        own = getattr(self.model, name, None)
        if own is not None:
            return own
        attr = getattr(Family, name)
        return attr.__get__(self.model) if callable(attr) else attr


# ------------------------------------------------------------------------------------- parameters
def parameter_parts(model: nn.Module) -> dict[str, int]:
    """Distinct parameters per part; the parts sum to ``count_parameters(model)``."""
    parts = dict.fromkeys(PARTS, 0)
    fam = _family(model)
    for name, p in model.named_parameters():  # a tied parameter once, under its first name
        parts[fam.parameter_part(name)] += p.numel()
    return parts


def active_parameters(model: nn.Module) -> int:
    """The parameters one token's forward pass uses: all, less the experts a mixture of experts leaves
    idle (what its ``active_parameters()`` declaration leaves out)."""
    idle = sum(sum(p.numel() for p in m.parameters()) - m.active_parameters() for m in model.modules()
               if isinstance(m, Experts))
    return count_parameters(model) - idle


def expert_parameters(model: nn.Module) -> list[tuple[int, int]]:
    """(experts, parameters of one expert) of each mixture of experts in ``model`` (its
    ``n_experts`` and ``expert_parameters()`` declarations), in module order."""
    return [(m.n_experts, m.expert_parameters() // m.n_experts) for m in model.modules()
            if isinstance(m, Experts)]


def _tied(model: nn.Module) -> dict[str, str]:
    first: dict[int, str] = {}
    tied = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


# ------------------------------------------------------------------------------------------ FLOPs
def forward_flops(model: nn.Module, seq: int) -> int:
    """FLOPs of one forward pass of one sample: a sequence of ``seq`` tokens (an encoder-decoder:
    source and target both ``seq`` long), or one image; what the family declares."""
    return _family(model).flops(seq)


# ------------------------------------------------------------------------------ activation memory
def activation_bytes(model: nn.Module, *, batch: int, seq: int, bytes_per_element: int,
                     checkpointing: bool = False) -> int:
    """An estimate of the activations a training step keeps for the backward pass (see the module
    docstring). ``checkpointing``: each block keeps only its input, and the backward pass recomputes
    one block's activations at a time."""
    fam = _family(model)
    elements, masks = fam.saved(seq)
    full = batch * (elements * bytes_per_element + masks)
    if not checkpointing:
        return full
    rotates = getattr(getattr(model, "position", None), "rotates", False)
    kept = largest = 0
    for stack, tokens, memory in fam.stacks(seq):
        e, m = stack.saved(tokens, memory, rotates=rotates, final_norm=False)
        blocks = batch * (e * bytes_per_element + m)
        full -= blocks
        kept += batch * len(stack.blocks) * tokens * model.spec.d_model * bytes_per_element
        largest = max(largest, blocks // len(stack.blocks))
    return full + kept + largest


# --------------------------------------------------------------------------------------- KV cache
def kv_cache_bytes(model: nn.Module, bytes_per_element: int) -> tuple[int | None, int | None]:
    """(self-attention cache per generated token, cross-attention cache per source token)."""
    found = _family(model).kv_cache()
    if found is None:
        return None, None
    stack, cross = found
    return (stack.kv_elements() * bytes_per_element,
            stack.kv_elements(cross=True) * bytes_per_element if cross else None)


def _layers(model: nn.Module, seq: int, bytes_per_element: int) -> tuple[dict, ...]:
    """A row per layer of each stack: its parameters, forward FLOPs per sample, window, its attention
    sinks' parameters where it has them and, where the model decodes, the bytes of keys and values it
    holds for one sequence of ``seq`` tokens."""
    fam = _family(model)
    cached = fam.kv_cache()
    rows = []
    names = {id(m): n for n, m in model.named_children()}
    for stack, tokens, memory in fam.stacks(seq):
        for i, block in enumerate(stack.blocks):
            window = stack.windows[i]
            row = {"stack": names.get(id(stack), "stack"), "layer": i, "kind": type(block).__name__,
                   "parameters": sum(p.numel() for p in block.parameters()),
                   "flops": parts.flops(block, tokens, memory), "window": window}
            sinks = getattr(getattr(block, "attn", None), "sinks", None)
            if sinks is not None:  # attention sinks (gpt-oss): a learned logit per head
                row["sinks"] = sinks.numel()
            own = _own_position(stack, i)
            if own is not None:  # a position of the layer's own with weights (RoPE-Mixed's frequencies, BEiT's bias)
                row["position_parameters"] = sum(p.numel() for p in own.parameters())
            if cached is not None and cached[0] is stack:
                kept = getattr(stack, "kept", stack.windows)[i]  # a chunk's keys too
                held = tokens if kept is None else min(tokens, kept - 1)
                row.update(kv_tokens=held, kv_cache_bytes=parts.cache_elements(block.attn) * held * bytes_per_element)
                state = parts.state_elements(getattr(block, "attn", None))
                if state:  # a linear-attention layer: a fixed-size state, not per token
                    row.update(kv_tokens=0, state_bytes=state * bytes_per_element)
            rows.append(row)
    return tuple(rows)


def _own_position(stack: nn.Module, i: int) -> nn.Module | None:
    """Layer ``i``'s position module where no other layer shares it and it has weights, else None."""
    variants, of = getattr(stack, "variants", None), getattr(stack, "variant_of", None)
    if variants is None or of is None or variants[of[i]][1] < 0:
        return None
    own = variants[of[i]][1]
    alone = sum(variants[v][1] == own for v in of) == 1
    module = stack.positions[own]
    return module if alone and any(True for _ in module.parameters()) else None


# ---------------------------------------------------------------------------------------- summary
def summarize(
    spec: FamilySpec,
    *,
    batch: int = 1,
    seq: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> Summary:
    """Costs of ``spec`` at ``batch`` sequences of ``seq`` tokens (default: ``max_seq_len``; a ViT's
    length is fixed by its image and patch sizes) with tensors in ``dtype``."""
    return _summarize(spec, build(spec, device="meta"), batch=batch, seq=seq, dtype=dtype)


def _summarize(spec: FamilySpec, model: nn.Module, *, batch: int, seq: int | None, dtype: torch.dtype) -> Summary:
    """:func:`summarize` of ``model``, built from ``spec`` on the meta device."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    fam = _family(model)
    unit = fam.unit
    if unit != "token":
        fixed = fam.sequence(1)
        if seq is not None and seq != fixed:
            raise ValueError(f"seq: a {spec.family}'s length is fixed by its spec ({fixed} tokens); leave it out")
        seq = fixed
    else:
        longest = getattr(getattr(model, "position", None), "max_len", None)
        if seq is None:
            seq = getattr(spec, "max_seq_len", 1)
        if seq < 1:
            raise ValueError(f"seq must be at least 1, got {seq}")
        if longest is not None and seq > longest:
            raise ValueError(
                f"seq ({seq}) exceeds max_seq_len ({longest}) of the {spec.position.kind} position table; "
                f"choose a shorter seq or set max_seq_len"
            )
    p = dtype.itemsize
    flops = forward_flops(model, seq)
    if unit == "token":
        flops //= seq
    kv, cross = kv_cache_bytes(model, p)
    tied = _tied(model)
    layers = _layers(model, seq, p)
    held = [row["kv_tokens"] for row in layers if "kv_tokens" in row]
    states = [row["state_bytes"] for row in layers if "state_bytes" in row]
    return Summary(
        name=spec.name or spec.family,
        family=spec.family,
        dtype=str(dtype).removeprefix("torch."),
        bytes_per_element=p,
        parameters=count_parameters(model),
        parts=parameter_parts(model),
        tied=tied,
        tied_parts={alias: fam.parameter_part(alias) for alias in tied},
        unit=unit,
        batch=batch,
        seq=seq,
        flops_forward=flops,
        flops_training=3 * flops,
        activation_bytes=activation_bytes(model, batch=batch, seq=seq, bytes_per_element=p),
        kv_cache_bytes_per_token=kv,
        cross_kv_bytes_per_source_token=cross,
        kv_cache_tokens=max(held) if held else None,
        layers=layers,
        active_parameters=active_parameters(model),
        expert_parameters=sum(e * per for e, per in expert_parameters(model)),
        linear_state_bytes=sum(states) if states else None,
    )


# ------------------------------------------------------------------------------- training memory
@dataclass(frozen=True)
class MemoryPlan:
    """One process's training memory in bytes (see :func:`training_memory`)."""

    processes: int
    strategy: str
    checkpointing: bool
    precision: str
    batch: int
    seq: int
    parameters: int  # fp32 master weights this process keeps (its shard under fsdp)
    gradients: int  # their gradients (+ DDP's communication buckets)
    optimizer: int  # AdamW's two moments
    gathered: int  # fsdp: units gathered whole while they run (the root, a block and the next); bf16: weight copies
    activations: int
    experts: int = 0  # of parameters + gradients + optimizer: the routed experts' (their shard under fsdp)

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.gathered + self.activations

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def training_memory(spec: FamilySpec, *, processes: int = 1, strategy: str = "ddp", checkpointing: bool = False,
                    batch: int = 1, seq: int | None = None, precision: str = "fp32") -> MemoryPlan:
    """Plan one process's memory for training ``spec`` with AdamW on ``processes`` processes, each
    with ``batch`` sequences of ``seq`` tokens.

    ddp: every process keeps the fp32 weights (4 bytes each), gradients (4, and 4 more in DDP's
    buckets when there is more than one process) and AdamW's moments (8). fsdp: those divided by
    the processes, plus the units FSDP gathers whole: the root (embeddings, head, final norm; it
    stays gathered from forward to backward) and two blocks (the running one and the next,
    prefetched), with a block's unsharded gradients before they are reduced. bf16: computing copies
    of the weights in 2 bytes (autocast's cache, or FSDP's bf16 gathers) and activations in 2 bytes.
    ``experts``: the routed experts' part of the weights, gradients and moments; under fsdp each
    layer's stacked expert weights split along the experts, ``ceil(E / processes)`` of them on the
    process holding the most.
    """
    if processes < 1:
        raise ValueError(f"--shard: the number of processes must be at least 1, got {processes}")
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"--strategy: ddp or fsdp, got {strategy!r}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision: fp32 or bf16, got {precision!r}")
    model = build(spec, device="meta")
    summary = _summarize(spec, model, batch=batch, seq=seq, dtype=torch.float32)
    compute = 2 if precision == "bf16" else 4
    n = summary.parameters
    distinct = {id(b): b for stack, _, _ in _family(model).stacks(summary.seq) for b in stack.blocks}  # shared_layers: once
    blocks = [count_parameters(b) for b in distinct.values()]
    block = max(blocks, default=0)
    root = n - sum(blocks)
    if strategy == "fsdp" and processes > 1:
        shard = -(-n // processes)
        params, grads, optim = 4 * shard, 4 * shard, 8 * shard
        gathered = compute * (root + min(2, len(blocks)) * block) + 4 * block
        experts = 16 * sum(-(-e // processes) * per for e, per in expert_parameters(model))
    else:
        params, optim = 4 * n, 8 * n
        grads = 4 * n * (2 if processes > 1 else 1)
        gathered = 2 * n if precision == "bf16" else 0
        experts = (16 if processes == 1 else 20) * sum(e * per for e, per in expert_parameters(model))
    activations = activation_bytes(model, batch=batch, seq=summary.seq, bytes_per_element=compute,
                                   checkpointing=checkpointing)
    return MemoryPlan(processes=processes, strategy=strategy, checkpointing=checkpointing, precision=precision,
                      batch=batch, seq=summary.seq, parameters=params, gradients=grads, optimizer=optim,
                      gathered=gathered, activations=activations, experts=experts)
