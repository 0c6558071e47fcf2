"""Position-wise feed-forward networks. Every FFN is ``(dim, hidden, *, bias, dropout)``.

Two-layer: ``fc2(drop(act(fc1(x))))`` with ReLU (the paper), GELU (BERT, GPT-2, ViT), SiLU (Marian),
quick GELU (OpenAI CLIP) or squared ReLU (Primer, Nemotron). Gated (Shazeer 2020): ``fc2(drop(act(gate) * up))`` where ``fc1``
computes [gate | up] in one matmul; SwiGLU uses SiLU (LLaMA), GeGLU uses GELU; gpt-oss's SwiGLU
clamps both halves, sharpens the sigmoid and adds one to up (:class:`ClampedSwiGLU`). Either may put a
``norm`` on the hidden activation before ``fc2`` (NormFormer; EVA-02's SwiGLU).

Shapes: B batch, T tokens, D dim, F hidden.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components.dropout import Dropout
from zoo.components.linear import Linear
from zoo.components.parts import linear_flops
from zoo.protocols import CountsFlops, KeepsMasks, ResidualWriter, SavesPerToken, SummaryPart
from zoo.registry import register, registry


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): OpenAI CLIP's approximation of GELU."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class ReLU2(nn.Module):
    """max(0, x)^2: squared ReLU (So et al. 2021, Primer; Nemotron)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x).square()


class ClampedSwiGLU(nn.Module):
    """gpt-oss's gated activation of (gate, up): with ``limit``, the gate clamped above at limit and
    up into [-limit, limit]; then ``(up + up_offset) * gate * sigmoid(alpha * gate)``. Called with
    both halves (:func:`glu`), not with the gate alone as the plain activations are."""

    def __init__(self, limit: float | None = None, alpha: float = 1.0, up_offset: float = 0.0) -> None:
        super().__init__()
        self.limit, self.alpha, self.up_offset = limit, alpha, up_offset

    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        if self.limit is not None:
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        return (up + self.up_offset) * (gate * torch.sigmoid(self.alpha * gate))

    def extra_repr(self) -> str:
        return f"limit={self.limit}, alpha={self.alpha}, up_offset={self.up_offset}"


def glu(act: nn.Module, gate: Tensor, up: Tensor) -> Tensor:
    """The gated product of a gated FFN's halves: ``act(gate) * up``, or a :class:`ClampedSwiGLU`'s own."""
    return act(gate, up) if isinstance(act, ClampedSwiGLU) else act(gate) * up


def gated_activation(spec) -> nn.Module:
    """The activation module of a gated FFN spec (swiglu, geglu): SiLU, GELU, or a
    :class:`ClampedSwiGLU` where the swiglu spec clamps or shifts (``spec.clamped``)."""
    if getattr(spec, "clamped", False):
        return ClampedSwiGLU(spec.limit, spec.alpha, spec.up_offset)
    return nn.SiLU() if spec.kind == "swiglu" else nn.GELU(approximate=spec.approximate)


class MLP(nn.Module, ResidualWriter, SummaryPart, CountsFlops, SavesPerToken, KeepsMasks):
    residual_out = ("fc2",)  # writes into the residual stream (zoo.components.parts)
    summary_part = "ffn"

    def __init__(self, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0, activation: nn.Module,
                 norm: nn.Module | None = None) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.act = activation
        self.drop = Dropout(dropout)
        self.norm = norm  # on the hidden activation (F), before fc2
        self.fc2 = Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        h = self.drop(self.act(self.fc1(x)))  # (B, T, F)
        return self.fc2(h if self.norm is None else self.norm(h))

    def flops(self, tokens: int, memory: int | None = None) -> int:
        return linear_flops(self, tokens)

    def saved_per_token(self) -> int:
        """The pre- and post-activation (2F); ReLU needs only its output (F) unless dropout copies it;
        a norm its output (F) more."""
        hidden = self.fc1.out_features
        own = hidden if isinstance(self.act, nn.ReLU) and not self.drop.p else 2 * hidden
        return own + (hidden if self.norm is not None else 0)

    def mask_per_token(self) -> int:
        """The dropout mask on the hidden activation, a byte per element."""
        return self.fc1.out_features if self.drop.p else 0


class GatedMLP(nn.Module, ResidualWriter, SummaryPart, CountsFlops, SavesPerToken, KeepsMasks):
    residual_out = ("fc2",)
    summary_part = "ffn"

    def __init__(self, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0, activation: nn.Module,
                 norm: nn.Module | None = None) -> None:
        super().__init__()
        self.fc1 = Linear(dim, 2 * hidden, bias=bias)  # [gate | up]
        self.act = activation
        self.drop = Dropout(dropout)
        self.norm = norm  # on the gated product (F), before fc2
        self.fc2 = Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)  # (B, T, F) each
        h = self.drop(glu(self.act, gate, up))
        return self.fc2(h if self.norm is None else self.norm(h))

    def flops(self, tokens: int, memory: int | None = None) -> int:
        return linear_flops(self, tokens)

    def saved_per_token(self) -> int:
        """[gate | up], act(gate) and their product (4F); a clamped SwiGLU its clamped halves, the
        sigmoid, the gated gate and up + offset besides (8F); a norm its output (F) more."""
        own = 8 if isinstance(self.act, ClampedSwiGLU) else 4
        return (own + (self.norm is not None)) * self.fc2.in_features

    def mask_per_token(self) -> int:
        """The dropout mask on the gated product, a byte per element."""
        return self.fc2.in_features if self.drop.p else 0


def _activation(kind: str, approximate: str = "none") -> nn.Module:
    acts = {"relu": nn.ReLU, "silu": nn.SiLU, "swiglu": nn.SiLU, "quick_gelu": QuickGELU, "relu2": ReLU2}
    return acts.get(kind, lambda: nn.GELU(approximate=approximate))()


def _hidden_norm(spec, norm, hidden: int) -> nn.Module | None:
    """The FFN's own norm (``spec.norm``) of ``hidden`` features, of the block's norm kind ``norm``."""
    if not getattr(spec, "norm", False):
        return None
    if norm is None:
        raise ValueError("ffn.norm: the FFN's norm is of the block's norm kind, which its builder was not given")
    return registry("norm").builder(norm.kind)(norm, dim=hidden)


@register("ffn", "relu")
@register("ffn", "gelu")
@register("ffn", "silu")
@register("ffn", "quick_gelu")
@register("ffn", "relu2")
def _mlp(spec, *, dim: int, dropout: float, norm=None, **_) -> MLP:
    act, hidden = _activation(spec.kind, getattr(spec, "approximate", "none")), spec.hidden_size(dim)
    return MLP(dim, hidden, bias=spec.bias, dropout=dropout, activation=act, norm=_hidden_norm(spec, norm, hidden))


@register("ffn", "swiglu")
@register("ffn", "geglu")
def _gated(spec, *, dim: int, dropout: float, norm=None, **_) -> GatedMLP:
    act, hidden = gated_activation(spec), spec.hidden_size(dim)
    return GatedMLP(dim, hidden, bias=spec.bias, dropout=dropout, activation=act, norm=_hidden_norm(spec, norm, hidden))
