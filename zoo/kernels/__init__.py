"""Speed paths for one kind of hardware, each behind one small dispatch function.

:func:`linear`, :func:`dropout` and :func:`attention` compute what ``F.linear``, ``F.dropout`` and
``F.scaled_dot_product_attention`` compute; where a kernel under :mod:`zoo.kernels.cpu` is known to
be faster (its ``applies`` says when), they run it instead. Components call only these functions.
:func:`scores_attention` computes attention on explicit scores, for what no fused kernel computes
(soft-capped scores); an attention spec's ``kernel`` says which of the two it takes.
:class:`Mask` is the one mask concept (causal, windows, padding, documents, prefix, bias) that
the models build and the attention backends read: dense SDPA, :mod:`zoo.kernels.blocked` (CPU
blocks of SDPA over each block's band of keys) and :mod:`zoo.kernels.flex` (FlexAttention on CUDA),
chosen per call by :func:`backend_for` under :func:`attention_backend`.
:func:`sdpa_only` turns zoo's own attention off within a context (so a forced SDPA kernel applies).
Which kernel runs is one policy (:mod:`zoo.kernels.policy`): :func:`use` sets it, ``policy.policy()``
reads it, ``zoo kernels --explain SPEC`` prints it.
:func:`grouped_mm` multiplies rows sorted by group by one matrix per group (mixture-of-experts
layers, :mod:`zoo.kernels.grouped`).
:func:`linear_cross_entropy` is the cross-entropy of a vocabulary projection computed chunk by chunk,
without the [N, V] logits (:mod:`zoo.kernels.loss`; the heads' ``loss``).
"""

from zoo.kernels import blocked, cpu, flex, grouped, loss, policy
from zoo.kernels.cpu.attention import sdpa_only
from zoo.kernels.dispatch import BACKENDS, attention, attention_backend, backend_for, dropout, linear, scores_attention
from zoo.kernels.grouped import grouped_mm
from zoo.kernels.loss import linear_cross_entropy
from zoo.kernels.mask import AlibiBias, Mask, MaskError, PairBias, RelativeBias, document_positions
from zoo.kernels.policy import Policy, explaining, use

__all__ = ["BACKENDS", "AlibiBias", "Mask", "MaskError", "Policy", "attention", "attention_backend", "backend_for",
           "blocked", "cpu", "document_positions", "dropout", "explaining", "flex", "grouped", "grouped_mm", "linear",
           "linear_cross_entropy", "loss", "PairBias", "policy", "RelativeBias", "scores_attention", "sdpa_only", "use"]
