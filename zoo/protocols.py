"""What model code asks of a part, declared: one ``typing.Protocol`` per question.

Summaries, memory plans, initialisation and loading never check a part's class; they ask whether it
declares an answer (``isinstance(part, CountsFlops)``) and fall back on a rule where it does not
(:mod:`zoo.components.parts`). Every protocol here is ``runtime_checkable``, so such a check is
structural: a part a user registers answers by having the member, with or without subclassing.
zoo's own parts subclass the protocols they implement, so that what a class promises is written
on it and tests/test_protocols.py can hold each registered part to the members and signatures below.

Conventions are those of :mod:`zoo.summary`: FLOPs count a multiply-add as two and only matrix
products; "saved" counts the elements a forward pass keeps for the backward pass besides its input.

This module imports nothing of zoo, nor torch: it sits at the bottom of the package with
:mod:`zoo.registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = [
    "CachesPerToken", "CountsFlops", "DerivedBuffers", "Experts", "Generates", "HasSublayers", "HeadSizes", "HoldsState", "InitNormal", "InitResidual", "KeepsMasks",
    "LayerCosts", "ModelCosts", "PROTOCOLS", "ResidualWriter", "SavesActivations", "SavesPerToken", "SummaryPart", "SummaryParts",
    "VocabularyLoss", "members",
]


@runtime_checkable
class ResidualWriter(Protocol):
    """A part whose linears write into the residual stream."""

    residual_out: ClassVar[tuple[str, ...]]
    """The names of those linears (``Attention``: ``("out",)``, an MLP: ``("fc2",)``; ``()``: none of
    its linears, as a MoE whose experts' weights are stacked). With ``init.scaled_residual`` their
    weights are drawn with std / sqrt(2 * n_layers) (GPT-2)."""


@runtime_checkable
class CountsFlops(Protocol):
    """A part that counts its own forward FLOPs (an attention's score and weighted-sum products,
    which its linears alone do not show; a MoE's top_k experts per token)."""

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """The FLOPs of a forward pass over one sequence of ``tokens`` tokens (cross-attention: keys
        and values from ``memory`` tokens)."""
        ...


@runtime_checkable
class SavesActivations(Protocol):
    """A sub-layer (an attention) that counts what its forward pass keeps for the backward pass."""

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False) -> int:
        """The elements a forward pass over ``tokens`` tokens (and ``memory`` memory tokens) keeps
        besides its input; ``rotates``: a position rotates its queries and keys, which keeps copies."""
        ...


@runtime_checkable
class SavesPerToken(Protocol):
    """A part whose activations grow with the tokens alone (an FFN, a norm, a head, a pool)."""

    def saved_per_token(self) -> int:
        """The elements its forward pass keeps per token for the backward pass besides its input."""
        ...


@runtime_checkable
class KeepsMasks(Protocol):
    """A part with dropout inside it (an FFN's hidden dropout)."""

    def mask_per_token(self) -> int:
        """The bytes of dropout masks its forward pass keeps per token in training."""
        ...


@runtime_checkable
class HeadSizes(Protocol):
    """An attention's head counts and sizes, for the KV cache's size."""

    n_heads: int  # query heads
    n_kv_heads: int  # key and value heads (fewer with GQA, one with MQA)
    head_dim: int  # the width of a query and key head
    v_head_dim: int  # the width of a value head


@runtime_checkable
class HoldsState(Protocol):
    """A mixer whose decoding cache is a fixed-size state per sequence, not per token (gated
    DeltaNet's recurrent and convolution state)."""

    def state_elements(self) -> int:
        """Elements of its state per sequence, however long."""
        ...


@runtime_checkable
class CachesPerToken(Protocol):
    """An attention whose decoding cache is not its heads' keys and values (multi-head latent
    attention: a latent and a shared rotary key)."""

    def cache_elements(self) -> int:
        """Elements it caches per token."""
        ...


@runtime_checkable
class SummaryPart(Protocol):
    """A module that says which part of the parameter count it belongs to."""

    summary_part: ClassVar[str]
    """One of ``zoo.summary.PARTS``: ``embeddings``, ``attention``, ``ffn``, ``norms`` or ``head``;
    every parameter under the module counts there."""


@runtime_checkable
class SummaryParts(Protocol):
    """A container (a block, a stack, a family) that says which part its children belong to."""

    summary_parts: ClassVar[dict[str, str]]
    """Child attribute name (or ``"*"``: any other child) -> its part, where the child does not
    declare :class:`SummaryPart` itself."""


@runtime_checkable
class InitNormal(Protocol):
    """A module with parameters drawn like embeddings by the model's initialisation."""

    init_normal: ClassVar[tuple[str, ...]]
    """The names of those parameters, drawn N(0, init.std) (a learned position table)."""


@runtime_checkable
class InitResidual(Protocol):
    """A module with parameters drawn like residual output linears by the model's initialisation."""

    init_residual: ClassVar[tuple[str, ...]]
    """The names of those parameters, drawn with the residual std (a MoE's stacked expert outputs)."""


@runtime_checkable
class DerivedBuffers(Protocol):
    """A module with buffers computed from its settings, never stored in a file (sinusoid tables,
    RoPE's frequencies)."""

    def reset_buffers(self) -> None:
        """Recompute those buffers in place (after the model was built on the meta device and loaded)."""
        ...


@runtime_checkable
class Experts(Protocol):
    """A mixture of experts, whose tokens use only some of its parameters."""

    n_experts: int  # the routed experts

    def expert_parameters(self) -> int:
        """The routed experts' parameters, all of them."""
        ...

    def active_parameters(self) -> int:
        """The parameters one token's forward pass uses: the router, ``top_k`` experts, a shared expert."""
        ...


@runtime_checkable
class VocabularyLoss(Protocol):
    """A head that projects to a vocabulary and computes its cross-entropy without the logits."""

    def loss(self, x: Tensor, targets: Tensor, *, label_smoothing: float = 0.0, reduction: str = "sum",
             ignore_index: int = -100, chunk_rows: int | None = None,
             return_nll: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """The cross-entropy of its logits on hidden states ``x`` [..., D] against ``targets`` [...],
        summed or ``reduction="mean"`` over the targets that are not ``ignore_index``;
        ``return_nll``: (that loss, its unsmoothed NLL without gradient)."""
        ...


@runtime_checkable
class HasSublayers(Protocol):
    """A block made of sub-layers (attention, cross-attention, FFN)."""

    def sublayers(self) -> list[nn.Module]:
        """Its sub-layers, in order; the model's initialisation asks each for :class:`ResidualWriter`."""
        ...


@runtime_checkable
class LayerCosts(Protocol):
    """A block's costs: its sub-layers' and its norms', with its dropout masks apart."""

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Forward FLOPs over ``tokens`` tokens (cross-attention: keys and values from ``memory``)."""
        ...

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False) -> tuple[int, int]:
        """(elements, dropout-mask bytes) one sample keeps in the block for the backward pass."""
        ...


@runtime_checkable
class ModelCosts(Protocol):
    """A model family's costs per sample, which :mod:`zoo.summary` reports (``zoo.models.Family``
    gives defaults from its stacks and head)."""

    def flops(self, seq: int) -> int:
        """Forward FLOPs of one sample of ``seq`` tokens."""
        ...

    def saved(self, seq: int) -> tuple[int, int]:
        """(elements, dropout-mask bytes) one sample of ``seq`` tokens keeps for the backward pass."""
        ...


@runtime_checkable
class Generates(Protocol):
    """A model family that says how :func:`zoo.generate` feeds it."""

    decodes_from: ClassVar[str | None]
    """``"prompt"``: it continues its input, which a KV cache holds (a decoder: ``model(tokens, mask,
    cache=...)`` and ``new_cache``); ``"source"``: it encodes its input once and decodes a target
    from ``bos_id`` with cross-attention (an encoder-decoder: ``encode``, ``decode``, ``new_cache``);
    None: it does not generate (an encoder, a ViT)."""


PROTOCOLS: tuple[type, ...] = (
    ResidualWriter, CountsFlops, SavesActivations, SavesPerToken, KeepsMasks, HeadSizes, CachesPerToken, SummaryPart, SummaryParts,
    InitNormal, InitResidual, DerivedBuffers, Experts, VocabularyLoss, HasSublayers, LayerCosts, ModelCosts,
    Generates, HoldsState,
)


def members(protocol: type) -> tuple[str, ...]:
    """The names a protocol asks for (its attributes and methods), in declaration order."""
    names = [*vars(protocol).get("__annotations__", {})]
    names += [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
    return tuple(dict.fromkeys(names))
