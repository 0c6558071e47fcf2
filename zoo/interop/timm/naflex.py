"""timm's NaFlexVit (:class:`NaFlex`), exact in both directions.

Covers ``naflexvit_base_patch16_gap`` / ``_map`` and every NaFlexVit built from options zoo has: a
linear patch embedding over flattened patches (``embed_proj_type='linear'``, rows of (row, column,
channel) or, with ``patchify_channels_last=False``, (channel, row, column): zoo's strided convolution
holds the same weights, permuted) or a convolution (``'conv'``), a learned position grid
(``pos_embed_grid_size``: zoo's ``image_size / patch_size``) on the patches only, resampled bicubically
(antialiased, corners not aligned: timm's defaults) to each image's grid, or no positions; class and
register tokens, a norm before the blocks (without a patch bias) and after the projection
(``embed_norm_layer``), timm's Pre-Norm ``Block`` s as in :mod:`zoo.interop.timm.vit` (layer scale,
qk-norm, LayerNorm or RmsNorm, Mlp or SwiGLU), class-token, mean ('avg') or attention ('map') pooling,
the final norm before or after pooling (``fc_norm``), a linear head or none. NaFlexVit takes images of
any size (multiples of the patch), so its zoo spec has ``dynamic_size: true``; zoo writes the linear
embedding over (row, column, channel) patches (timm's default). Its patch lists (the NaFlex batch of
patches, their grid coordinates and a validity mask) are zoo's :meth:`VisionTransformer.patch_forward`.
Factorized positions, RoPE and EVA blocks, patch dropout, the other resampling options and what else
zoo has no counterpart for are refused by name.
"""

from __future__ import annotations

import functools

from torch import nn

from zoo.interop.claims import Claims, one_of
from zoo.interop.common import Rule, rule
from zoo.interop.timm.base import Architecture
from zoo.interop.timm.parts import mlp_ratio, norm_params, output_rules, refuse_unless
from zoo.interop.timm.vit import CLAIMS as VIT_CLAIMS
from zoo.interop.timm.vit import TIMM_POOLS, block_problems, body_rules, body_spec
from zoo.spec import FamilySpec

__all__ = ["NaFlex"]

FROM, TO = "timm NaFlexVit -> zoo", "zoo -> timm NaFlexVit"
# The spec fields timm's NaFlexVit expresses (zoo.interop.claims): VisionTransformer's, always at any image size.
CLAIMS: Claims = {**VIT_CLAIMS, "dynamic_size": one_of(True)}


def _check_model(m: nn.Module) -> None:
    """Refuse, by name, every NaFlexVit option zoo has no counterpart for."""
    from timm.layers import AttentionPoolLatent
    from timm.models.naflexvit import NaFlexEmbeds

    e = m.embeds
    refuse_unless([("embeds", type(e).__name__, type(e) is NaFlexEmbeds, "zoo reads timm's NaFlexEmbeds")], FROM)
    learned = e.pos_embed_type == "learned"
    grid, patch = e.pos_embed_grid_size, e.patch_size
    refuse_unless([
        ("pos_embed", e.pos_embed_type, e.pos_embed_type in ("learned", "none"),
         "zoo's NaFlex positions are one learned grid ('learned') or none"),
        ("pos_embed_interp_mode", e.pos_embed_interp_mode, not learned or e.pos_embed_interp_mode == "bicubic",
         "zoo resamples learned positions bicubically"),
        ("pos_embed_antialias", e.pos_embed_antialias, not learned or e.pos_embed_antialias, "zoo resamples antialiased"),
        ("pos_embed_align_corners", e.pos_embed_align_corners, not learned or not e.pos_embed_align_corners,
         "zoo resamples with corners not aligned"),
        ("pos_embed_ar_preserving", e.pos_embed_ar_preserving, not learned or not e.pos_embed_ar_preserving,
         "zoo resamples the grid to each image's own rows and columns"),
        ("pos_embed_use_grid_sample", e.pos_embed_use_grid_sample, not learned or not e.pos_embed_use_grid_sample,
         "zoo resamples with interpolate, not grid_sample"),
        ("pos_embed_grid_size", grid, grid is not None and grid[0] == grid[1], "zoo's ViT is trained on a square grid"),
        ("patch_size", patch, patch[0] == patch[1], "zoo's ViT takes square patches"),
        ("input_norm_layer", type(e.norm_input).__name__, e.norm_input is None, "zoo has no norm on the flattened pixels"),
        ("enable_patch_interpolator", True, e.patch_interpolator is None, "zoo's patch embedding has one patch size"),
        ("dynamic_img_pad", e.dynamic_img_pad, not e.dynamic_img_pad, "zoo takes images whose sides are multiples of the patch size"),
        ("rope_type", type(m.rope).__name__, m.rope is None, "zoo reads timm's NaFlexVit without RoPE (timm's Eva has it)"),
        ("patch_drop_rate", "> 0", m.patch_drop is None, "zoo has no patch dropout"),
        ("global_pool", m.global_pool, (m.global_pool in ("token", "avg") and m.attn_pool is None)
         or (m.global_pool == "map" and type(m.attn_pool) is AttentionPoolLatent),
         "zoo pools the class token ('token'), the mean of the patch tokens ('avg') or by attention ('map')"),
        ("pool_include_prefix", m.pool_include_prefix, not m.pool_include_prefix, "zoo's pools skip the class and register tokens"),
        ("final_norm", False, not (isinstance(m.norm, nn.Identity) and isinstance(m.fc_norm, nn.Identity)),
         "zoo's Pre-Norm ViT ends with a norm (before or after pooling)"),
        ("head", type(m.head).__name__, isinstance(m.head, (nn.Linear, nn.Identity)),
         "zoo's ViT ends in a linear classifier or none (num_classes=0)"),
        ("drop_rate", m.head_drop.p, m.head_drop.p == 0, "zoo has no dropout before the classifier"),
    ], FROM)


def _spec(m: nn.Module) -> dict:
    """The zoo spec (a mapping) of a timm NaFlexVit (refusing what zoo cannot express)."""
    _check_model(m)
    e = m.embeds
    body = body_spec(m, e.norm, FROM)
    return {
        "family": "vit", "image_size": e.pos_embed_grid_size[0] * e.patch_size[0], "patch_size": e.patch_size[0],
        "in_channels": e.in_chans,
        "head": {"kind": "linear", "num_classes": m.head.out_features} if isinstance(m.head, nn.Linear) else {"kind": "none"},
        "d_model": m.embed_dim, "n_layers": len(m.blocks),
        "class_token": e.cls_token is not None, "reg_tokens": e.num_reg_tokens,
        "prefix_positions": e.pos_embed is None,  # positions on the patches only (without positions the flag means nothing)
        "pool": body["pool"], "fc_norm": not isinstance(m.fc_norm, nn.Identity), "dynamic_size": True,
        "pre_norm": not isinstance(m.norm_pre, nn.Identity), "patch_bias": e.proj.bias is not None,
        "patch_norm": not isinstance(e.norm, nn.Identity),
        "position": {"kind": "none" if e.pos_embed is None else "learned"},
        "block": body["block"],
        "dropout": {"embedding": e.pos_drop.p, **body["dropout"]},
        "init": {"scheme": "trunc_normal", "std": 0.02},
    }


def _rules(s: FamilySpec, m: nn.Module) -> list[Rule]:
    """zoo <-> NaFlexVit names, in the layout of ``m``'s patch embedding: a linear one over
    (row, column, channel) patches holds zoo's convolution [D, C, p, p] as [D, p, p, C]."""
    e = m.embeds
    permute = (0, 2, 3, 1) if e.is_linear and e.channels_last else None
    rules = [rule("patch_embed.proj.weight", "embeds.proj.weight", permute=permute)]
    rules += [rule(zoo, f"embeds.{ref}") for zoo, ref, on in (("patch_embed.proj.bias", "proj.bias", s.patch_bias),
                                                              ("cls_token", "cls_token", s.class_token),
                                                              ("reg_token", "reg_token", s.reg_tokens)) if on]
    rules += [rule(f"norm_pre.{p}", f"norm_pre.{p}") for p in norm_params(s) if s.pre_norm]
    rules += [rule(f"patch_embed.norm.{p}", f"embeds.norm.{p}") for p in norm_params(s) if s.patch_norm]
    if s.position.kind == "learned":
        rules.append(rule("position.weight", "embeds.pos_embed"))  # [1, h, w, D] in timm, [h * w, D] in zoo
    return rules + body_rules(s) + output_rules(s)


def _kwargs(s: FamilySpec) -> dict:
    """NaFlexVit arguments for ``s`` (its claims checked), refusing what they let through and timm's
    NaFlexVit still cannot express."""
    from timm.layers import RmsNorm, SwiGLU

    att, ffn, norm, d, pool = s.block.attention, s.block.ffn, s.block.norm, s.d_model, s.pool
    refuse_unless(block_problems(s) + [
        ("prefix_positions", s.prefix_positions, not s.prefix_positions or s.position.kind != "learned" or not s.n_prefix,
         "timm's NaFlexVit adds positions to the patches only (prefix_positions: false)"),
    ], TO)
    act = {"relu": "relu", "silu": "silu", "quick_gelu": "quick_gelu", "swiglu": "silu"}.get(ffn.kind) or (
        "gelu_tanh" if ffn.approximate == "tanh" else "gelu")
    norm_layer = functools.partial(RmsNorm if norm.kind == "rmsnorm" else nn.LayerNorm, eps=norm.eps)
    grid = s.image_size // s.patch_size
    kw = dict(
        in_chans=s.in_channels, num_classes=s.num_classes or 0, patch_size=s.patch_size, embed_dim=d, depth=s.n_layers,
        num_heads=att.n_heads, mlp_ratio=mlp_ratio(d, ffn.hidden_size(d)), qkv_bias=att.bias, proj_bias=att.bias,
        qk_norm=att.qk_norm is not None, init_values=s.block.layer_scale, class_token=s.class_token, reg_tokens=s.reg_tokens,
        pos_embed="learned" if s.position.kind == "learned" else "none", pos_embed_grid_size=(grid, grid),
        pos_embed_interp_mode="bicubic", pos_embed_antialias=True, pos_embed_align_corners=False,
        pos_embed_ar_preserving=False, pos_embed_use_grid_sample=False,
        pre_norm=s.pre_norm, final_norm=True, fc_norm=s.fc_norm, global_pool=TIMM_POOLS[pool.kind],
        norm_layer=norm_layer, act_layer=act, embed_proj_type="linear", patchify_channels_last=True,
        pos_drop_rate=s.dropout.embedding, proj_drop_rate=s.dropout.residual, attn_drop_rate=s.dropout.attention,
    )
    if pool.kind == "map":
        kw |= {"attn_pool_num_heads": pool.n_heads, "attn_pool_mlp_ratio": None if pool.hidden is None else mlp_ratio(d, pool.hidden)}
    if s.patch_norm:
        kw["embed_norm_layer"] = "layernorm" if norm.kind == "layernorm" and norm.eps == 1e-6 else norm_layer
    if ffn.kind == "swiglu":
        kw["mlp_layer"] = SwiGLU
    return kw


class NaFlex(Architecture):
    """timm's NaFlexVit."""

    name = "NaFlexVit"
    module = "timm.models.naflexvit"
    base_model = "naflexvit_base_patch16_siglip"  # no layer scale: timm.create_model drops a None init_values
    first_conv = "embeds.proj"
    claims = CLAIMS
    spec = staticmethod(_spec)
    rules = staticmethod(_rules)
    kwargs = staticmethod(_kwargs)
