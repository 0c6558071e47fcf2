"""What model code asks of a block's parts (attention, FFN): declarations, not ``isinstance``.

A part may declare:

* ``residual_out: tuple[str, ...]``, a class attribute: the names of its linears whose outputs are
  added to the residual stream (``Attention``: ``("out",)``; ``MLP``, ``GatedMLP``: ``("fc2",)``).
  With ``init.scaled_residual`` their weights are drawn with std / sqrt(2 * n_layers) (GPT-2).
* ``flops(tokens, memory=None) -> int``: the FLOPs of its forward pass over one sequence of
  ``tokens`` tokens (cross-attention: keys and values from ``memory`` tokens), counting a
  multiply-add as two and only matrix products, as ``zoo.summary`` and ``torch.utils.flop_counter`` do.
* ``saved(tokens, memory=None, *, rotates=False) -> int``: the elements its forward pass over
  ``tokens`` tokens keeps for the backward pass besides its input (``rotates``: a position rotates
  its queries and keys, which keeps copies of them), for ``zoo.summary``'s activation memory; or
  ``saved_per_token() -> int`` (FFNs, norms, heads) for the same per token.
* ``mask_per_token() -> int``: the bytes of dropout masks it keeps per token.
* ``n_heads``, ``n_kv_heads``, ``head_dim``, ``v_head_dim`` (attention): head counts and sizes, for
  ``zoo.summary``'s KV cache.

A registered part that declares nothing gets these fallbacks:

* residual outputs: ``fc2`` where the part has linears ``fc1`` and ``fc2`` (an FFN); ``out`` where it
  has a linear ``out`` and a linear ``qkv`` or ``kv`` (an attention); else none;
* FLOPs: every ``nn.Linear`` inside it applied once per token (an attention's score and weighted-sum
  products are not counted: declare ``flops`` to count them);
* saved elements per token: twice the output width of each linear but the last (a norm: none);
* dropout masks: none;
* head sizes: one head as wide as the model.
"""

from __future__ import annotations

from torch import nn

__all__ = ["flops", "has_parameters", "head_sizes", "linear_flops", "mask_per_token", "norm_saved", "residual_linears",
           "residual_out", "saved", "saved_per_token"]


def _linear(part: nn.Module, name: str) -> bool:
    return isinstance(getattr(part, name, None), nn.Linear)


def residual_out(part: nn.Module) -> tuple[str, ...]:
    """The names of ``part``'s linears that write into the residual stream: its declaration, else the
    fallback above."""
    declared = getattr(part, "residual_out", None)
    if declared is not None:
        return tuple(declared)
    if _linear(part, "fc1") and _linear(part, "fc2"):
        return ("fc2",)
    if _linear(part, "out") and (_linear(part, "qkv") or _linear(part, "kv")):
        return ("out",)
    return ()


def residual_linears(part: nn.Module) -> list[nn.Module]:
    """The modules :func:`residual_out` names."""
    return [getattr(part, name) for name in residual_out(part)]


def linear_flops(module: nn.Module | None, tokens: int) -> int:
    """Every ``nn.Linear`` in ``module`` applied to ``tokens`` tokens."""
    if module is None:
        return 0
    return sum(2 * m.in_features * m.out_features * tokens for m in module.modules() if isinstance(m, nn.Linear))


def flops(part: nn.Module | None, tokens: int, memory: int | None = None) -> int:
    """Forward FLOPs of ``part`` over ``tokens`` tokens (and ``memory`` memory tokens): its ``flops``
    declaration, else :func:`linear_flops`."""
    if part is None:
        return 0
    declared = getattr(part, "flops", None)
    if callable(declared):
        return declared(tokens, memory)
    return linear_flops(part, tokens)


def saved_per_token(part: nn.Module) -> int:
    """Elements per token an FFN keeps for the backward pass besides its input."""
    declared = getattr(part, "saved_per_token", None)
    if callable(declared):
        return declared()
    linears = [m for m in part.modules() if isinstance(m, nn.Linear)]
    return 2 * sum(m.out_features for m in linears[:-1])


def saved(part: nn.Module | None, tokens: int, memory: int | None = None, *, rotates: bool = False) -> int:
    """Elements ``part`` keeps for the backward pass over ``tokens`` tokens (and ``memory`` memory
    tokens): its ``saved`` declaration, else ``tokens * saved_per_token(part)``."""
    if part is None:
        return 0
    declared = getattr(part, "saved", None)
    if callable(declared):
        return declared(tokens, memory, rotates=rotates)
    return tokens * saved_per_token(part)


def norm_saved(norm: nn.Module) -> int:
    """Elements per token a norm keeps besides its input (RMSNorm: its normalised input); 0 if it
    declares nothing."""
    declared = getattr(norm, "saved_per_token", None)
    return declared() if callable(declared) else 0


def mask_per_token(part: nn.Module | None) -> int:
    """Bytes of dropout masks ``part`` keeps per token, as it declares; 0 if it declares nothing."""
    declared = getattr(part, "mask_per_token", None)
    return declared() if callable(declared) else 0


def has_parameters(module: nn.Module | None) -> bool:
    return module is not None and any(True for _ in module.parameters())


def head_sizes(part: nn.Module, dim: int) -> tuple[int, int, int, int]:
    """An attention's (n_heads, n_kv_heads, head_dim, v_head_dim); (1, 1, dim, dim) if undeclared."""
    names = ("n_heads", "n_kv_heads", "head_dim", "v_head_dim")
    if all(isinstance(getattr(part, n, None), int) for n in names):
        return tuple(getattr(part, n) for n in names)
    return 1, 1, dim, dim
