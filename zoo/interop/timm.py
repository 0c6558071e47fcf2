"""Two-way converters between zoo's ViT and timm's VisionTransformer, exact in both directions.

    from_timm(timm_model) -> zoo model        to_timm(zoo_model) -> timm VisionTransformer
    timm_spec(timm_model) -> zoo spec

Covers ``vit_tiny/small/base_patch16_224`` and every VisionTransformer built from options zoo has:
class-token or mean ('avg') pooling, fc_norm, learned or no positions, Pre-Norm LayerNorm blocks,
a two-layer GELU / ReLU / SiLU MLP, biases on qkv and on the projections together. timm keeps few
options as attributes, so the spec is read from the modules themselves; any module zoo has no
counterpart for (layer scale, qk-norm, register tokens, attention pooling, ...) is refused by name.
timm is imported only when a converter runs.
"""

from __future__ import annotations

import functools
import math

from torch import nn

from zoo.build import build
from zoo.interop.common import ConversionError, check_covered, check_used, device_dtype, load_exact, reference_state, rule, unsupported, zoo_state
from zoo.spec import FamilySpec, parse_spec

__all__ = ["from_timm", "to_timm", "timm_spec", "timm_kwargs"]

FROM, TO = "timm VisionTransformer -> zoo", "zoo -> timm VisionTransformer"


def _is(module: nn.Module | None, cls: type | tuple) -> bool:
    return module is not None and isinstance(module, cls)


def _activation(act: nn.Module) -> dict:
    from timm.layers import activations

    if isinstance(act, nn.GELU):
        return {"kind": "gelu", "approximate": act.approximate}
    if type(act) is activations.GELU:
        return {"kind": "gelu", "approximate": "none"}
    if type(act) is activations.GELUTanh:
        return {"kind": "gelu", "approximate": "tanh"}
    if type(act) in (nn.ReLU, nn.SiLU):
        return {"kind": "relu" if type(act) is nn.ReLU else "silu"}
    raise unsupported(FROM, "act_layer", type(act).__name__, "zoo's ViT MLP activations are GELU (exact or tanh), ReLU and SiLU")


def _check_model(m: nn.Module) -> None:
    """Refuse, by name, every VisionTransformer option zoo has no counterpart for."""
    from timm.layers import PatchEmbed
    from timm.models.vision_transformer import VisionTransformer

    if type(m) is not VisionTransformer:
        raise ConversionError(f"from_timm: {type(m).__name__} does not convert; only timm's VisionTransformer does")
    checks = [
        ("reg_tokens", m.num_reg_tokens, m.num_reg_tokens == 0, "zoo's ViT has no register tokens"),
        ("no_embed_class", m.no_embed_class, not m.no_embed_class, "zoo adds positions to the class token too"),
        ("dynamic_img_size", m.dynamic_img_size, not m.dynamic_img_size, "zoo's ViT has one image size"),
        ("global_pool", m.global_pool, m.global_pool in ("token", "avg") and m.attn_pool is None,
         "zoo pools the class token ('token') or the mean of the patch tokens ('avg')"),
        ("pool_include_prefix", m.pool_include_prefix, not m.pool_include_prefix, "zoo's mean pooling skips the class token"),
        ("patch_drop_rate", getattr(m.patch_drop, "prob", 0.0), isinstance(m.patch_drop, nn.Identity), "zoo has no patch dropout"),
        ("pre_norm", True, isinstance(m.norm_pre, nn.Identity), "zoo's ViT has no norm before the blocks"),
        ("final_norm", False, not (isinstance(m.norm, nn.Identity) and isinstance(m.fc_norm, nn.Identity)),
         "zoo's Pre-Norm ViT ends with a norm (before or after pooling)"),
        ("num_classes", 0, isinstance(m.head, nn.Linear), "zoo's ViT ends in a linear classifier"),
        ("drop_rate", m.head_drop.p, m.head_drop.p == 0, "zoo has no dropout before the classifier"),
        ("embed_layer", type(m.patch_embed).__name__, type(m.patch_embed) is PatchEmbed and isinstance(m.patch_embed.norm, nn.Identity)
         and m.patch_embed.flatten and not m.patch_embed.dynamic_img_pad, "zoo embeds patches with one strided convolution"),
    ]
    for option, value, ok, why in checks:
        if not ok:
            raise unsupported(FROM, option, value, why)


def _check_block(blk: nn.Module, i: int) -> None:
    from timm.layers import Attention, Mlp
    from timm.models.vision_transformer import Block

    checks = [
        ("block_fn", type(blk).__name__, type(blk) is Block, "zoo's blocks are timm's Pre-Norm Block"),
        ("attn_layer", type(blk.attn).__name__, type(blk.attn) is Attention, "zoo's attention is timm's Attention"),
        ("mlp_layer", type(blk.mlp).__name__, type(blk.mlp) is Mlp, "zoo's two-layer FFN is timm's Mlp"),
        ("init_values", "set", isinstance(blk.ls1, nn.Identity) and isinstance(blk.ls2, nn.Identity), "zoo has no layer scale"),
        ("drop_path_rate", "> 0", isinstance(blk.drop_path1, nn.Identity) and isinstance(blk.drop_path2, nn.Identity),
         "zoo has no stochastic depth"),
    ]
    if type(blk.attn) is Attention:
        checks += [
            ("qk_norm", True, isinstance(blk.attn.q_norm, nn.Identity) and isinstance(blk.attn.k_norm, nn.Identity), "zoo has no qk-norm"),
            ("scale_attn_norm", True, isinstance(blk.attn.norm, nn.Identity), "zoo has no norm inside attention"),
            ("gated", True, getattr(blk.attn, "gate", None) is None, "zoo's attention has no output gate"),
        ]
    if type(blk.mlp) is Mlp:
        checks.append(("scale_mlp_norm", True, isinstance(blk.mlp.norm, nn.Identity), "zoo has no norm inside the MLP"))
    for option, value, ok, why in checks:
        if not ok:
            raise unsupported(FROM, f"blocks.{i}: {option}", value, why)


def _norm_eps(norms: list[nn.Module]) -> float:
    for n in norms:
        if not (type(n).__name__ == "LayerNorm" and isinstance(n, nn.LayerNorm) and n.elementwise_affine and n.bias is not None):
            raise unsupported(FROM, "norm_layer", type(n).__name__, "zoo's ViT uses LayerNorm with weight and bias")
    eps = {n.eps for n in norms}
    if len(eps) > 1:
        raise unsupported(FROM, "norm_layer eps", sorted(eps), "zoo's ViT uses one eps for every norm")
    return eps.pop()


def timm_spec(m: nn.Module) -> FamilySpec:
    """The zoo spec of a timm VisionTransformer (refusing what zoo cannot express)."""
    _check_model(m)
    for i, blk in enumerate(m.blocks):
        _check_block(blk, i)
    b0, pe = m.blocks[0], m.patch_embed
    (ih, iw), (ph, pw) = pe.img_size, pe.patch_size
    if ih != iw or ph != pw:
        raise unsupported(FROM, "img_size/patch_size", (pe.img_size, pe.patch_size), "zoo's ViT takes square images and patches")
    per_block = {(blk.attn.num_heads, blk.mlp.fc1.out_features, type(blk.mlp.act), blk.attn.attn_drop.p, blk.attn.proj_drop.p,
                  blk.mlp.drop1.p, blk.mlp.drop2.p, blk.attn.qkv.bias is not None, blk.attn.proj.bias is not None,
                  blk.mlp.fc1.bias is not None, blk.mlp.fc2.bias is not None) for blk in m.blocks}
    if len(per_block) > 1:
        raise unsupported(FROM, "blocks", "differ", "zoo's ViT repeats one block spec")
    _, hidden, _, attn_drop, proj_drop, drop1, drop2, qkv_bias, proj_bias, fc1_bias, fc2_bias = per_block.pop()
    if not qkv_bias == proj_bias == fc1_bias == fc2_bias:
        raise unsupported(FROM, "qkv_bias", qkv_bias, f"zoo's biases come on qkv and every projection together (proj_bias is {proj_bias})")
    if not proj_drop == drop1 == drop2:
        raise unsupported(FROM, "proj_drop_rate", (proj_drop, drop1, drop2), "zoo's residual and MLP dropout here must match")
    if b0.attn.head_dim * b0.attn.num_heads != m.embed_dim:
        raise unsupported(FROM, "attn_head_dim", b0.attn.head_dim, "zoo's ViT head size is embed_dim / num_heads")
    norms = [m.norm if not isinstance(m.norm, nn.Identity) else m.fc_norm] + [n for blk in m.blocks for n in (blk.norm1, blk.norm2)]
    return parse_spec({
        "family": "vit", "image_size": ih, "patch_size": ph, "in_channels": pe.proj.in_channels,
        "num_classes": m.head.out_features, "d_model": m.embed_dim, "n_layers": len(m.blocks),
        "class_token": m.cls_token is not None, "pool": "cls" if m.global_pool == "token" else "mean",
        "fc_norm": not isinstance(m.fc_norm, nn.Identity),
        "position": {"kind": "none" if m.pos_embed is None else "learned"},
        "block": {
            "attention": {"kind": "mha", "n_heads": b0.attn.num_heads, "bias": qkv_bias},
            "ffn": {**_activation(b0.mlp.act), "hidden": hidden, "bias": fc1_bias},
            "norm": {"kind": "layernorm", "placement": "pre", "eps": _norm_eps(norms)},
        },
        "dropout": {"embedding": m.pos_drop.p, "residual": proj_drop, "attention": attn_drop, "ffn": proj_drop},
        "init": {"scheme": "trunc_normal", "std": 0.02},
    }, source="from timm VisionTransformer")


def _rules(s: FamilySpec) -> list:
    rules = [rule("patch_embed.proj.weight", "patch_embed.proj.weight"), rule("patch_embed.proj.bias", "patch_embed.proj.bias")]
    if s.class_token:
        rules.append(rule("cls_token", "cls_token"))
    if s.position.kind == "learned":
        rules.append(rule("position.weight", "pos_embed"))  # [1, N, D] in timm, [N, D] in zoo
    bias = s.block.attention.bias
    names = [("attn_norm", "norm1", True), ("attn.qkv", "attn.qkv", bias), ("attn.out", "attn.proj", bias),
             ("ffn_norm", "norm2", True), ("ffn.fc1", "mlp.fc1", bias), ("ffn.fc2", "mlp.fc2", bias)]
    for i in range(s.n_layers):
        for z, t, has_bias in names:
            rules.append(rule(f"stack.blocks.{i}.{z}.weight", f"blocks.{i}.{t}.weight"))
            if has_bias:
                rules.append(rule(f"stack.blocks.{i}.{z}.bias", f"blocks.{i}.{t}.bias"))
    final = ("fc_norm", "fc_norm") if s.fc_norm else ("stack.norm", "norm")
    for p in ("weight", "bias"):
        rules += [rule(f"{final[0]}.{p}", f"{final[1]}.{p}"), rule(f"head.{p}", f"head.{p}")]
    return rules


def from_timm(timm_model: nn.Module) -> nn.Module:
    """A zoo ViT computing what ``timm_model`` computes: spec from its modules, tensors copied."""
    spec = timm_spec(timm_model)
    device, dtype = device_dtype(timm_model)
    model = build(spec, device=device, dtype=dtype)
    ref, rules = timm_model.state_dict(), _rules(spec)
    check_covered(ref, rules, FROM)
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    load_exact(model, zoo_state(ref, rules, shapes, FROM), FROM)
    return model.train(timm_model.training)


def _mlp_ratio(d: int, hidden: int) -> float:
    """The float ratio timm turns back into ``hidden`` (it sizes the MLP as ``int(d * mlp_ratio)``;
    ``hidden / d`` alone can land one ulp low, and truncation then loses a unit)."""
    ratio = hidden / d
    while int(d * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    while int(d * ratio) > hidden:
        ratio = math.nextafter(ratio, -math.inf)
    return ratio


def timm_kwargs(s: FamilySpec) -> dict:
    """VisionTransformer arguments for ``s``, refusing what timm's ViT cannot express."""
    att, ffn, norm, d, stem = s.block.attention, s.block.ffn, s.block.norm, s.d_model, getattr(s, "stem", None)
    problems = [
        ("family", s.family, s.family == "vit", "to_timm converts zoo ViTs"),
        ("stem", stem, stem is None, "timm's VisionTransformer embeds patches without a conv stem"),
        ("position.kind", s.position.kind, s.position.kind in ("learned", "none"), "timm's ViT has learned positions or none"),
        ("block.norm.kind", norm.kind, norm.kind == "layernorm" and getattr(norm, "bias", False), "timm's ViT uses LayerNorm with bias"),
        ("block.norm.placement", norm.placement, norm.placement == "pre", "timm's ViT is pre-norm"),
        ("block.attention.kind", att.kind, att.kind in ("mha", "gqa", "mqa"), "only zoo's built-in attention converts"),
        ("block.attention.n_kv_heads", att.kv_heads, att.kv_heads == att.n_heads, "timm's ViT has multi-head attention only"),
        ("block.attention.head_dim", (att.qk_size(d), att.v_size(d)),
         d % att.n_heads == 0 and att.qk_size(d) == att.v_size(d) == d // att.n_heads, "timm's ViT head size is d_model / n_heads"),
        ("block.ffn.kind", ffn.kind, ffn.kind in ("gelu", "relu", "silu"), "timm's ViT MLP is two-layer (gelu, relu or silu)"),
        ("block.ffn.bias", ffn.bias, ffn.bias == att.bias, "timm sets the qkv, projection and MLP biases together"),
        ("block.attention.out_bias", att.out_bias, att.has_out_bias == att.bias, "timm sets the qkv, projection and MLP biases together"),
        ("block.parallel", s.block.parallel, s.block.parallel is None, "timm's ViT block runs attention and MLP one after the other"),
        ("dropout.ffn", s.dropout.ffn, s.dropout.ffn == s.dropout.residual, "timm's proj_drop_rate covers the MLP and the residuals"),
    ]
    for option, value, ok, why in problems:
        if not ok:
            raise unsupported(TO, option, value, why)
    act = {"relu": "relu", "silu": "silu"}.get(ffn.kind) or ("gelu_tanh" if ffn.approximate == "tanh" else "gelu")
    return dict(
        img_size=s.image_size, patch_size=s.patch_size, in_chans=s.in_channels, num_classes=s.num_classes,
        global_pool="token" if s.pool == "cls" else "avg", embed_dim=d, depth=s.n_layers, num_heads=att.n_heads,
        mlp_ratio=_mlp_ratio(d, ffn.hidden_size(d)), qkv_bias=att.bias, proj_bias=att.bias, class_token=s.class_token,
        pos_embed="learn" if s.position.kind == "learned" else "none", fc_norm=s.fc_norm,
        norm_layer=functools.partial(nn.LayerNorm, eps=norm.eps), act_layer=act,
        pos_drop_rate=s.dropout.embedding, proj_drop_rate=s.dropout.residual, attn_drop_rate=s.dropout.attention,
    )


def to_timm(zoo_model: nn.Module) -> nn.Module:
    """The timm VisionTransformer computing what the zoo ViT ``zoo_model`` computes."""
    from timm.models.vision_transformer import VisionTransformer

    spec = zoo_model.spec
    device, dtype = device_dtype(zoo_model)
    timm_model = VisionTransformer(**timm_kwargs(spec), device=device, dtype=dtype)
    hidden = spec.block.ffn.hidden_size(spec.d_model)
    if timm_model.blocks[0].mlp.fc1.out_features != hidden:
        raise unsupported(TO, "block.ffn.hidden", hidden, f"timm sizes the MLP as int(d_model * mlp_ratio); no ratio gives {hidden}")
    shapes = {name: t.shape for name, t in timm_model.state_dict().items()}
    rules = _rules(spec)
    check_used(zoo_model.state_dict(), rules, TO)
    load_exact(timm_model, reference_state(zoo_model.state_dict(), rules, shapes, TO), TO)
    return timm_model.train(zoo_model.training)
