"""A sparse mixture of gated-FFN experts (``ffn.kind: moe``, :class:`zoo.spec.moe.MoESpec`) and the
losses of its router.

Forward: the router's logits [N, E] pick each token's ``top_k`` experts and weights as HF's
Mixtral/Qwen2-MoE routers do (softmax in fp32, ``torch.topk`` on the same values, so ties break
alike); the N * top_k (token, expert) pairs are sorted by expert, each expert's contiguous slice
goes through its gated FFN by :func:`zoo.kernels.grouped_mm` (no loop over experts where torch's
grouped_mm applies), and the weighted outputs are added back per token.

Changes to routing, all off by default:

* ``bias_update`` (DeepSeek-V3's auxiliary-loss-free balancing): a per-expert bias (the buffer
  ``expert_bias``, saved with the weights) is added to the scores that pick the top k, never to the
  weights; ``zoo.train.router`` moves it after each optimizer step toward equal load.
* DeepSeek-V3's router (:meth:`MoE.pick`, as HF's ``DeepseekV3TopkRouter``): ``scoring: sigmoid``
  scores each expert on its own; ``n_groups`` limits a token to the experts of its best
  ``topk_groups`` groups; ``score_bias`` holds ``expert_bias`` fixed where ``bias_update`` is 0
  (a loaded ``e_score_correction_bias``); ``routed_scale`` multiplies the routed weights.
  DeepSeek-V2's (as ``DeepseekV2TopkRouter``): softmax scores, each group ranked by its best score
  alone (``group_top: 1``), no bias, no renormalisation, the logits in fp32 (``fp32_logits``).
* ``capacity_factor`` (Switch Transformer): in training, each expert takes at most
  ``ceil(capacity_factor * N * top_k / E)`` of the pairs routed to it, the first by position (token
  order in the batch, its rows one after another; padding tokens, which the module does not see as
  such, take places too); the rest are dropped: that expert adds nothing to those tokens, whose
  residual stream carries them on. Evaluation and decoding are dropless, so a cached decode equals a
  full pass and no sequence changes another's outputs.

gpt-oss's experts: ``router_bias`` puts a bias on the router's linear, ``bias`` gives each expert
biases on its two products (``b_gate_up`` [E, 2F], ``b_down`` [E, D], added to each expert's rows),
and a :class:`~zoo.components.ffn.ClampedSwiGLU` activation gates [gate | up] with its clamp.

What the last forward pass routed stays on the module, for the router's losses
(:func:`load_balancing_loss`, :func:`router_z_loss`) and the training loop's statistics
(:mod:`zoo.train.router`): ``router_logits`` [N, E] (N = B*T), ``routed`` [N, k] (each token's
experts) and ``dropped`` (the pairs over capacity, a 0-d tensor; None where nothing is capped).

Shapes: B batch, T tokens, N = B*T, D dim, E experts, F per-expert hidden, k top_k.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.components.dropout import Dropout
from zoo.components.ffn import ClampedSwiGLU, GatedMLP, gated_activation, glu
from zoo.components.linear import Linear
from zoo.kernels.grouped import compute_dtype, expert_rows, gated, gather_rows, grouped_mm, row_block, scatter_rows
from zoo.protocols import CountsFlops, Experts, InitNormal, InitResidual, KeepsMasks, ResidualWriter, SavesPerToken, SummaryPart
from zoo.registry import register

__all__ = ["MoE", "load_balancing_loss", "router_z_loss"]

# in evaluation under torch.compile, up to this many tokens (a decoding step's rows) take
# MoE._fixed_shape: shapes independent of the routing, one graph for every step
FIXED_SHAPE_TOKENS = 256


class MoE(nn.Module, ResidualWriter, SummaryPart, InitNormal, InitResidual, CountsFlops, SavesPerToken, KeepsMasks,
          Experts):
    residual_out = ()  # the experts' w_down is drawn with the residual std (init_residual)
    summary_part = "ffn"
    init_normal = ("w_gate_up",)
    init_residual = ("w_down",)

    def __init__(self, dim: int, hidden: int, *, n_experts: int, top_k: int, activation: nn.Module,
                 softmax_before_topk: bool = True, norm_topk_prob: bool = True, jitter: float = 0.0,
                 shared_hidden: int | None = None, shared_gate: bool = True, dropout: float = 0.0,
                 aux_loss_coef: float = 0.01, z_loss_coef: float = 0.0, bias_update: float = 0.0,
                 capacity_factor: float | None = None, router_bias: bool = False, bias: bool = False,
                 scoring: str = "softmax", n_groups: int = 1, topk_groups: int = 1, score_bias: bool = False,
                 routed_scale: float = 1.0, sigmoid_after_topk: bool = False, weight_input: bool = False,
                 group_top: int = 2, fp32_logits: bool = False) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.hidden = n_experts, top_k, hidden
        self.softmax_before_topk, self.norm_topk_prob, self.jitter = softmax_before_topk, norm_topk_prob, jitter
        self.aux_loss_coef, self.z_loss_coef, self.bias_update = aux_loss_coef, z_loss_coef, bias_update
        self.capacity_factor = capacity_factor
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring must be softmax or sigmoid, got {scoring!r}")
        self.scoring, self.n_groups, self.topk_groups = scoring, n_groups, topk_groups
        self.routed_scale, self.group_top, self.fp32_logits = routed_scale, group_top, fp32_logits
        if fp32_logits and router_bias:
            raise ValueError("fp32_logits: the router's fp32 logits are computed without a bias (DeepSeek-V2); drop router.bias")
        self.sigmoid_after_topk, self.weight_input = sigmoid_after_topk, weight_input
        self.router = Linear(dim, n_experts, bias=router_bias)  # HF: gate.weight [E, D] (gpt-oss: and a bias)
        self.w_gate_up = nn.Parameter(torch.empty(n_experts, 2 * hidden, dim))  # [gate | up] per expert
        self.w_down = nn.Parameter(torch.empty(n_experts, dim, hidden))
        # the experts' biases (gpt-oss), added to each expert's rows; zero at initialisation
        self.b_gate_up = nn.Parameter(torch.zeros(n_experts, 2 * hidden)) if bias else None
        self.b_down = nn.Parameter(torch.zeros(n_experts, dim)) if bias else None
        self.act = activation
        self.drop = Dropout(dropout)
        self.shared = None if shared_hidden is None else GatedMLP(dim, shared_hidden, bias=False, dropout=dropout,
                                                                  activation=copy.deepcopy(activation))
        self.shared_gate = Linear(dim, 1, bias=False) if shared_hidden is not None and shared_gate else None
        # persistent: it changes which experts a token takes, so it travels with the weights
        self.register_buffer("expert_bias", torch.zeros(n_experts) if bias_update or score_bias else None)
        self.router_logits: Tensor | None = None
        self.routed: Tensor | None = None
        self.dropped: Tensor | None = None
        nn.init.normal_(self.w_gate_up, std=0.02)
        nn.init.normal_(self.w_down, std=0.02)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(logits [N, E], weights [N, k] fp32, experts [N, k]) of tokens x [N, D]."""
        if self.scoring == "sigmoid":  # DeepSeek-V3: fp32 logits of the fp32 weight, each expert's sigmoid
            logits = F.linear(x.float(), self.router.weight.float())
            return (logits, *self.pick(logits.sigmoid()))
        logits = F.linear(x.float(), self.router.weight.float()) if self.fp32_logits else self.router(x)  # DeepSeek-V2
        if self.sigmoid_after_topk:  # Llama 4: the top k of the logits, each weighted by its sigmoid
            top, experts = torch.topk(logits, self.top_k, dim=-1)
            return logits, torch.sigmoid(top.float()), experts
        scores = F.softmax(logits.float(), dim=-1) if self.softmax_before_topk else logits.float()
        if self.n_groups > 1 or self.routed_scale != 1.0:
            return (logits, *self.pick(scores))
        if self.expert_bias is None:
            top, experts = torch.topk(scores, self.top_k, dim=-1)
        else:  # the bias picks the experts but never weighs them (DeepSeek-V3)
            experts = torch.topk(scores.detach() + self.expert_bias.float(), self.top_k, dim=-1).indices
            top = scores.gather(-1, experts)
        if not self.softmax_before_topk:
            weights = F.softmax(top, dim=-1)
        else:
            weights = top / top.sum(dim=-1, keepdim=True) if self.norm_topk_prob else top
        return logits, weights, experts

    def pick(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """(weights [N, k] fp32, experts [N, k]) of every expert's ``scores`` [N, E] (fp32), as HF's
        DeepseekV3TopkRouter: the score bias added for the choice, the experts of the best
        ``topk_groups`` groups (each ranked by the sum of its ``group_top`` best biased scores) kept,
        the top k of those, their unbiased scores renormalised (``norm_topk_prob``) and times
        ``routed_scale``; HF's DeepseekV2TopkRouter is the same with softmax scores, ``group_top`` 1."""
        choice = scores.detach() if self.expert_bias is None else scores.detach() + self.expert_bias.float()
        if self.n_groups > 1:
            n, g = choice.shape[0], self.n_groups
            grouped = choice.view(n, g, -1)
            ranks = grouped.topk(self.group_top, dim=-1).values.sum(dim=-1)  # (N, G)
            best = torch.topk(ranks, self.topk_groups, dim=-1, sorted=False).indices
            keep = torch.zeros_like(ranks).scatter_(1, best, 1.0).bool()
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, -1)
        experts = torch.topk(choice, self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scale if self.routed_scale != 1.0 else weights, experts

    def capacity(self, tokens: int) -> int | None:
        """The most (token, expert) pairs one expert takes in training of ``tokens`` tokens; None: dropless."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts)

    def within_capacity(self, order: Tensor, counts: Tensor, sorted_experts: Tensor,
                        capacity: int) -> tuple[Tensor, Tensor, Tensor]:
        """(order, counts, dropped): the pairs in ``order`` (sorted by expert, in token order within
        each: a stable sort; ``sorted_experts`` their experts) past their expert's first ``capacity``
        removed, the counts capped, and how many were removed."""
        starts = counts.cumsum(0) - counts  # (E,) where each expert's pairs begin
        place = torch.arange(order.numel(), device=order.device) - starts[sorted_experts]  # in its expert's queue
        keep = place < capacity
        return order[keep], counts.clamp(max=capacity), (~keep).sum()

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        shape = x.shape
        if self.training and self.jitter > 0:
            x = x * torch.empty_like(x).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        x = x.reshape(-1, shape[-1])
        logits, weights, experts = self.route(x)
        self.router_logits, self.routed, self.dropped = logits, experts, None
        n, k = x.shape[0], self.top_k
        pairs_in = x  # each token's rows (k a token), or with weight_input one row per (token, slot) pair
        if self.weight_input:  # the weight scales each expert's input (Llama 4), its output is summed as it is
            pairs_in = (x.unsqueeze(1) * weights.to(x.dtype).unsqueeze(-1)).reshape(n * k, -1)
        if not self.training and torch.compiler.is_compiling() and n <= FIXED_SHAPE_TOKENS:
            return self._fixed_shape(x, weights, experts).reshape(shape)
        flat = experts.reshape(-1)  # (N * k,) each (token, slot) pair's expert
        order = torch.argsort(flat, stable=True)  # the pairs by expert, in token order within each
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat))  # as bincount, without its host sync on CUDA
        capacity = self.capacity(n) if self.training else None
        if capacity is not None:  # the pairs past an expert's capacity leave order (their output: zero)
            order, counts, self.dropped = self.within_capacity(order, counts, flat[order], capacity)
        rows = expert_rows(order, counts, row_block(x, self.w_gate_up, order.numel(), self.n_experts))
        per_row = 1 if self.weight_input else k
        xs = gather_rows(pairs_in.to(compute_dtype(x, self.w_gate_up)), rows, per_row)  # (rows.size, D), sorted by expert
        row_experts = None if self.b_gate_up is None else self._row_experts(flat, rows)
        gu = self._biased(grouped_mm(xs, self.w_gate_up, rows.counts, rows.offsets), self.b_gate_up, row_experts)
        h = self.drop(self._gated(gu))
        h = self._biased(grouped_mm(h, self.w_down, rows.counts, rows.offsets), self.b_down, row_experts)
        pairs = scatter_rows(h, rows, n * k).view(n, k, -1)  # back in (token, slot) order
        out = (pairs.float() * (1.0 if self.weight_input else weights.unsqueeze(-1))).sum(1).to(x.dtype)
        if self.shared is not None:
            s = self.shared(x)
            out = out + (torch.sigmoid(self.shared_gate(x)) * s if self.shared_gate is not None else s)
        return out.reshape(shape)

    def _gated(self, gu: Tensor) -> Tensor:
        """The experts' gated product of [gate | up] [..., 2F] -> [..., F]."""
        if isinstance(self.act, ClampedSwiGLU):
            return glu(self.act, *gu.chunk(2, dim=-1))
        return gated(gu, self.act)

    @staticmethod
    def _row_experts(flat: Tensor, rows) -> Tensor:
        """Each row's expert in the expert-ordered buffer of ``rows`` (padding rows: expert 0, read by none)."""
        sorted_experts = flat[rows.order]
        if rows.pos is None:
            return sorted_experts
        return sorted_experts.new_zeros(rows.size).index_copy_(0, rows.pos, sorted_experts)

    @staticmethod
    def _biased(h: Tensor, bias: Tensor | None, experts: Tensor | None) -> Tensor:
        """``h`` plus each row's expert's ``bias`` (none: h)."""
        return h if bias is None else h + bias.to(h.dtype)[experts]

    def _fixed_shape(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """The routed experts' weighted sum for a few tokens x [N, D] in shapes that do not depend on
        the routing (a compiled decoding step: the sorted path's row counts are data): each token's
        k experts' weights gathered where that reads no more than all of them (N * k <= E), else every
        expert on every token with the unpicked ones weighted 0. The same sum as the sorted path."""
        n, k, E = x.shape[0], self.top_k, self.n_experts
        xc = x.to(compute_dtype(x, self.w_gate_up))
        if self.weight_input:  # each pair's input scaled by its weight (Llama 4): the picked experts only
            xk = xc.unsqueeze(1) * weights.to(xc.dtype).unsqueeze(-1)  # (N, k, D)
            gu = self._biased(torch.einsum("nkd,nkfd->nkf", xk, self.w_gate_up[experts]), self.b_gate_up, experts)
            h = self._biased(torch.einsum("nkf,nkdf->nkd", self._gated(gu), self.w_down[experts]), self.b_down, experts)
            out = h.float().sum(1)
        elif n * k <= E:
            gu = self._biased(torch.einsum("nd,nkfd->nkf", xc, self.w_gate_up[experts]), self.b_gate_up, experts)
            h = torch.einsum("nkf,nkdf->nkd", self._gated(gu), self.w_down[experts])  # (N, k, D)
            h = self._biased(h, self.b_down, experts)
            out = (h.float() * weights.unsqueeze(-1)).sum(1)
        else:
            gu = torch.einsum("nd,efd->nef", xc, self.w_gate_up)  # (N, E, 2F)
            gu = gu if self.b_gate_up is None else gu + self.b_gate_up.to(gu.dtype)
            h = torch.einsum("nef,edf->ned", self._gated(gu), self.w_down)  # (N, E, D)
            h = h if self.b_down is None else h + self.b_down.to(h.dtype)
            dense = torch.zeros(n, E, device=x.device).scatter(1, experts, weights.float())  # (N, E), 0 = not picked
            out = (h.float() * dense.unsqueeze(-1)).sum(1)
        out = out.to(x.dtype)
        if self.shared is not None:
            s = self.shared(x)
            out = out + (torch.sigmoid(self.shared_gate(x)) * s if self.shared_gate is not None else s)
        return out

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Active FLOPs: the router and each token's top_k experts (and the shared expert)."""
        d = self.router.in_features
        shared = 0 if self.shared is None else 3 * d * self.shared.fc2.in_features + (d if self.shared_gate else 0)
        return 2 * tokens * (d * self.n_experts + self.top_k * 3 * d * self.hidden + shared)

    def expert_parameters(self) -> int:
        """The routed experts' parameters (with their biases), all ``n_experts`` of them (the shared
        expert is not one)."""
        biases = 0 if self.b_gate_up is None else self.b_gate_up.numel() + self.b_down.numel()
        return self.w_gate_up.numel() + self.w_down.numel() + biases

    def active_parameters(self) -> int:
        """The parameters one token's forward pass uses: the router, ``top_k`` experts and the
        shared expert with its gate."""
        idle = (self.n_experts - self.top_k) * (self.expert_parameters() // self.n_experts)
        return sum(p.numel() for p in self.parameters()) - idle

    def saved_per_token(self) -> int:
        """The router's logits and probabilities (2E); per routed expert its input (D), [gate | up]
        (2F), act(gate) and the product (2F) and its output (D), a clamped SwiGLU 4F more (its
        clamped halves, sigmoid and shifted up); the shared expert's 4F (8F)."""
        d = self.router.in_features
        shared = 0 if self.shared is None else self.shared.saved_per_token() + 1
        own = 8 if isinstance(self.act, ClampedSwiGLU) else 4
        return 2 * self.n_experts + self.top_k * (2 * d + own * self.hidden) + shared

    def mask_per_token(self) -> int:
        return self.top_k * self.hidden if self.drop.p else 0


def load_balancing_loss(router_logits: Tensor | tuple[Tensor, ...], top_k: int, n_experts: int,
                        padding_mask: Tensor | None = None) -> Tensor:
    """The Switch Transformer's auxiliary loss as HF's ``load_balancing_loss_func`` computes it:
    ``n_experts * sum_e f_e * P_e`` over the layers' logits together ([N, E] each, or one tensor),
    f_e the share of top-k assignments to expert e and P_e its mean router probability;
    ``padding_mask`` [B, T] (True or 1: a real token) leaves padding out."""
    logits = router_logits if isinstance(router_logits, Tensor) else torch.cat(list(router_logits))
    probs = F.softmax(logits.float(), dim=-1)  # (L*N, E)
    _, chosen = torch.topk(probs, top_k, dim=-1)
    hits = F.one_hot(chosen, n_experts).sum(dim=1).float()  # (L*N, E)
    if padding_mask is None:
        keep = torch.ones(probs.shape[0], device=probs.device)
    else:
        mask = padding_mask.reshape(-1).float()
        keep = mask.repeat(probs.shape[0] // mask.numel())
    rows = keep.sum()
    tokens_per_expert = (hits * keep[:, None]).sum(0) / rows
    prob_per_expert = (probs * keep[:, None]).sum(0) / rows
    return n_experts * torch.sum(tokens_per_expert * prob_per_expert)


def router_z_loss(router_logits: Tensor | tuple[Tensor, ...], padding_mask: Tensor | None = None) -> Tensor:
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): the mean over tokens of
    ``logsumexp(logits)^2``, over the layers' logits together ([N, E] each, as HF's Switch
    Transformers concatenates them); ``padding_mask`` [B, T] (True or 1: a real token) leaves
    padding out."""
    logits = router_logits if isinstance(router_logits, Tensor) else torch.cat(list(router_logits))
    z = torch.logsumexp(logits.float(), dim=-1).square()  # (L*N,)
    if padding_mask is None:
        return z.mean()
    keep = padding_mask.reshape(-1).float().repeat(z.numel() // padding_mask.numel())
    return (z * keep).sum() / keep.sum()


@register("ffn", "moe")
def _moe(spec, *, dim: int, dropout: float, **_) -> MoE:
    return MoE(dim, spec.expert.hidden_size(dim), n_experts=spec.n_experts, top_k=spec.top_k,
               activation=gated_activation(spec.expert),
               softmax_before_topk=spec.router.softmax_before_topk, norm_topk_prob=spec.router.norm_topk_prob,
               jitter=spec.router.jitter, shared_hidden=spec.shared_hidden, shared_gate=spec.shared_gate,
               dropout=dropout, aux_loss_coef=spec.router.aux_loss_coef, z_loss_coef=spec.router.z_loss_coef,
               bias_update=spec.router.bias_update, capacity_factor=spec.capacity_factor,
               router_bias=spec.router.bias, bias=spec.expert.bias, scoring=spec.router.scoring,
               n_groups=spec.router.n_groups, topk_groups=spec.router.topk_groups, score_bias=spec.router.score_bias,
               routed_scale=spec.router.routed_scale,
               sigmoid_after_topk=spec.router.sigmoid_after_topk, weight_input=spec.weight_input,
               group_top=spec.router.group_top, fp32_logits=spec.router.fp32_logits)
