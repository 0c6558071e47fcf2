"""Gated DeltaNet linear attention (``attention.kind: gated_deltanet``,
:class:`zoo.spec.GatedDeltaNetSpec`; Yang et al. 2024, HF ``Qwen3NextGatedDeltaNet``), with a
fixed-size decoding state in the cache instead of keys and values.

x -> ``qkvz`` (HF's layout: per query/key head its query, key, and its value heads' values and
output gates) and ``ba`` (per query/key head its value heads' write strengths b and decay inputs
a). Queries, keys and values pass the causal depthwise convolution ``conv`` and a SiLU; the gated
delta rule then runs per value head over a state S [K, V]:

    S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - k_t S));  o_t = q_t S
    g_t = -exp(A_log) * softplus(a_t + dt_bias),  beta_t = sigmoid(b_t)

with q, k L2-normalised and q scaled by 1/sqrt(K). A sequence runs in chunks of 64 tokens (the
UT transform of the DeltaNet papers, as HF's torch path); one new token steps the state. The
output passes ``norm`` (an RMSNorm over V gated by SiLU(z)) and ``out``.

Padding: padded tokens' inputs are zeroed (HF does the same), so their keys and values are zero
and the state stays as it was before them (zero before a left-padded prompt): left and right
padding give every real token what it gets alone. The cache (:class:`zoo.components.cache.LayerCache`
``state``) holds the convolution's last K_c - 1 inputs and S per row; the static cache holds
neither, and is refused.

Shapes: B batch, T tokens, D model width, G query/key heads, H value heads (r = H / G per query/key
head), K query/key head size, V value head size, C = 2GK + HV convolution channels, K_c taps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.components.linear import Linear
from zoo.components.parts import linear_flops
from zoo.kernels import Mask
from zoo.protocols import CachesPerToken, CountsFlops, HoldsState, ResidualWriter, SavesActivations, SummaryPart
from zoo.registry import register

__all__ = ["GatedDeltaNet", "GatedRMSNorm", "chunked_delta_rule", "delta_rule_step"]

CHUNK = 64


class GatedRMSNorm(nn.Module):
    """x [..., V], gate [..., V] -> RMSNorm(x) * weight * SiLU(gate) (normalised in float32, as HF's
    ``Qwen3NextRMSNormGated``)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(gate.float())).to(dtype)


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def chunked_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                       state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule over a sequence in chunks: q, k (B, H, T, K) normalised and scaled, v
    (B, H, T, V), g and beta (B, H, T), all float32; ``state`` (B, H, K, V) or None (zeros).
    Returns the outputs (B, H, T, V) and the final state."""
    B, H, T, K = k.shape
    V = v.shape[-1]
    pad = (CHUNK - T % CHUNK) % CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(B, H, -1, CHUNK, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(B, H, -1, CHUNK).cumsum(dim=-1)
    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()  # (B, H, N, C, C)
    system = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    new_v = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_decayed = torch.linalg.solve_triangular(system, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    S = q.new_zeros(B, H, K, V) if state is None else state.to(q)
    q = q * g.exp()[..., None]
    k = k * (g[..., -1:] - g).exp()[..., None]
    chunk_decay = g[..., -1].exp()[..., None, None]
    out = []
    for i in range(q.shape[2]):
        v_i = new_v[:, :, i] - k_decayed[:, :, i] @ S
        out.append(q[:, :, i] @ S + intra[:, :, i] @ v_i)
        S = S * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_i
    return torch.cat(out, dim=2)[:, :, :T], S


def delta_rule_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                    state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule token by token (shapes as :func:`chunked_delta_rule`), for decoding."""
    B, H, T, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state.to(q)
    out = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        delta = (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]
        S = S + k[:, :, t, :, None] * delta[..., None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, dim=2), S


class GatedDeltaNet(nn.Module, ResidualWriter, SummaryPart, CountsFlops, SavesActivations, CachesPerToken, HoldsState):
    """Gated DeltaNet of ``n_heads`` value heads of ``v_head_dim`` and ``key_heads`` query/key heads
    of ``head_dim``, a causal depthwise convolution of ``conv_kernel`` taps and a gated output norm
    (``eps``); see the module docstring."""

    residual_out = ("out",)
    summary_part = "attention"

    def __init__(self, dim: int, *, n_heads: int, key_heads: int, head_dim: int, v_head_dim: int,
                 conv_kernel: int = 4, eps: float = 1e-6) -> None:
        super().__init__()
        if n_heads % key_heads:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by key_heads ({key_heads})")
        self.n_heads, self.key_heads, self.head_dim, self.v_head_dim = n_heads, key_heads, head_dim, v_head_dim
        self.conv_kernel = conv_kernel
        self.key_size, self.value_size = key_heads * head_dim, n_heads * v_head_dim
        channels = 2 * self.key_size + self.value_size
        self.qkvz = Linear(dim, 2 * self.key_size + 2 * self.value_size, bias=False)
        self.ba = Linear(dim, 2 * n_heads, bias=False)
        self.conv = nn.Conv1d(channels, channels, conv_kernel, groups=channels, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(n_heads))
        self.A_log = nn.Parameter(torch.empty(n_heads).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(v_head_dim, eps)
        self.out = Linear(self.value_size, dim, bias=False)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, mask: Tensor | Mask | None = None,
                is_causal: bool = False, pos: object = None, positions: Tensor | None = None,
                cache: object = None) -> Tensor:
        """x [B, T, D] -> [B, T, D], causal; ``mask``'s padding (a :class:`zoo.kernels.Mask`, its last
        T keys the new tokens) zeroes padded inputs; ``cache`` carries the state between calls.
        Positions are not read."""
        if memory is not None:
            raise ValueError("GatedDeltaNet is self-attention; it takes no memory")
        B, T, _ = x.shape
        if cache is not None and not hasattr(cache, "state"):
            raise ValueError("gated_deltanet keeps a recurrent state, which the static cache does not hold; decode "
                             "with the dynamic cache")
        if isinstance(mask, Mask):
            if mask.documents is not None:
                raise ValueError("gated_deltanet: its state would carry from one packed document into the next; give "
                                 "it one document per row (no documents)")
            if mask.padding is not None:
                x = x * mask.padding[:, -T:, None].to(x.dtype)
        elif mask is not None:
            raise ValueError("GatedDeltaNet reads padding from a zoo.kernels.Mask; a dense mask does not say which "
                             "tokens are padding")
        state = cache.state if cache is not None else None
        G, H, K, V, r = self.key_heads, self.n_heads, self.head_dim, self.v_head_dim, self.n_heads // self.key_heads
        q, k, v, z = self.qkvz(x).view(B, T, G, 2 * K + 2 * r * V).split([K, K, r * V, r * V], dim=-1)
        b, a = self.ba(x).view(B, T, G, 2 * r).split([r, r], dim=-1)
        z, b, a = z.reshape(B, T, H, V), b.reshape(B, T, H), a.reshape(B, T, H)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1).transpose(1, 2)
        past = mixed.new_zeros(B, mixed.shape[1], self.conv_kernel - 1) if state is None else state["conv"]
        mixed = torch.cat([past, mixed], dim=-1)
        conv_state = mixed[:, :, mixed.shape[-1] - (self.conv_kernel - 1):]
        mixed = F.silu(F.conv1d(mixed, self.conv.weight, groups=mixed.shape[1])).transpose(1, 2)
        q, k, v = mixed.split([self.key_size, self.key_size, self.value_size], dim=-1)
        q, k = (t.reshape(B, T, G, K).repeat_interleave(r, dim=2).transpose(1, 2).float() for t in (q, k))
        v = v.reshape(B, T, H, V).transpose(1, 2).float()
        beta = b.sigmoid().transpose(1, 2).float()
        g = (-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)).transpose(1, 2)
        q, k = _l2norm(q) * K ** -0.5, _l2norm(k)
        rule = delta_rule_step if T == 1 and state is not None else chunked_delta_rule
        y, S = rule(q, k, v, g, beta, None if state is None else state["recurrent"])
        if cache is not None:
            cache.state = {"conv": conv_state, "recurrent": S}
        y = self.norm(y.transpose(1, 2).to(x.dtype), z)
        return self.out(y.reshape(B, T, H * V))

    def state_elements(self) -> int:
        """Elements of the decoding state per sequence, however long: the recurrent state H x K x V
        and the convolution's last K_c - 1 inputs."""
        return self.n_heads * self.head_dim * self.v_head_dim + (self.conv_kernel - 1) * self.conv.in_channels

    def cache_elements(self) -> int:
        """Elements cached per token: none (the state has a fixed size, :meth:`state_elements`)."""
        return 0

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Forward FLOPs over ``tokens`` tokens: the projections, the convolution and the chunked
        delta rule per value head and chunk of C = 64 tokens (a sequence padded to whole chunks):
        its C x C products k_beta k^T, q k^T and the intra-chunk read (4 C^2 K + 2 C^2 V), the two
        triangular solves (C^2 (K + V)) and the state's three C x K x V products (6 C K V)."""
        conv = 2 * self.conv.in_channels * self.conv_kernel * tokens
        C, K, V = CHUNK, self.head_dim, self.v_head_dim
        per_chunk = 4 * C * C * K + 2 * C * C * V + C * C * (K + V) + 6 * C * K * V
        rule = -(-tokens // C) * self.n_heads * per_chunk
        return linear_flops(self.qkvz, tokens) + linear_flops(self.ba, tokens) + linear_flops(self.out, tokens) + conv + rule

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False) -> int:
        """Elements kept for the backward pass besides the input, approximately (within about a
        quarter of autograd's count): per token the projections' outputs, the convolution's input
        and output, the float32 queries and keys (repeated to the value heads), the values, gates
        and the gated norm's tensors; per chunk of C = 64 tokens and value head its four C x C
        matrices, the chunk's keys and values and the state it starts from."""
        H, K, V, C = self.n_heads, self.head_dim, self.v_head_dim, CHUNK
        per_token = self.qkvz.out_features + self.ba.out_features + 2 * self.conv.in_channels + H * (5 * V + 2 * K + 5)
        per_chunk = H * (4 * C * C + C * (3 * K + 2 * V + 2) + 3 * K * V)
        return tokens * per_token + -(-tokens // C) * per_chunk


@register("attention", "gated_deltanet")
def _gated_deltanet(spec, *, dim: int, d_model: int, dropout: float, cross: bool = False, **_) -> GatedDeltaNet:
    if cross:
        raise ValueError("attention.kind: gated_deltanet is a causal self-attention mixer; a cross-attention is mha, "
                         "gqa or mqa")
    return GatedDeltaNet(dim, n_heads=spec.n_heads, key_heads=spec.key_heads, head_dim=spec.qk_size(d_model),
                         v_head_dim=spec.v_size(d_model), conv_kernel=spec.conv_kernel, eps=spec.norm_eps)
