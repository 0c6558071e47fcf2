"""Position-wise feed-forward networks. Every FFN is ``(dim, hidden, *, bias, dropout)``.

Two-layer: ``fc2(drop(act(fc1(x))))`` with ReLU (the paper), GELU (BERT, GPT-2, ViT) or SiLU (Marian).
Gated (Shazeer 2020): ``fc2(drop(act(gate) * up))`` where ``fc1`` computes [gate | up] in one
matmul; SwiGLU uses SiLU (LLaMA), GeGLU uses GELU.

Shapes: B batch, T tokens, D dim, F hidden.
"""

from __future__ import annotations

from torch import Tensor, nn

from zoo.components.dropout import Dropout
from zoo.components.linear import Linear
from zoo.components.parts import linear_flops
from zoo.registry import register


class MLP(nn.Module):
    residual_out = ("fc2",)  # writes into the residual stream (zoo.components.parts)
    summary_part = "ffn"

    def __init__(self, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0, activation: nn.Module) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.act = activation
        self.drop = Dropout(dropout)
        self.fc2 = Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        return self.fc2(self.drop(self.act(self.fc1(x))))

    def flops(self, tokens: int, memory: int | None = None) -> int:
        return linear_flops(self, tokens)

    def saved_per_token(self) -> int:
        """The pre- and post-activation (2F); ReLU needs only its output (F) unless dropout copies it."""
        hidden = self.fc1.out_features
        return hidden if isinstance(self.act, nn.ReLU) and not self.drop.p else 2 * hidden

    def mask_per_token(self) -> int:
        """The dropout mask on the hidden activation, a byte per element."""
        return self.fc1.out_features if self.drop.p else 0


class GatedMLP(nn.Module):
    residual_out = ("fc2",)
    summary_part = "ffn"

    def __init__(self, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0, activation: nn.Module) -> None:
        super().__init__()
        self.fc1 = Linear(dim, 2 * hidden, bias=bias)  # [gate | up]
        self.act = activation
        self.drop = Dropout(dropout)
        self.fc2 = Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)  # (B, T, F) each
        return self.fc2(self.drop(self.act(gate) * up))

    def flops(self, tokens: int, memory: int | None = None) -> int:
        return linear_flops(self, tokens)

    def saved_per_token(self) -> int:
        """[gate | up], act(gate) and their product (4F)."""
        return 4 * self.fc2.in_features

    def mask_per_token(self) -> int:
        """The dropout mask on the gated product, a byte per element."""
        return self.fc2.in_features if self.drop.p else 0


def _activation(kind: str, approximate: str = "none") -> nn.Module:
    return {"relu": nn.ReLU, "silu": nn.SiLU, "swiglu": nn.SiLU}.get(kind, lambda: nn.GELU(approximate=approximate))()


@register("ffn", "relu")
@register("ffn", "gelu")
@register("ffn", "silu")
def _mlp(spec, *, dim: int, dropout: float, **_) -> MLP:
    act = _activation(spec.kind, getattr(spec, "approximate", "none"))
    return MLP(dim, spec.hidden_size(dim), bias=spec.bias, dropout=dropout, activation=act)


@register("ffn", "swiglu")
@register("ffn", "geglu")
def _gated(spec, *, dim: int, dropout: float, **_) -> GatedMLP:
    act = _activation(spec.kind, getattr(spec, "approximate", "none"))
    return GatedMLP(dim, spec.hidden_size(dim), bias=spec.bias, dropout=dropout, activation=act)
