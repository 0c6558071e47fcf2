"""LoRA: low-rank adapters on a built model's attention and FFN linears (:class:`zoo.finetune.LoraSpec`).

    model = zoo.load("base.safetensors")
    apply_lora(model, LoraSpec(rank=8, targets=("q", "v")))  # in place: adapters in, everything else frozen
    optimizer = zoo.train.build_optimizer(model, cfg)         # takes the parameters that require grad
    ...
    merge_lora(model)                                         # plain linears again: zoo.save, zoo convert

Every layer of the model's stacks (:class:`zoo.components.stack.Stack`: a decoder's, an encoder's,
both of an encoder-decoder) gets its targeted linears replaced by a :class:`LoraLinear`, which keeps
the linear's own ``weight`` and ``bias`` (the same parameters, under the same state-dict names) and
adds the pairs ``lora_a.<slice>``, ``lora_b.<slice>``. The slices are named for what they are:
``q``, ``k``, ``v`` of a fused projection, ``gate`` and ``up`` of a gated FFN's ``fc1``, ``all``
where one pair covers every output row; multi-head latent attention's (:func:`_latent_plan`) ``latent``
and ``k`` of ``kv_a``, ``k`` and ``v`` of ``kv_b`` (each head's rows alike: ``groups``). Heads, pools
and embeddings are left alone (name them in ``trainable`` to train them in full).

The adapted model computes without graph breaks under ``torch.compile(fullgraph=True)``: the slices
are fixed when the model is adapted, so the forward pass is a fixed sequence of products.

Shapes: B batch, T tokens, I in features, O out features, r rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo import kernels
from zoo.components.attention import Attention
from zoo.components.dropout import Dropout
from zoo.components.ffn import GatedMLP
from zoo.components.linear import Linear
from zoo.components.mla import LatentAttention
from zoo.components.moe import MoE
from zoo.components.stack import Stack
from zoo.finetune.spec import ADAPTER_ATTR, ADAPTERS, LoraSpec
from zoo.registry import suggest

__all__ = ["LoraLinear", "apply_lora", "freeze", "has_lora", "lora_parameters", "merge_lora", "trainable_parameters"]


class LoraLinear(Linear):
    """A linear whose weight W [O, I] and bias stay frozen while low-rank updates train: the output
    rows ``[start, stop)`` of each slice in ``slices`` ({name: (start, stop)}) add
    ``scale * dropout(x) A^T B^T`` with ``lora_a[name]`` A [r, I] and ``lora_b[name]`` B [stop - start, r].
    A starts kaiming-uniform (as nn.Linear's weights and PEFT's A), B at zero: the output is the
    linear's until B learns. A and B are in the weight's dtype, or fp32 where that is bf16 or fp16
    (as PEFT keeps them: Adam's small steps need the precision; a half-precision base still halves
    the frozen weights' memory). ``groups`` > 1 reads the rows as that many equal groups (heads)
    and each slice as the same rows of every group: B is then [groups * (stop - start), r], the
    slice's rows of every group in order (MLA's ``kv_b``, each head's key rows then its value rows,
    adapted as one key and one value projection). Made from ``base`` (whose parameters it takes
    over) by :func:`apply_lora`."""

    def __init__(self, base: nn.Linear, slices: Mapping[str, tuple[int, int]], *, rank: int, scale: float,
                 dropout: float = 0.0, groups: int = 1) -> None:
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
        self.weight, self.bias = base.weight, base.bias
        if groups < 1 or base.out_features % groups:
            raise ValueError(f"groups: {groups} must divide the {base.out_features} output rows")
        group = base.out_features // groups
        spans = sorted(slices.values())
        if not spans or spans[0][0] < 0 or spans[-1][1] > group or any(
                a >= b for a, b in spans) or any(b > c for (_, b), (c, _) in zip(spans, spans[1:])):
            raise ValueError(f"slices {dict(slices)} must be non-empty, disjoint row ranges within [0, {group})")
        self.slices, self.groups = dict(slices), groups
        self.rank, self.scale = rank, scale
        cuts = sorted({0, group, *(i for span in spans for i in span)})
        self.sizes = tuple(b - a for a, b in zip(cuts, cuts[1:]))  # a group's rows split at every slice's edges
        self.adapted = tuple((cuts.index(start), name) for name, (start, _) in self.slices.items())
        w = base.weight
        dtype = torch.float32 if w.dtype in (torch.bfloat16, torch.float16) else w.dtype  # trained in fp32, as PEFT's
        self.lora_a = nn.ParameterDict({name: nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=dtype))
                                        for name in self.slices})
        self.lora_b = nn.ParameterDict({name: nn.Parameter(torch.empty(groups * (stop - start), rank, device=w.device,
                                                                       dtype=dtype))
                                        for name, (start, stop) in self.slices.items()})
        self.lora_dropout = Dropout(dropout)
        self.reset_lora()

    @torch.no_grad()
    def reset_lora(self, generator: torch.Generator | None = None) -> None:
        """A kaiming-uniform (nn.Linear's draw, PEFT's), B zero. With a (CPU) ``generator`` the draws
        are made from it on the CPU, so they do not depend on the device or the global RNG."""
        for name in self.slices:
            a = self.lora_a[name]
            if generator is None:
                nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            else:
                a.copy_(nn.init.kaiming_uniform_(torch.empty(a.shape, dtype=a.dtype), a=math.sqrt(5), generator=generator))
            nn.init.zeros_(self.lora_b[name])

    def delta(self, x: Tensor, name: str) -> Tensor:
        """The update of slice ``name``: [..., I] -> [..., stop - start], in the adapters' dtype (the
        input is cast to it; under autocast the products run in autocast's dtype)."""
        a, b = self.lora_a[name], self.lora_b[name]
        return self.scale * F.linear(F.linear(self.lora_dropout(x).to(a.dtype), a), b)

    def forward(self, x: Tensor) -> Tensor:
        y = kernels.linear(x, self.weight, self.bias)  # (..., O): the frozen path
        if len(self.sizes) == 1:  # one slice over every row
            return y + self.delta(x, self.adapted[0][1]).to(y.dtype)
        pieces = list(y.unflatten(-1, (self.groups, -1)).split(self.sizes, dim=-1))  # (..., groups, size) each
        for i, name in self.adapted:
            pieces[i] = pieces[i] + self.delta(x, name).unflatten(-1, (self.groups, -1)).to(y.dtype)
        return torch.cat(pieces, dim=-1).flatten(-2)

    def effective_weight(self) -> Tensor:
        """The weight the module multiplies by: W with ``scale * B A`` added on every slice's rows
        (sums in fp32, in W's dtype; differentiable in A and B). Adapter dropout acts on inputs, so
        a training module with dropout has none: ``eval()`` it, or set the dropout to 0."""
        if self.training and self.lora_dropout.p:
            raise ValueError("LoraLinear.effective_weight: adapter dropout acts on the inputs, not on a weight; "
                             "eval() the model or adapt it with dropout 0")
        return self._updated()

    def _updated(self) -> Tensor:
        w = self.weight
        pieces = list(w.unflatten(0, (self.groups, -1)).split(self.sizes, dim=1))  # (groups, size, I) each
        for i, name in self.adapted:
            update = self.scale * (self.lora_b[name].float() @ self.lora_a[name].float())
            pieces[i] = (pieces[i].float() + update.unflatten(0, (self.groups, -1))).to(w.dtype)
        return torch.cat(pieces, dim=1).flatten(0, 1)

    @torch.no_grad()
    def merged(self) -> Linear:
        """A plain :class:`Linear` with ``W[rows] += scale * B A`` for every slice (computed in fp32),
        holding this module's weight and bias parameters (changed in place)."""
        self.weight.copy_(self._updated())
        plain = Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        plain.weight, plain.bias = self.weight, self.bias
        return plain.train(self.training)

    def extra_repr(self) -> str:
        spans = ", ".join(f"{n}={a}:{b}" for n, (a, b) in self.slices.items())
        groups = f", groups={self.groups}" if self.groups > 1 else ""
        return f"{super().extra_repr()}, rank={self.rank}, scale={self.scale:g}, slices=({spans}){groups}"


# ---------------------------------------------------------------------------------------- targets
Plan = list[tuple[nn.Module, str, dict[str, tuple[int, int]], int]]  # (parent, linear's attribute, slices, groups)
ATTENTION_TARGETS = {"q", "k", "v", "o", "latent"}


def _latent_plan(attn: LatentAttention, wanted: set[str]) -> Plan:
    """MLA's linears (:class:`zoo.components.mla.LatentAttention`): q adapts the query projections
    (``q``, or ``q_a`` and ``q_b``), k the rotary key's rows of ``kv_a`` and each head's key rows of
    ``kv_b``, v each head's value rows of ``kv_b``, latent the latent's rows of ``kv_a`` (keys and
    values share it), o ``out``."""
    R, P, N, V = attn.kv_rank, attn.rope_dim, attn.nope_dim, attn.v_head_dim
    plan: Plan = []
    if "q" in wanted:
        plan += [(attn, name, {"all": (0, getattr(attn, name).out_features)}, 1)
                 for name in ("q", "q_a", "q_b") if getattr(attn, name) is not None]
    down = {n: span for n, span in (("latent", (0, R)), ("k", (R, R + P))) if n in wanted}
    up = {n: span for n, span in (("k", (0, N)), ("v", (N, N + V))) if n in wanted}
    plan += [(attn, "kv_a", down, 1)] if down else []
    plan += [(attn, "kv_b", up, attn.n_heads)] if up else []
    if "o" in wanted:
        plan.append((attn, "out", {"all": (0, attn.out.out_features)}, 1))
    return plan


def _attention_plan(attn: nn.Module, where: str, wanted: set[str]) -> Plan:
    if isinstance(attn, LatentAttention):
        return _latent_plan(attn, wanted)
    if "latent" in wanted:
        raise ValueError(f"lora.targets latent: {where} is a {type(attn).__name__} without a key/value latent "
                         f"(attention.kind: mla has one); drop latent from targets")
    if not isinstance(attn, Attention):
        raise ValueError(f"lora.targets {sorted(wanted & {'q', 'k', 'v', 'o'})}: {where} is a {type(attn).__name__}, "
                         f"not zoo's Attention, whose projections (qkv, q, kv, out) LoRA adapts; drop them from targets")
    q, k, v = attn.splits
    plan: Plan = []
    if wanted & {"q", "k", "v"}:
        if attn.v_bias is not None:
            raise ValueError(f"lora.targets q/k/v: {where} adds its q/v biases (key_bias: false) beside the projection "
                             f"linear, which LoRA does not adapt; target o and ffn only")
        if attn.cross:
            if "q" in wanted:
                plan.append((attn, "q", {"all": (0, q)}, 1))
            kv = {n: span for n, span in (("k", (0, k)), ("v", (k, k + v))) if n in wanted}
            if kv:
                plan.append((attn, "kv", kv, 1))
        else:
            spans = {"q": (0, q), "k": (q, q + k), "v": (q + k, q + k + v)}
            plan.append((attn, "qkv", {n: spans[n] for n in ("q", "k", "v") if n in wanted}, 1))
    if "o" in wanted:
        plan.append((attn, "out", {"all": (0, attn.out.out_features)}, 1))
    return plan


def _ffn_plan(ffn: nn.Module, where: str, skip_moe: bool) -> Plan:
    if isinstance(ffn, MoE):
        if skip_moe:
            return []
        raise ValueError(f"lora.targets ffn: {where} is a mixture of experts, whose experts are batched tensors, not "
                         f"linears; drop ffn from lora.targets, or set lora.skip_moe=true to leave MoE layers unadapted")
    fc1, fc2 = getattr(ffn, "fc1", None), getattr(ffn, "fc2", None)
    if not (isinstance(fc1, nn.Linear) and isinstance(fc2, nn.Linear)):
        raise ValueError(f"lora.targets ffn: {where} is a {type(ffn).__name__} without linears fc1 and fc2, which "
                         f"LoRA adapts; drop ffn from lora.targets")
    h = fc1.out_features
    first = {"gate": (0, h // 2), "up": (h // 2, h)} if isinstance(ffn, GatedMLP) else {"all": (0, h)}
    return [(ffn, "fc1", first, 1), (ffn, "fc2", {"all": (0, fc2.out_features)}, 1)]


def _plan(model: nn.Module, spec: LoraSpec) -> Plan:
    """The linears ``spec.targets`` names in every layer of the model's stacks, and their slices."""
    wanted = set(spec.targets)
    stacks = [(name, m) for name, m in model.named_modules() if isinstance(m, Stack)]
    if not stacks:
        raise ValueError(f"apply_lora: a {type(model).__name__} has no stack of zoo blocks; adapt a model made by "
                         f"zoo.build or zoo.load")
    plan: Plan = []
    for stack_name, stack in stacks:
        for i, block in enumerate(stack.blocks):
            where = ".".join(filter(None, [stack_name, "blocks", str(i)]))
            if wanted & ATTENTION_TARGETS:
                for attr in ("attn", "cross_attn"):
                    if getattr(block, attr, None) is not None:
                        plan += _attention_plan(getattr(block, attr), f"{where}.{attr}", wanted)
            if "ffn" in wanted:
                plan += _ffn_plan(block.ffn, f"{where}.ffn", spec.skip_moe)
    if not plan:
        raise ValueError(f"lora.targets {list(spec.targets)}: nothing to adapt in the model (every FFN is a mixture "
                         f"of experts skipped by skip_moe); target the attention (q, k, v, o)")
    for parent, attr, _, _ in plan:
        if isinstance(getattr(parent, attr), LoraLinear):
            raise ValueError("apply_lora: the model already has LoRA adapters; merge_lora(model) first, or load "
                             "adapters into it with zoo.finetune.load_adapters")
    return plan


# ------------------------------------------------------------------------------------ apply, merge
def trainable_parameters(model: nn.Module, trainable: Iterable[str]) -> list[nn.Parameter]:
    """The parameters ``trainable`` names: those with a name (any of a tied parameter's names) equal
    to one of its prefixes or starting with one and a dot (``head`` names ``head.weight``). A prefix
    that names nothing is an error that lists the model's parts."""
    named = list(model.named_parameters(remove_duplicate=False))
    out: dict[int, nn.Parameter] = {}
    for prefix in trainable:
        hits = [p for n, p in named if n == prefix or n.startswith(prefix + ".")]
        if not hits:
            parts = sorted({n for n, _ in model.named_modules() if n} | {n for n, _ in named})
            tops = sorted({n.split(".")[0] for n in parts})
            raise ValueError(f"trainable: {prefix!r} names no parameter of the {type(model).__name__}"
                             f"{suggest(prefix, parts)} (its parts: {', '.join(tops)})")
        out.update((id(p), p) for p in hits)
    return list(out.values())


def freeze(model: nn.Module, trainable: Iterable[str] = (), *, keep: Iterable[nn.Parameter] = ()) -> None:
    """Freeze every parameter of ``model`` (``requires_grad=False``) but those in ``keep`` and those
    ``trainable`` names (:func:`trainable_parameters`)."""
    kept = {id(p) for p in (*keep, *trainable_parameters(model, trainable))}
    for p in model.parameters():
        p.requires_grad_(id(p) in kept)


def apply_lora(model: nn.Module, spec: LoraSpec | Mapping, *, seed: int | None = None) -> nn.Module:
    """Adapt ``model`` in place (see the module's docstring) and return it: its targeted linears
    become :class:`LoraLinear` (adapters on their linear's device, in its dtype or fp32 for a half-
    precision one), every parameter is frozen but the adapters and ``spec.trainable``, and
    ``model.adapter`` holds the spec. ``seed`` draws the A matrices reproducibly, without touching the
    global RNG (as ``zoo.build``'s); None: from torch's global RNG, as PEFT does. Build the optimizer
    afterwards: ``zoo.train.build_optimizer`` takes what requires grad."""
    spec = spec if isinstance(spec, LoraSpec) else LoraSpec.model_validate(dict(spec))
    keep = trainable_parameters(model, spec.trainable)  # checked before the model changes
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    for parent, attr, slices, groups in _plan(model, spec):
        lora = LoraLinear(getattr(parent, attr), slices, rank=spec.rank, scale=spec.scale, dropout=spec.dropout,
                          groups=groups)
        if generator is not None:
            lora.reset_lora(generator)
        setattr(parent, attr, lora)
        keep += [*lora.lora_a.values(), *lora.lora_b.values()]
    freeze(model, keep=keep)
    setattr(model, ADAPTER_ATTR, spec)
    return model


def has_lora(model: nn.Module) -> bool:
    """Whether any module of ``model`` is a :class:`LoraLinear`."""
    return any(isinstance(m, LoraLinear) for m in model.modules())


def lora_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The adapters' parameters by their names in ``model.state_dict()`` (``...qkv.lora_a.q``)."""
    return {name: p for name, p in model.named_parameters() if ".lora_a." in name or ".lora_b." in name}


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its linear's weight (``W += scale * B A`` on its rows) and put the
    plain linears back, in place; returns ``model``, whose modules and state-dict names are again
    those its spec builds (``zoo.save``, ``zoo convert`` and ``zoo.interop.to_hf`` take it). The
    parameters keep the ``requires_grad`` they had (the base frozen)."""
    merged = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoraLinear):
                setattr(module, name, child.merged())
                merged += 1
    if not merged:
        raise ValueError("merge_lora: the model has no LoRA adapters (apply_lora or load_adapters adds them)")
    if ADAPTER_ATTR in vars(model):
        delattr(model, ADAPTER_ATTR)
    return model


@ADAPTERS.register("lora")
def _lora(spec: LoraSpec, *, model: nn.Module) -> nn.Module:
    return apply_lora(model, spec)
