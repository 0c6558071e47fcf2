"""Weights a model uses more than once, and their rules: shared layers (``shared_layers``: ALBERT's
groups, layers running one block's weights) and factorised embeddings (``embedding.dim``: ALBERT's
and ELECTRA's embeddings narrower or wider than the layers, which a tied head shares)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from zoo.spec.blocks import layer_key

__all__ = ["factorised_problems", "shared_layers_field", "sharing_problems", "weight_layers"]


def shared_layers_field() -> Any:
    """The ``shared_layers`` field of a one-stack family (encoder, decoder, ViT)."""
    return Field(None, description="layers that share weights (ALBERT's num_hidden_groups): the n_layers layers run "
                 "shared_layers distinct blocks, layer i the block int(i / (n_layers / shared_layers)), so 1 is one "
                 "block applied n_layers times; a state dict names each layer's tensors, tied; null: every layer its own")


def weight_layers(n: int, groups: int | None) -> list[int]:
    """For each of ``n`` layers, the layer whose block it runs: itself, or with ``groups`` blocks
    (``shared_layers``) the first layer of its group, layer i's group being int(i / (n / groups)),
    HF ALBERT's arithmetic."""
    if groups is None:
        return list(range(n))
    group = [int(i / (n / groups)) for i in range(n)]
    return [group.index(g) for g in group]


def sharing_problems(spec: Any) -> list[str]:
    """``shared_layers`` of a family spec: fewer blocks than layers, the layers of a group alike."""
    g = getattr(spec, "shared_layers", None)  # a one-stack family's field
    if g is None:
        return []
    if g >= spec.n_layers:
        return [f"shared_layers: {g} blocks for {spec.n_layers} layers shares nothing; choose fewer than n_layers "
                f"({spec.n_layers}), or remove shared_layers (every layer its own)"]
    try:
        layers = spec.stack_layers()
    except ValueError:
        return []  # the layer checks name it
    for i, first in enumerate(spec.weight_layers()):
        if layer_key(layers[i]) != layer_key(layers[first]):
            return [f"layers: layer {i} differs from layer {first}, whose weights it shares (shared_layers: {g}); "
                    f"give the layers of a group one block and position, or remove shared_layers"]
    return []


def factorised_problems(spec: Any) -> list[str]:
    """``embedding.dim`` of a text family spec: one stack, and a tied head that projects states as
    wide as the embedding (an mlm head's transform maps d_model to embedding.dim)."""
    e = spec.embedding.dim
    if e is None:
        return []
    if len(spec.stacks()) > 1:
        return [f"embedding.dim: factorised embeddings are a one-stack family's (encoder, decoder), not "
                f"family {spec.family}'s; remove embedding.dim"]
    head = spec.head
    into = e if getattr(head, "transform", False) else spec.d_model
    if getattr(head, "tied", False) and into != e:
        return [f"head.tied: the {head.kind} head projects d_model ({spec.d_model}) wide states, but the embedding is "
                f"embedding.dim ({e}) wide; set head.tied: false (or use an mlm head with transform: true, which maps "
                f"to embedding.dim)"]
    return []
