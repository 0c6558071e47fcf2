"""What model code asks of a block's parts (attention, FFN): their declarations, else a fallback.

A part declares what it can say about itself by having the members of a protocol of
:mod:`zoo.protocols` (zoo's parts subclass them): the linears it writes into the residual stream
(``ResidualWriter``), its FLOPs (``CountsFlops``), the activations it keeps for the backward pass
(``SavesActivations``, ``SavesPerToken``), its dropout masks (``KeepsMasks``) and an attention's head
sizes (``HeadSizes``). The functions here ask with ``isinstance`` (a structural check: a part a user
registers need not subclass anything) and count alike for every part.

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

from zoo.protocols import CachesPerToken, CountsFlops, HeadSizes, HoldsState, KeepsMasks, ResidualWriter, SavesActivations, SavesPerToken

__all__ = ["state_elements", "cache_elements", "flops", "has_parameters", "head_sizes", "linear_flops", "mask_per_token", "norm_saved", "residual_linears",
           "residual_out", "saved", "saved_per_token"]


def _linear(part: nn.Module, name: str) -> bool:
    return isinstance(getattr(part, name, None), nn.Linear)


def residual_out(part: nn.Module) -> tuple[str, ...]:
    """The names of ``part``'s linears that write into the residual stream: its declaration, else the
    fallback above."""
    if isinstance(part, ResidualWriter):
        return tuple(part.residual_out)
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
    if isinstance(part, CountsFlops):
        return part.flops(tokens, memory)
    return linear_flops(part, tokens)


def saved_per_token(part: nn.Module) -> int:
    """Elements per token an FFN keeps for the backward pass besides its input."""
    if isinstance(part, SavesPerToken):
        return part.saved_per_token()
    linears = [m for m in part.modules() if isinstance(m, nn.Linear)]
    return 2 * sum(m.out_features for m in linears[:-1])


def saved(part: nn.Module | None, tokens: int, memory: int | None = None, *, rotates: bool = False) -> int:
    """Elements ``part`` keeps for the backward pass over ``tokens`` tokens (and ``memory`` memory
    tokens): its ``saved`` declaration, else ``tokens * saved_per_token(part)``."""
    if part is None:
        return 0
    if isinstance(part, SavesActivations):
        return part.saved(tokens, memory, rotates=rotates)
    return tokens * saved_per_token(part)


def norm_saved(norm: nn.Module) -> int:
    """Elements per token a norm keeps besides its input (RMSNorm: its normalised input); 0 if it
    declares nothing."""
    return norm.saved_per_token() if isinstance(norm, SavesPerToken) else 0


def mask_per_token(part: nn.Module | None) -> int:
    """Bytes of dropout masks ``part`` keeps per token, as it declares; 0 if it declares nothing."""
    return part.mask_per_token() if isinstance(part, KeepsMasks) else 0


def has_parameters(module: nn.Module | None) -> bool:
    return module is not None and any(True for _ in module.parameters())


def head_sizes(part: nn.Module, dim: int) -> tuple[int, int, int, int]:
    """An attention's (n_heads, n_kv_heads, head_dim, v_head_dim); (1, 1, dim, dim) if undeclared."""
    if isinstance(part, HeadSizes):
        return part.n_heads, part.n_kv_heads, part.head_dim, part.v_head_dim
    return 1, 1, dim, dim


def cache_elements(part: nn.Module | None) -> int:
    """Elements an attention caches per token: its declaration (multi-head latent attention's
    latent), else its key/value heads' keys and values, G * (K + V)."""
    if part is None:
        return 0
    if isinstance(part, CachesPerToken):
        return part.cache_elements()
    _, G, K, V = head_sizes(part, 0)
    return G * (K + V)


def state_elements(part: nn.Module | None) -> int:
    """Elements a mixer holds per sequence however long (gated DeltaNet's state), else 0."""
    return part.state_elements() if isinstance(part, HoldsState) else 0
