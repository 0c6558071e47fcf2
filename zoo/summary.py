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
  reads and one byte per element of each dropout mask. (On CPU, zoo's own attention kernel,
  ``zoo.kernels.cpu.attention``, keeps the H x T x S weights too for the short sequences it takes.)
* The KV cache is the keys and values a decoder keeps per generated token.
* :func:`training_memory` plans one process's training memory (fp32 master weights, their gradients,
  AdamW's two moments, the activations) for ``ddp`` (every process holds everything) or ``fsdp``
  (weights, gradients and optimizer state divided over the processes, plus the units FSDP gathers
  whole while they run), with or without activation checkpointing. It leaves out what the
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
from zoo.components.block import Block, LayerScale, Stack
from zoo.components.embedding import PatchEmbedding
from zoo.components.norm import RMSNorm
from zoo.components.position import Position
from zoo.spec import FamilySpec

__all__ = ["PARTS", "Summary", "summarize", "parameter_parts", "forward_flops", "activation_bytes", "kv_cache_bytes",
           "MemoryPlan", "training_memory"]

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
    kv_cache_bytes_per_token: int | None  # decoders only
    cross_kv_bytes_per_source_token: int | None  # encoder-decoders only
    kv_cache_tokens: int | None = None  # tokens a sequence's cache holds at seq: all, or a sliding window's

    @property
    def weight_bytes(self) -> int:
        return self.parameters * self.bytes_per_element

    def to_dict(self) -> dict:
        return {**asdict(self), "weight_bytes": self.weight_bytes}


# ------------------------------------------------------------------------------------- parameters
def _norm_like(name: str, module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, RMSNorm, nn.RMSNorm)) or name.endswith("norm")


def _part_in_block(attr: str) -> str:
    if attr in ("attn", "cross_attn"):
        return "attention"
    return "ffn" if attr == "ffn" else "norms"


def _part(model: nn.Module, name: str) -> str:
    """Which part a parameter belongs to, by where it sits: inside a block its slot decides
    (attention, FFN, norms); outside, embeddings and positions, norms, and the rest is head."""
    path = name.split(".")[:-1]
    if not path:
        return "embeddings"  # a bare parameter of the model: the class token
    top = getattr(model, path[0])
    if isinstance(top, Stack):
        node: nn.Module = top
        for attr in path[1:]:
            if isinstance(node, Block):
                return _part_in_block(attr)
            node = getattr(node, attr)
        return "norms"  # the stack's final norm
    if isinstance(top, (nn.Embedding, Position, PatchEmbedding)):
        return "embeddings"
    return "norms" if _norm_like(path[0], top) else "head"


def parameter_parts(model: nn.Module) -> dict[str, int]:
    """Distinct parameters per part; the parts sum to ``count_parameters(model)``."""
    parts = dict.fromkeys(PARTS, 0)
    for name, p in model.named_parameters():  # a tied parameter once, under its first name
        parts[_part(model, name)] += p.numel()
    return parts


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
def _stack_flops(stack: Stack, tokens: int, memory: int | None = None) -> int:
    """Every block's parts: self-attention and FFN over the ``tokens``; cross-attention's queries
    from them and keys/values from the ``memory`` sources."""
    total = 0
    for block in stack.blocks:
        total += parts.flops(block.attn, tokens) + parts.flops(block.ffn, tokens)
        total += parts.flops(block.cross_attn, tokens, memory)
    return total


def forward_flops(model: nn.Module, seq: int) -> int | None:
    """FLOPs of one forward pass of one sample: a sequence of ``seq`` tokens (an encoder-decoder:
    source and target both ``seq`` long), or one image. None for a family this does not know."""
    family = model.spec.family
    if family in ("decoder", "encoder"):  # an encoder's forward is its masked-LM head, not the classifier
        return _stack_flops(model.stack, seq) + parts.linear_flops(model.head, seq)
    if family == "encoder_decoder":
        stacks = _stack_flops(model.encoder, seq) + _stack_flops(model.decoder, seq, seq)
        return stacks + parts.linear_flops(model.head, seq)
    if family == "vit":
        patches = model.spec.grid[0] * model.spec.grid[1]
        pool = parts.flops(model.pool, patches)  # attention pooling: keys and values of every patch
        return _patch_flops(model) + _stack_flops(model.stack, model.spec.n_tokens) + pool + parts.linear_flops(model.head, 1)
    return None


def _patch_flops(model: nn.Module) -> int:
    """A ViT's patch embedding: each convolution's multiply-adds at its output resolution."""
    side, total = model.spec.image_size, 0
    for conv in [m for m in model.patch_embed.modules() if isinstance(m, nn.Conv2d)]:
        side //= conv.stride[0]
        total += 2 * conv.weight.numel() * side * side
    return total


# ------------------------------------------------------------------------------ activation memory
def _norm_extra(norm: nn.Module, d: int) -> int:
    return d if isinstance(norm, RMSNorm) else 0  # RMSNorm keeps its normalised input for the weight's grad


def _qk_norm_copies(attention: nn.Module) -> int:
    """Copies of q and k a qk-norm keeps: its output, and LayerNorm a contiguous copy of its input
    (q and k are strided views of the fused projection), RMSNorm the normalised input its weight's
    gradient needs."""
    return 2 if isinstance(getattr(attention, "q_norm", None), nn.Module) else 0


def _rotates(position: Position | None) -> bool:
    return position is not None and type(position).rotate is not Position.rotate


def _stack_activations(
    stack: Stack, spec: FamilySpec, tokens: int, memory: int | None = None, *, rotates: bool = False,
    final_norm: bool = True,
) -> tuple[int, int]:
    """(elements, dropout-mask bytes) one sample keeps in a stack: per sub-layer the norm's input,
    the projection's input and outputs (q, k, v, attention output), the FFN's hidden activations.
    A rotating position (RoPE) and a qk-norm keep copies of q and k beside the projection's output;
    a layer scale keeps the sub-layer's output."""
    d, drop = spec.d_model, spec.dropout
    elements = masks = 0
    for block in stack.blocks:
        extra = _norm_extra(block.attn_norm, d)
        ls = d if isinstance(getattr(block, "ls_attn", None), LayerScale) else 0  # a layer scale keeps its input
        H, G, K, V = parts.head_sizes(block.attn, d)
        qk = (H + G) * K * (rotates + _qk_norm_copies(block.attn))
        elements += tokens * (2 * d + extra + ls + H * K + G * (K + V) + H * V + qk)
        elements += tokens * (2 * d + extra + ls + parts.saved_per_token(block.ffn))
        sublayers = 2
        if block.cross_attn is not None:
            H, G, K, V = parts.head_sizes(block.cross_attn, d)
            qk = _qk_norm_copies(block.cross_attn)
            elements += tokens * (2 * d + extra + ls + H * K * (1 + qk) + H * V) + memory * G * (K * (1 + qk) + V)
            sublayers = 3
        if drop.residual:
            masks += tokens * sublayers * d
        if drop.ffn:
            masks += tokens * parts.saved_per_token(block.ffn) // 2
    if final_norm and not isinstance(stack.norm, nn.Identity):
        elements += tokens * (d + _norm_extra(stack.norm, d))
    return elements, masks


def _stacks(model: nn.Module, seq: int) -> list[tuple[Stack, int, int | None]]:
    """(stack, its tokens, its memory tokens) of each block stack of a zoo model."""
    spec = model.spec
    if spec.family == "encoder_decoder":
        return [(model.encoder, seq, None), (model.decoder, seq, seq)]
    return [(model.stack, spec.n_tokens if spec.family == "vit" else seq, None)]


def activation_bytes(model: nn.Module, *, batch: int, seq: int, bytes_per_element: int,
                     checkpointing: bool = False) -> int | None:
    """An estimate of the activations a training step keeps for the backward pass (see the module
    docstring); None for a family this does not know. ``checkpointing``: each block keeps only its
    input, and the backward pass recomputes one block's activations at a time."""
    full = _activation_bytes(model, batch=batch, seq=seq, bytes_per_element=bytes_per_element)
    if full is None or not checkpointing:
        return full
    spec, kept, largest = model.spec, 0, 0
    for stack, tokens, memory in _stacks(model, seq):
        elements, masks = _stack_activations(stack, spec, tokens, memory, rotates=_rotates(getattr(model, "position", None)),
                                             final_norm=False)
        blocks = batch * (elements * bytes_per_element + masks)
        full -= blocks
        kept += batch * len(stack.blocks) * tokens * spec.d_model * bytes_per_element
        largest = max(largest, blocks // len(stack.blocks))
    return full + kept + largest


def _activation_bytes(model: nn.Module, *, batch: int, seq: int, bytes_per_element: int) -> int | None:
    spec, family = model.spec, model.spec.family
    d = spec.d_model
    emb_mask = d if spec.dropout.embedding else 0
    if family in ("decoder", "encoder"):
        elements, masks = _stack_activations(model.stack, spec, seq, rotates=_rotates(model.position))
        if not isinstance(getattr(model, "emb_norm", nn.Identity()), nn.Identity):
            elements += seq * (d + _norm_extra(model.emb_norm, d))
        head = d if family == "decoder" or not spec.mlm_head.transform else 4 * d + _norm_extra(model.head.transform[-1], d)
        elements += seq * (head + spec.vocab_size)  # the head's input and the logits the loss reads
        masks += seq * emb_mask
    elif family == "encoder_decoder":
        rotates = _rotates(model.position)
        enc, enc_masks = _stack_activations(model.encoder, spec, seq, rotates=rotates)
        dec, dec_masks = _stack_activations(model.decoder, spec, seq, memory=seq, rotates=rotates)
        elements = enc + seq * d + dec + seq * (d + spec.vocab_size)  # + the memory, the head's input, logits
        masks = enc_masks + dec_masks + 2 * seq * emb_mask
    elif family == "vit":
        n = spec.n_tokens
        elements, masks = _stack_activations(model.stack, spec, n)
        elements += spec.in_channels * spec.image_size**2 + 2 * d + spec.num_classes  # images, pooled, logits
        pool_saved = getattr(model.pool, "saved_per_token", None)  # attention pooling keeps its keys and values
        if callable(pool_saved):
            elements += spec.grid[0] * spec.grid[1] * pool_saved()
        if spec.stem is not None:  # each stem layer keeps its conv output (BatchNorm's input) and its ReLU output
            side = spec.image_size
            for channels, stride in zip(spec.stem.channels, spec.stem.layer_strides):
                side //= stride
                elements += 2 * channels * side * side
        masks += n * emb_mask
    else:
        return None
    return batch * (elements * bytes_per_element + masks)


# --------------------------------------------------------------------------------------- KV cache
def _kv_bytes(stack: Stack, bytes_per_element: int, *, cross: bool = False) -> int:
    total = 0
    for block in stack.blocks:
        att = block.cross_attn if cross else block.attn
        _, G, K, V = parts.head_sizes(att, 0)
        total += G * (K + V) * bytes_per_element
    return total


def kv_cache_bytes(model: nn.Module, bytes_per_element: int) -> tuple[int | None, int | None]:
    """(self-attention cache per generated token, cross-attention cache per source token)."""
    family = model.spec.family
    if family == "decoder":
        return _kv_bytes(model.stack, bytes_per_element), None
    if family == "encoder_decoder":
        return _kv_bytes(model.decoder, bytes_per_element), _kv_bytes(model.decoder, bytes_per_element, cross=True)
    return None, None


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
    if spec.family == "vit":
        if seq is not None and seq != spec.n_tokens:
            raise ValueError(
                f"seq: a ViT's length is fixed by image_size/patch_size ({spec.n_tokens} tokens); leave it out"
            )
        seq, unit = spec.n_tokens, "image"
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
        unit = "token"
    p = dtype.itemsize
    flops = forward_flops(model, seq)
    if flops is not None and unit == "token":
        flops //= seq
    kv, cross = kv_cache_bytes(model, p)
    tied = _tied(model)
    return Summary(
        name=spec.name or spec.family,
        family=spec.family,
        dtype=str(dtype).removeprefix("torch."),
        bytes_per_element=p,
        parameters=count_parameters(model),
        parts=parameter_parts(model),
        tied=tied,
        tied_parts={alias: _part(model, alias) for alias in tied},
        unit=unit,
        batch=batch,
        seq=seq,
        flops_forward=flops,
        flops_training=None if flops is None else 3 * flops,
        activation_bytes=activation_bytes(model, batch=batch, seq=seq, bytes_per_element=p),
        kv_cache_bytes_per_token=kv,
        cross_kv_bytes_per_source_token=cross,
        kv_cache_tokens=None if kv is None else min(seq, getattr(spec.block.attention, "window", None) or seq),
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
    blocks = [count_parameters(b) for stack, _, _ in _stacks(model, summary.seq) for b in stack.blocks]
    block = max(blocks, default=0)
    root = n - sum(blocks)
    if strategy == "fsdp" and processes > 1:
        shard = -(-n // processes)
        params, grads, optim = 4 * shard, 4 * shard, 8 * shard
        gathered = compute * (root + 2 * block) + 4 * block
    else:
        params, optim = 4 * n, 8 * n
        grads = 4 * n * (2 if processes > 1 else 1)
        gathered = 2 * n if precision == "bf16" else 0
    activations = activation_bytes(model, batch=batch, seq=summary.seq, bytes_per_element=compute,
                                   checkpointing=checkpointing) or 0
    return MemoryPlan(processes=processes, strategy=strategy, checkpointing=checkpointing, precision=precision,
                      batch=batch, seq=summary.seq, parameters=params, gradients=grads, optimizer=optim,
                      gathered=gathered, activations=activations)
