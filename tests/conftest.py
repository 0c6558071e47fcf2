"""Shared helpers: tiny specs of every family, seeded."""

from __future__ import annotations

import pytest
import torch

import zoo

TINY = ["d_model=32", "n_layers=2", "block.attention.n_heads=4", "block.ffn.hidden=48"]
TEXT_TINY = TINY + ["vocab_size=61", "max_seq_len=32"]
FAMILY_PRESET = {"decoder": "gpt2-small", "encoder": "bert-base", "encoder_decoder": "transformer-base", "vit": "vit-tiny-16"}
VIT_TINY = TINY + ["image_size=16", "patch_size=4", "num_classes=7", "in_channels=3"]


def tiny_overrides(family: str) -> list[str]:
    return VIT_TINY if family == "vit" else TEXT_TINY


def tiny_spec(family: str, extra: list[str] = ()):
    """A small spec of ``family`` from its preset, with ``extra`` overrides."""
    return zoo.load_spec(FAMILY_PRESET[family], tiny_overrides(family) + list(extra))


def tiny_model(family: str, extra: list[str] = (), seed: int = 0):
    return zoo.build(tiny_spec(family, extra), seed=seed)


def example_inputs(model, batch: int = 3, length: int = 9, seed: int = 0) -> tuple:
    """Positional inputs for ``model`` (tokens, or src+tgt, or images)."""
    g = torch.Generator().manual_seed(seed)
    spec = model.spec
    if spec.family == "vit":
        return (torch.randn(batch, spec.in_channels, spec.image_size, spec.image_size, generator=g),)
    tokens = torch.randint(0, spec.vocab_size, (batch, length), generator=g)
    if spec.family == "encoder_decoder":
        return (torch.randint(0, spec.source_vocab_size, (batch, length + 2), generator=g), tokens)
    return (tokens,)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
