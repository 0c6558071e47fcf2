"""The specs of adapters, and their registry. Torch-free, as model specs are (:mod:`zoo.spec`).

An adapter is a change made to a built model for fine-tuning, not a part ``zoo.build`` assembles
from a spec file, so it has a registry of its own, :data:`ADAPTERS` (the ``adapter`` part), beside
the model registries of :mod:`zoo.registry`: each kind pairs its spec class (a subclass of
:class:`AdapterSpec`) with a builder ``builder(spec, *, model) -> model`` that adapts ``model`` in
place (:func:`zoo.finetune.adapt` then sets ``model.adapter`` to the spec). A user registers an
adapter kind of their own as they would a model part::

    @ADAPTERS.register("mine", spec=MySpec)
    def apply_mine(spec, *, model): ...

:func:`adapter_spec` reads a ``{kind: ...}`` mapping (a recipe's YAML) into the kind's spec class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from zoo.registry import Registry, suggest
from zoo.spec.base import ComponentSpec, Rate

__all__ = ["ADAPTERS", "ADAPTER_ATTR", "AdapterSpec", "LORA_TARGETS", "LoraSpec", "adapter_of", "adapter_spec"]

ADAPTERS = Registry("adapter", context="model")
ADAPTER_ATTR = "adapter"  # the attribute of an adapted model that holds its adapter's spec

# what LoRA may adapt: the attention's query, key, value and output projections, the FFN's two linears,
# and multi-head latent attention's key/value latent
LORA_TARGETS = ("q", "k", "v", "o", "ffn", "latent")


class AdapterSpec(ComponentSpec):
    """Base of adapter specs. ``trainable``: names (prefixes of parameter names, as
    ``model.named_parameters()`` gives them: ``head``, ``classifier``, ``stack.norm``) of parameters
    trained in full beside the adapters, such as a new classification head; every other parameter
    is frozen."""

    trainable: tuple[str, ...] = Field((), description="parameters trained in full beside the adapters (name "
                                       "prefixes: head, classifier); every other one is frozen")

    @field_validator("trainable")
    @classmethod
    def _check_trainable(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not name or name != name.strip(".") or " " in name:
                raise ValueError(f"{name!r} is not a parameter name prefix; write it as named_parameters() "
                                 f"names it (head, classifier.out)")
        return v


class LoraSpec(AdapterSpec):
    """LoRA (Hu et al. 2021): each targeted linear ``y = x W^T + b`` becomes
    ``y = x W^T + b + scale * dropout(x) A^T B^T`` with W and b frozen, A [rank, in] drawn as
    nn.Linear draws its weights (kaiming-uniform, as PEFT) and B [out, rank] zero, so the model is
    unchanged until B learns. ``scale = alpha / rank`` (PEFT's convention; ``alpha`` null: rank,
    scale 1).

    ``targets`` picks the projections of every layer's attention (``q``, ``k``, ``v``, ``o``: self-
    and cross-attention alike) and FFN (``ffn``: both of its linears). A fused projection gets one
    pair (A, B) per selected slice of its output rows: ``q`` alone adapts the queries' rows of a
    self-attention's ``qkv`` and nothing of its keys and values, ``ffn`` a gated FFN's gate and up
    rows apart, so the result equals LoRA on separate q/k/v (gate/up) projections, as PEFT adapts
    ``q_proj``, ``k_proj`` and ``v_proj`` of HF models.

    Multi-head latent attention (``attention.kind: mla``) has no projection of its own per role, so
    each target adapts what only its role uses: ``q`` the query projections (``q``, or both ``q_a``
    and ``q_b``), ``k`` the rotary key's rows of ``kv_a`` and every head's key rows of ``kv_b`` (one
    pair), ``v`` every head's value rows of ``kv_b``, ``o`` ``out``, and ``latent`` (mla only) the
    key/value latent's rows of ``kv_a``, which keys and values share.

    A mixture-of-experts layer's experts are batched tensors, not linears: ``ffn`` on a model with
    MoE layers is refused unless ``skip_moe`` says to leave those layers' FFNs as they are.
    """

    kind: Literal["lora"] = "lora"
    rank: PositiveInt = Field(8, description="rank r of each update B A (A: r x in, B: out x r)")
    alpha: float | None = Field(None, gt=0.0, description="the update is scaled by alpha / rank; null: rank "
                                "(scale 1)")
    dropout: Rate = Field(0.0, description="dropout on the adapters' input (not on the frozen path), in [0, 1)")
    targets: tuple[str, ...] = Field(("q", "v"), description="what to adapt in every layer: q, k, v, o (the "
                                     "attention's projections), ffn (both FFN linears), latent (mla's key/value "
                                     "latent)")
    skip_moe: bool = Field(False, description="with ffn in targets: leave mixture-of-experts FFNs unadapted "
                           "(else they are refused)")

    @field_validator("targets", mode="before")
    @classmethod
    def _check_targets(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"a non-empty list of {', '.join(LORA_TARGETS)}, got {v!r}")
        seen = []
        for name in v:
            if name not in LORA_TARGETS:
                hint = suggest(name, list(LORA_TARGETS)) if isinstance(name, str) else ""
                raise ValueError(f"unknown target {name!r}{hint} (known: {', '.join(LORA_TARGETS)})")
            if name in seen:
                raise ValueError(f"{name!r} is listed twice; list each target once")
            seen.append(name)
        return tuple(seen)

    @property
    def scale(self) -> float:
        """The factor on the low-rank update: alpha / rank."""
        return (self.alpha if self.alpha is not None else self.rank) / self.rank


ADAPTERS.spec_base = AdapterSpec
ADAPTERS.add_spec("lora", LoraSpec)


def adapter_spec(value: AdapterSpec | Mapping[str, Any]) -> AdapterSpec:
    """``value`` as its kind's spec class: a spec is returned as it is, a mapping read by ``kind``
    (an unknown kind lists the known ones). Raises ``ValueError`` (pydantic's, or a RegistryError)."""
    if isinstance(value, AdapterSpec):
        return value
    if not isinstance(value, Mapping) or "kind" not in value:
        raise ValueError(f"an adapter is a mapping with a kind ({', '.join(ADAPTERS.names())}), got {value!r}")
    return ADAPTERS.spec(value["kind"]).model_validate(dict(value))


def adapter_of(model: object) -> AdapterSpec | None:
    """The spec of the adapter ``model`` was adapted with (``model.adapter``), or None."""
    spec = getattr(model, ADAPTER_ATTR, None)
    return spec if isinstance(spec, AdapterSpec) else None
