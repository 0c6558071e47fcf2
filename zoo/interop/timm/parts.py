"""What the timm classes' converters (:mod:`zoo.interop.timm.vit`, :mod:`zoo.interop.timm.eva`)
share: reading an MLP's activation and the LayerNorms' eps from timm modules, the ``mlp_ratio``
that gives back a hidden size, and the rules of the embeddings and of the output (final norm,
head), named alike in every class. timm is imported only when a converter runs."""

from __future__ import annotations

import math

from torch import nn

from zoo.interop.common import rule, unsupported
from zoo.spec import FamilySpec

__all__ = ["activation_of", "embedding_rules", "layernorm_eps", "mlp_ratio", "norm_of", "norm_params", "output_rules"]


def activation_of(act: nn.Module, where: str) -> dict:
    """A timm MLP activation as zoo FFN fields (kind, approximate)."""
    from timm.layers import activations

    if isinstance(act, nn.GELU):
        return {"kind": "gelu", "approximate": act.approximate}
    if type(act) is activations.GELU:
        return {"kind": "gelu", "approximate": "none"}
    if type(act) is activations.GELUTanh:
        return {"kind": "gelu", "approximate": "tanh"}
    if type(act) is activations.QuickGELU:
        return {"kind": "quick_gelu"}
    if type(act) in (nn.ReLU, nn.SiLU):
        return {"kind": "relu" if type(act) is nn.ReLU else "silu"}
    raise unsupported(where, "act_layer", type(act).__name__,
                      "zoo's ViT MLP activations are GELU (exact or tanh), quick GELU, ReLU and SiLU")


def layernorm_eps(norms: list[nn.Module], where: str) -> float:
    """The one eps of ``norms``, refusing a norm that is no LayerNorm with weight and bias."""
    for n in norms:
        if not (type(n).__name__ == "LayerNorm" and isinstance(n, nn.LayerNorm) and n.elementwise_affine and n.bias is not None):
            raise unsupported(where, "norm_layer", type(n).__name__, "zoo's ViT uses LayerNorm with weight and bias")
    eps = {n.eps for n in norms}
    if len(eps) > 1:
        raise unsupported(where, "norm_layer eps", sorted(eps), "zoo's ViT uses one eps for every norm")
    return eps.pop()


def norm_of(norms: list[nn.Module], where: str) -> dict:
    """The one norm of ``norms`` as a zoo norm spec mapping: LayerNorm with weight and bias, or
    timm's RmsNorm with a weight (AIMv2), one kind and one eps for all."""
    from timm.layers import RmsNorm

    if norms and all(type(n) is RmsNorm for n in norms):
        if not all(n.elementwise_affine for n in norms):
            raise unsupported(where, "norm_layer", "RmsNorm without a weight", "zoo's RMSNorm has a weight")
        eps = {n.eps for n in norms}
        if len(eps) > 1:
            raise unsupported(where, "norm_layer eps", sorted(eps), "zoo's ViT uses one eps for every norm")
        return {"kind": "rmsnorm", "eps": eps.pop()}
    return {"kind": "layernorm", "eps": layernorm_eps(norms, where)}


def norm_params(s: FamilySpec) -> tuple[str, ...]:
    """The tensors of each of the spec's norms: a LayerNorm's weight and bias, an RMSNorm's weight."""
    return ("weight", "bias") if s.block.norm.kind == "layernorm" else ("weight",)


def mlp_ratio(d: int, hidden: int) -> float:
    """The float ratio timm turns back into ``hidden`` (it sizes the MLP as ``int(d * mlp_ratio)``;
    ``hidden / d`` alone can land one ulp low, and truncation then loses a unit)."""
    ratio = hidden / d
    while int(d * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    while int(d * ratio) > hidden:
        ratio = math.nextafter(ratio, -math.inf)
    return ratio


def embedding_rules(s: FamilySpec) -> list:
    """The rules of the patch projection, the prefix tokens, the position table and the pre-norm
    (the same names in timm's VisionTransformer and Eva)."""
    rules = [rule("patch_embed.proj.weight", "patch_embed.proj.weight")]
    rules += [rule(name, name) for name, on in (("patch_embed.proj.bias", s.patch_bias), ("cls_token", s.class_token),
                                                 ("reg_token", s.reg_tokens)) if on]
    rules += [rule(f"norm_pre.{p}", f"norm_pre.{p}") for p in norm_params(s) if s.pre_norm]
    rules += [rule(f"patch_embed.norm.{p}", f"patch_embed.norm.{p}") for p in norm_params(s) if s.patch_norm]
    if s.position.kind == "learned":
        rules.append(rule("position.weight", "pos_embed"))  # [1, N, D] in timm, [N, D] in zoo
    return rules


def output_rules(s: FamilySpec) -> list:
    """The final norm (``fc_norm`` after pooling, else the stack's ``norm``) and the classifier."""
    final = ("fc_norm", "fc_norm") if s.fc_norm else ("stack.norm", "norm")
    rules = [rule(f"{final[0]}.{p}", f"{final[1]}.{p}") for p in norm_params(s)]
    return rules + [rule(f"head.{p}", f"head.{p}") for p in ("weight", "bias") if s.num_classes is not None]


def refuse_unless(checks: list, where: str) -> None:
    """Raise, naming the timm option, for the first ``(option, value, ok, why)`` of ``checks`` that is
    not ok."""
    for option, value, ok, why in checks:
        if not ok:
            raise unsupported(where, option, value, why)
