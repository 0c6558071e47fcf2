"""timm's VisionTransformer (:class:`ViT`), exact in both directions.

Covers ``vit_tiny/small/base_patch16_224``, DeiT III, register and MAP-pooled ViTs, CLIP towers
(``vit_base_patch16_clip_224``: a norm before the blocks, no patch bias, GELU or quick GELU), AIMv2
(``aimv2_*``: RmsNorm, a norm in the patch embedding, SwiGLU without biases), and every
VisionTransformer built from options zoo has: class-token, mean ('avg') or attention ('map')
pooling, fc_norm, a linear head or none (``num_classes=0``: a backbone), register tokens, positions on every token or on the patches only
(``no_embed_class``), learned or no positions, ``dynamic_img_size``, Pre-Norm LayerNorm blocks with
layer scale (``init_values``) and qk-norm, LayerNorm or RmsNorm (and ``embed_norm_layer``: a norm of
that kind in the patch embedding), a two-layer GELU / ReLU / SiLU MLP or timm's SwiGLU
(``mlp_layer``), biases on qkv and on the projections together. timm keeps few options as attributes, so the spec is read from the
modules themselves; any module zoo has no counterpart for is refused by name.
"""

from __future__ import annotations

import functools

from torch import nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.timm.base import Architecture
from zoo.interop.timm.parts import activation_of, embedding_rules, mlp_ratio, norm_of, norm_params, output_rules, refuse_unless
from zoo.spec import FamilySpec

__all__ = ["CLAIMS", "ViT"]

FROM, TO = "timm VisionTransformer -> zoo", "zoo -> timm VisionTransformer"
TIMM_POOLS = {"cls": "token", "mean": "avg", "map": "map"}  # zoo pool kind -> timm global_pool

# The spec fields timm's VisionTransformer expresses (zoo.interop.claims); any other is refused.
CLAIMS: Claims = {
    "family": one_of("vit"), "image_size": ANY, "patch_size": ANY, "in_channels": ANY, "d_model": ANY, "n_layers": ANY,
    "head.kind": one_of("linear", "none"), "head.num_classes": ANY, "class_token": ANY, "reg_tokens": ANY,
    "prefix_positions": ANY, "pool.kind": one_of("cls", "mean", "map"), "pool.n_heads": ANY, "pool.hidden": ANY,
    "pool.bias": one_of(True), "fc_norm": ANY, "pre_norm": ANY, "patch_bias": ANY, "patch_norm": ANY, "dynamic_size": ANY,
    "position.kind": one_of("learned", "none"),
    "block.kind": one_of("pre"), "block.attention.kind": one_of("mha", "gqa", "mqa"), "block.attention.n_heads": ANY,
    "block.attention.n_kv_heads": ANY, "block.attention.head_dim": ANY, "block.attention.v_head_dim": ANY,
    "block.attention.bias": ANY, "block.attention.out_bias": ANY, "block.attention.qk_norm": ANY,
    "block.ffn.kind": one_of("gelu", "relu", "silu", "quick_gelu", "swiglu"), "block.ffn.hidden": ANY, "block.ffn.bias": ANY,
    "block.ffn.approximate": ANY, "block.norm.kind": one_of("layernorm", "rmsnorm"), "block.norm.eps": ANY,
    "block.norm.bias": one_of(True), "block.layer_scale": ANY,
    "dropout.embedding": ANY, "dropout.residual": ANY, "dropout.attention": ANY, "dropout.ffn": ANY,
}


def _check_model(m: nn.Module) -> None:
    """Refuse, by name, every VisionTransformer option zoo has no counterpart for."""
    from timm.layers import AttentionPoolLatent, PatchEmbed

    pe = m.patch_embed
    checks = [
        ("global_pool", m.global_pool, (m.global_pool in ("token", "avg") and m.attn_pool is None)
         or (m.global_pool == "map" and type(m.attn_pool) is AttentionPoolLatent),
         "zoo pools the class token ('token'), the mean of the patch tokens ('avg') or by attention ('map')"),
        ("pool_include_prefix", m.pool_include_prefix, not m.pool_include_prefix, "zoo's pools skip the class and register tokens"),
        ("patch_drop_rate", getattr(m.patch_drop, "prob", 0.0), isinstance(m.patch_drop, nn.Identity), "zoo has no patch dropout"),
        ("final_norm", False, not (isinstance(m.norm, nn.Identity) and isinstance(m.fc_norm, nn.Identity)),
         "zoo's Pre-Norm ViT ends with a norm (before or after pooling)"),
        ("head", type(m.head).__name__, isinstance(m.head, (nn.Linear, nn.Identity)),
         "zoo's ViT ends in a linear classifier or none (num_classes=0)"),
        ("drop_rate", m.head_drop.p, m.head_drop.p == 0, "zoo has no dropout before the classifier"),
        ("embed_layer", type(pe).__name__, type(pe) is PatchEmbed
         and (pe.flatten or m.dynamic_img_size) and pe.strict_img_size != m.dynamic_img_size,
         "zoo embeds patches with one strided convolution (and a norm of the blocks' kind)"),
        ("dynamic_img_pad", getattr(pe, "dynamic_img_pad", False), not getattr(pe, "dynamic_img_pad", False),
         "zoo takes images whose sides are multiples of the patch size, unpadded"),
    ]
    for option, value, ok, why in checks:
        if not ok:
            raise unsupported(FROM, option, value, why)


def _layer_scale(blk: nn.Module, where: str = FROM) -> float | None:
    """The init value of a block's LayerScales (None without them)."""
    from timm.layers import LayerScale

    scales = (blk.ls1, blk.ls2)
    if all(isinstance(s, nn.Identity) for s in scales):
        return None
    if not all(type(s) is LayerScale for s in scales) or blk.ls1.init_values != blk.ls2.init_values:
        raise unsupported(where, "init_values", "differ", "zoo's layer scale is on both sub-layers, with one init value")
    return float(blk.ls1.init_values)


def _qk_norm(attn: nn.Module, where: str = FROM) -> dict | None:
    """A timm Attention's qk-norm as a zoo QKNormSpec mapping (None without one)."""
    norms = (attn.q_norm, attn.k_norm)
    if all(isinstance(n, nn.Identity) for n in norms):
        return None
    if not all(isinstance(n, nn.LayerNorm) and n.elementwise_affine and n.bias is not None
               and tuple(n.normalized_shape) == (attn.head_dim,) for n in norms) or attn.q_norm.eps != attn.k_norm.eps:
        raise unsupported(where, "qk_norm", type(attn.q_norm).__name__, "zoo's timm qk-norm is one LayerNorm (with bias) per head size")
    return {"kind": "layernorm", "scope": "head", "eps": attn.q_norm.eps}


def _check_block(blk: nn.Module, i: int, where: str = FROM) -> None:
    from timm.layers import Attention, Mlp, SwiGLU
    from timm.models.vision_transformer import Block

    checks = [
        ("block_fn", type(blk).__name__, type(blk) is Block, "zoo's blocks are timm's Pre-Norm Block"),
        ("attn_layer", type(blk.attn).__name__, type(blk.attn) is Attention, "zoo's attention is timm's Attention"),
        ("mlp_layer", type(blk.mlp).__name__, type(blk.mlp) in (Mlp, SwiGLU), "zoo's FFNs here are timm's Mlp and SwiGLU"),
        ("drop_path_rate", "> 0", isinstance(blk.drop_path1, nn.Identity) and isinstance(blk.drop_path2, nn.Identity),
         "zoo has no stochastic depth"),
    ]
    if type(blk.attn) is Attention:
        checks += [
            ("scale_attn_norm", True, isinstance(blk.attn.norm, nn.Identity), "zoo has no norm inside attention"),
            ("gated", True, getattr(blk.attn, "gate", None) is None, "zoo's attention has no output gate"),
        ]
    if type(blk.mlp) in (Mlp, SwiGLU):
        checks.append(("scale_mlp_norm", True, isinstance(blk.mlp.norm, nn.Identity), "zoo has no norm inside the MLP"))
    if type(blk.mlp) is SwiGLU:
        checks.append(("act_layer", type(blk.mlp.act).__name__, type(blk.mlp.act) is nn.SiLU, "zoo's SwiGLU gates with SiLU"))
    for option, value, ok, why in checks:
        if not ok:
            raise unsupported(where, f"blocks.{i}: {option}", value, why)


def _map_pool(m: nn.Module, heads: int, hidden: int, act: type, where: str = FROM) -> dict:
    """timm's AttentionPoolLatent as a zoo MapPoolSpec mapping (the checks name what zoo lacks)."""
    from timm.layers import Mlp

    p = m.attn_pool
    linears = (p.q, p.kv, p.proj, getattr(p.mlp, "fc1", None), getattr(p.mlp, "fc2", None))
    checks = [
        ("attn_pool.latent_len", p.latent_len, p.latent_len == 1, "zoo's attention pooling has one latent query"),
        ("attn_pool.pool_type", p.pool, p.pool == "token", "zoo's attention pooling returns its one latent"),
        ("attn_pool.pos_embed", "abs", p.pos_embed is None, "zoo's attention pooling adds no positions"),
        ("attn_pool.q_proj", False, isinstance(p.q, nn.Linear), "zoo's attention pooling projects the latent query"),
        ("attn_pool.qk_norm", True, isinstance(p.q_norm, nn.Identity) and isinstance(p.k_norm, nn.Identity),
         "zoo's attention pooling has no qk-norm"),
        ("attn_pool.embed_dim", p.num_heads * p.head_dim, p.num_heads * p.head_dim == m.embed_dim == p.latent_dim,
         "zoo's attention pooling is as wide as the model"),
        ("attn_pool.out_features", p.out_features, isinstance(p.proj, nn.Linear) and p.out_features == m.embed_dim,
         "zoo's attention pooling ends in its norm + MLP, as wide as the model"),
        ("attn_pool.mlp", type(p.mlp).__name__, type(p.mlp) is Mlp and isinstance(p.mlp.norm, nn.Identity) and type(p.mlp.act) is act,
         "zoo's attention pooling MLP is timm's Mlp with the blocks' activation"),
        ("attn_pool.drop", p.proj_drop.p, p.proj_drop.p == 0 and p.mlp.drop1.p == 0 and p.mlp.drop2.p == 0,
         "zoo's attention pooling has no dropout"),
        ("attn_pool.qkv_bias", p.q.bias is not None, len({lin.bias is not None for lin in linears}) == 1,
         "zoo's attention pooling has biases on all its linears or on none"),
    ]
    refuse_unless(checks, where)
    fc1 = p.mlp.fc1.out_features
    return {"kind": "map", "n_heads": None if p.num_heads == heads else p.num_heads,
            "hidden": None if fc1 == hidden else fc1, "bias": p.q.bias is not None}


def body_spec(m: nn.Module, patch_norm: nn.Module, where: str = FROM) -> dict:
    """The spec fields (a mapping) of what a timm model built of timm's ``Block`` s has after its
    embeddings (VisionTransformer, NaFlexVit): ``block``, ``pool``, and ``dropout`` but its
    ``embedding``; its norms (final, pre, the patch embedding's ``patch_norm``, the blocks') of one
    kind and eps."""
    for i, blk in enumerate(m.blocks):
        _check_block(blk, i, where)
    b0 = m.blocks[0]
    per_block = {(blk.attn.num_heads, blk.mlp.fc2.in_features, type(blk.mlp.act), blk.attn.attn_drop.p, blk.attn.proj_drop.p,
                  blk.mlp.drop1.p, blk.mlp.drop2.p, blk.attn.qkv.bias is not None, blk.attn.proj.bias is not None,
                  _fc1(blk.mlp).bias is not None, blk.mlp.fc2.bias is not None, _layer_scale(blk, where),
                  repr(_qk_norm(blk.attn, where)), type(blk.mlp).__name__) for blk in m.blocks}
    if len(per_block) > 1:
        raise unsupported(where, "blocks", "differ", "zoo's ViT repeats one block spec")
    heads, hidden, act, attn_drop, proj_drop, drop1, drop2, qkv_bias, proj_bias, fc1_bias, fc2_bias, scale, _, mlp = per_block.pop()
    if not qkv_bias == proj_bias == fc1_bias == fc2_bias:
        raise unsupported(where, "qkv_bias", qkv_bias, f"zoo's biases come on qkv and every projection together (proj_bias is {proj_bias})")
    if not proj_drop == drop1 == drop2:
        raise unsupported(where, "proj_drop_rate", (proj_drop, drop1, drop2), "zoo's residual and MLP dropout here must match")
    if b0.attn.head_dim * b0.attn.num_heads != m.embed_dim:
        raise unsupported(where, "attn_head_dim", b0.attn.head_dim, "zoo's ViT head size is embed_dim / num_heads")
    norms = [m.norm if not isinstance(m.norm, nn.Identity) else m.fc_norm]
    norms += [n for n in (m.norm_pre, patch_norm) if not isinstance(n, nn.Identity)]
    norms += [n for blk in m.blocks for n in (blk.norm1, blk.norm2)]
    pool = {"token": {"kind": "cls"}, "avg": {"kind": "mean"}}.get(m.global_pool)
    if m.global_pool == "map":
        if mlp == "SwiGLU" or not isinstance(m.attn_pool.norm, nn.LayerNorm):
            raise unsupported(where, "global_pool", "map", "zoo's attention pooling with SwiGLU or RmsNorm blocks is not timm's")
        pool = _map_pool(m, heads, hidden, act, where)
        norms.append(m.attn_pool.norm)
    return {
        "pool": pool,
        "block": {
            "attention": {"kind": "mha", "n_heads": heads, "bias": qkv_bias, "qk_norm": _qk_norm(b0.attn, where)},
            "ffn": {**({"kind": "swiglu"} if mlp == "SwiGLU" else activation_of(b0.mlp.act, where)), "hidden": hidden,
                    "bias": fc1_bias},
            "norm": norm_of(norms, where),
            "kind": "pre",
            "layer_scale": scale,
        },
        "dropout": {"residual": proj_drop, "attention": attn_drop, "ffn": proj_drop},
    }


def _spec(m: nn.Module) -> dict:
    """The zoo spec (a mapping) of a timm VisionTransformer (refusing what zoo cannot express)."""
    _check_model(m)
    pe = m.patch_embed
    (ih, iw), (ph, pw) = pe.img_size, pe.patch_size
    if ih != iw or ph != pw:
        raise unsupported(FROM, "img_size/patch_size", (pe.img_size, pe.patch_size), "zoo's ViT takes square images and patches")
    body = body_spec(m, pe.norm)
    return {
        "family": "vit", "image_size": ih, "patch_size": ph, "in_channels": pe.proj.in_channels,
        "head": {"kind": "linear", "num_classes": m.head.out_features} if isinstance(m.head, nn.Linear) else {"kind": "none"},
        "d_model": m.embed_dim, "n_layers": len(m.blocks),
        "class_token": m.cls_token is not None, "reg_tokens": m.num_reg_tokens,
        "prefix_positions": not m.no_embed_class or m.pos_embed is None,  # without positions the flag means nothing
        "pool": body["pool"], "fc_norm": not isinstance(m.fc_norm, nn.Identity), "dynamic_size": m.dynamic_img_size,
        "pre_norm": not isinstance(m.norm_pre, nn.Identity), "patch_bias": pe.proj.bias is not None,
        "patch_norm": not isinstance(pe.norm, nn.Identity),
        "position": {"kind": "none" if m.pos_embed is None else "learned"},
        "block": body["block"],
        "dropout": {"embedding": m.pos_drop.p, **body["dropout"]},
        "init": {"scheme": "trunc_normal", "std": 0.02},
    }


def _fc1(mlp: nn.Module) -> nn.Module:
    """An MLP's first linear (timm's SwiGLU: the gate's, ``fc1_g``; its ``fc1_x`` has the same bias)."""
    return getattr(mlp, "fc1", None) or mlp.fc1_g


def _rules(s: FamilySpec, m: nn.Module | None = None) -> list[Rule]:
    return embedding_rules(s) + body_rules(s) + output_rules(s)


def body_rules(s: FamilySpec) -> list[Rule]:
    """zoo <-> timm names of the blocks (timm's ``Block``) and of the attention pooling, alike in
    VisionTransformer and NaFlexVit."""
    rules = []
    bias, norm_bias = s.block.attention.bias, len(norm_params(s)) > 1
    glu = s.block.ffn.kind == "swiglu"  # timm's SwiGLU: fc1_g (the gate) and fc1_x; zoo's fc1 is [gate | up]
    names = [("attn_norm", "norm1", norm_bias), ("attn.qkv", "attn.qkv", bias), ("attn.out", "attn.proj", bias),
             ("ffn_norm", "norm2", norm_bias), ("ffn.fc2", "mlp.fc2", bias)] + ([] if glu else [("ffn.fc1", "mlp.fc1", bias)])
    if s.block.attention.qk_norm is not None:
        names += [("attn.q_norm", "attn.q_norm", True), ("attn.k_norm", "attn.k_norm", True)]
    for i in range(s.n_layers):
        for z, t, has_bias in names:
            rules.append(rule(f"stack.blocks.{i}.{z}.weight", f"blocks.{i}.{t}.weight"))
            if has_bias:
                rules.append(rule(f"stack.blocks.{i}.{z}.bias", f"blocks.{i}.{t}.bias"))
        if glu:
            rules += [rule(f"stack.blocks.{i}.ffn.fc1.{p}", f"blocks.{i}.mlp.fc1_g.{p}", f"blocks.{i}.mlp.fc1_x.{p}")
                      for p in ("weight", "bias")[: 1 + bias]]
        if s.block.layer_scale is not None:
            rules += [rule(f"stack.blocks.{i}.ls_attn.gamma", f"blocks.{i}.ls1.gamma"),
                      rule(f"stack.blocks.{i}.ls_ffn.gamma", f"blocks.{i}.ls2.gamma")]
    if s.pool.kind == "map":
        rules.append(rule("pool.latent", "attn_pool.latent"))
        pool = [("attn.q", "q", s.pool.bias), ("attn.kv", "kv", s.pool.bias), ("attn.out", "proj", s.pool.bias),
                ("norm", "norm", True), ("ffn.fc1", "mlp.fc1", s.pool.bias), ("ffn.fc2", "mlp.fc2", s.pool.bias)]
        for z, t, has_bias in pool:
            rules += [rule(f"pool.{z}.{p}", f"attn_pool.{t}.{p}") for p in ("weight", "bias")[: 1 + has_bias]]
    return rules


def _kwargs(s: FamilySpec) -> dict:
    """VisionTransformer arguments for ``s`` (its claims checked), refusing what they let through
    and timm's ViT still cannot express."""
    from timm.layers import RmsNorm, SwiGLU

    att, ffn, norm, d = s.block.attention, s.block.ffn, s.block.norm, s.d_model
    qk, pool = att.qk_norm, s.pool
    problems = block_problems(s)
    if pool.kind == "map":
        problems += [
            ("pool.n_heads", pool.n_heads, pool.n_heads in (None, att.n_heads), "timm's attention pooling has the blocks' heads"),
            ("pool.hidden", pool.hidden, pool.hidden in (None, ffn.hidden_size(d)), "timm's attention pooling MLP is the blocks' size"),
        ]
    refuse_unless(problems, TO)
    act = {"relu": "relu", "silu": "silu", "quick_gelu": "quick_gelu", "swiglu": "silu"}.get(ffn.kind) or (
        "gelu_tanh" if ffn.approximate == "tanh" else "gelu")
    norm_layer = functools.partial(RmsNorm if norm.kind == "rmsnorm" else nn.LayerNorm, eps=norm.eps)
    return dict(
        img_size=s.image_size, patch_size=s.patch_size, in_chans=s.in_channels, num_classes=s.num_classes or 0,
        global_pool=TIMM_POOLS[pool.kind], embed_dim=d, depth=s.n_layers, num_heads=att.n_heads,
        mlp_ratio=mlp_ratio(d, ffn.hidden_size(d)), qkv_bias=att.bias, proj_bias=att.bias, class_token=s.class_token,
        pos_embed="learn" if s.position.kind == "learned" else "none", fc_norm=s.fc_norm,
        norm_layer=norm_layer, act_layer=act,
        pos_drop_rate=s.dropout.embedding, proj_drop_rate=s.dropout.residual, attn_drop_rate=s.dropout.attention,
        reg_tokens=s.reg_tokens, no_embed_class=not s.prefix_positions, dynamic_img_size=s.dynamic_size,
        init_values=s.block.layer_scale, qk_norm=qk is not None, pre_norm=s.pre_norm,
        **({"embed_norm_layer": norm_layer} if s.patch_norm else {}), **({"mlp_layer": SwiGLU} if ffn.kind == "swiglu" else {}),
    )


def block_problems(s: FamilySpec) -> list[tuple]:
    """The ``(field, value, ok, why)`` checks of what timm's ``Block`` s, their MLP and the patch
    bias (none with ``pre_norm``) cannot express (VisionTransformer, NaFlexVit), for ``refuse_unless``."""
    att, ffn, norm, d = s.block.attention, s.block.ffn, s.block.norm, s.d_model
    qk, pool = att.qk_norm, s.pool
    return [
        ("block.attention.n_kv_heads", att.n_kv_heads, att.n_kv_heads == att.n_heads, "timm's ViT has multi-head attention only"),
        ("block.attention.head_dim", (att.qk_size(d), att.v_size(d)),
         d % att.n_heads == 0 and att.qk_size(d) == att.v_size(d) == d // att.n_heads, "timm's ViT head size is d_model / n_heads"),
        ("block.ffn.bias", ffn.bias, ffn.bias == att.bias, "timm sets the qkv, projection and MLP biases together"),
        ("block.attention.out_bias", att.out_bias, att.has_out_bias == att.bias, "timm sets the qkv, projection and MLP biases together"),
        ("dropout.ffn", s.dropout.ffn, s.dropout.ffn == s.dropout.residual, "timm's proj_drop_rate covers the MLP and the residuals"),
        ("block.attention.qk_norm", qk, qk is None or (qk.kind == "layernorm" and norm.kind == "layernorm" and qk.scope == "head"
                                                       and qk.eps == norm.eps),
         f"timm's qk-norm is a LayerNorm over each head with the blocks' eps ({norm.eps}), beside LayerNorm blocks"),
        ("block.norm.unit_offset", getattr(norm, "unit_offset", False), not getattr(norm, "unit_offset", False),
         "timm's norms scale by their weight"),
        ("pool.kind", pool.kind, pool.kind != "map" or (ffn.kind != "swiglu" and norm.kind == "layernorm"),
         "timm's attention pooling has a two-layer Mlp and a LayerNorm (the blocks here have SwiGLU or RMSNorm: "
         f"block.ffn.kind={ffn.kind!r}, block.norm.kind={norm.kind!r})"),
        ("patch_bias", s.patch_bias, s.patch_bias != s.pre_norm, f"timm's ViT has a patch bias without pre_norm and none with it "
         f"(pre_norm is {s.pre_norm})"),
    ]


class ViT(Architecture):
    """timm's VisionTransformer."""

    name = "VisionTransformer"
    module = "timm.models.vision_transformer"
    base_model = "vit_base_patch16_224"
    claims = CLAIMS
    spec = staticmethod(_spec)
    rules = staticmethod(_rules)
    kwargs = staticmethod(_kwargs)
