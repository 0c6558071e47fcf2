"""timm's Beit (:class:`Beit`), exact in both directions.

Covers ``beit_base_patch16_224`` and BEiT v2 (``beitv2_*``): a class token, a 2-D relative position
bias of each layer's own (``use_rel_pos_bias``: zoo's ``relative_bias2d``), learned positions
(``use_abs_pos_emb``) or none, layer scale (``init_values``), q and v biases without a k bias,
patch-mean pooling with ``fc_norm`` or the class token with the final norm, an exact-GELU MLP or SwiGLU
(with ``scale_mlp``'s norm). The bias shared by every layer (``use_shared_rel_pos_bias``) and what
else zoo has no counterpart for is refused by name.
"""

from __future__ import annotations

import functools

from torch import nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.timm.base import Architecture
from zoo.interop.timm.parts import activation_of, embedding_rules, layernorm_eps, mlp_ratio, output_rules, refuse_unless
from zoo.spec import FamilySpec

__all__ = ["Beit"]

FROM, TO = "timm Beit -> zoo", "zoo -> timm Beit"
_POOLS = {"cls": "token", "mean": "avg"}  # zoo pool kind -> timm global_pool

# The spec fields timm's Beit expresses (zoo.interop.claims); any other is refused.
CLAIMS: Claims = {
    "family": one_of("vit"), "image_size": ANY, "patch_size": ANY, "in_channels": ANY, "d_model": ANY, "n_layers": ANY,
    "head.kind": one_of("linear", "none"), "head.num_classes": ANY, "pool.kind": one_of("cls", "mean"), "fc_norm": ANY,
    "position.kind": one_of("learned", "none", "relative_bias2d"), "layers": ANY, "block.kind": one_of("pre"),
    "block.attention.kind": one_of("mha", "gqa", "mqa"), "block.attention.n_heads": ANY, "block.attention.n_kv_heads": ANY,
    "block.attention.head_dim": ANY, "block.attention.v_head_dim": ANY, "block.attention.bias": ANY,
    "block.attention.out_bias": ANY, "block.attention.key_bias": ANY,
    "block.ffn.kind": one_of("gelu", "swiglu"), "block.ffn.hidden": ANY,
    "block.ffn.bias": one_of(True), "block.ffn.norm": ANY, "block.ffn.approximate": one_of("none"),
    "block.norm.kind": one_of("layernorm"), "block.norm.eps": ANY, "block.norm.bias": one_of(True),
    "block.layer_scale": ANY, "dropout.embedding": ANY, "dropout.residual": ANY, "dropout.attention": ANY,
    "dropout.ffn": ANY,
}


def _check_model(m: nn.Module) -> None:
    from timm.layers import PatchEmbed

    pe = m.patch_embed
    refuse_unless([
        ("global_pool", m.global_pool, m.global_pool in ("token", "avg"),
         "zoo reads timm's Beit pooled by the class token ('token') or the patch mean ('avg')"),
        ("use_shared_rel_pos_bias", True, m.rel_pos_bias is None,
         "zoo's relative_bias2d is a table of each layer's own; one shared by every layer has no counterpart"),
        ("head", type(m.head).__name__, isinstance(m.head, (nn.Linear, nn.Identity)), "zoo's ViT ends in a linear classifier or none"),
        ("drop_rate", m.head_drop.p, m.head_drop.p == 0, "zoo has no dropout before the classifier"),
        ("embed_layer", type(pe).__name__, type(pe) is PatchEmbed and isinstance(pe.norm, nn.Identity) and pe.proj.bias is not None,
         "zoo embeds patches with one strided convolution with a bias"),
        ("img_size/patch_size", (pe.img_size, pe.patch_size), pe.img_size[0] == pe.img_size[1] and pe.patch_size[0] == pe.patch_size[1],
         "zoo's ViT takes square images and patches"),
    ], FROM)


def _block(blk: nn.Module, i: int) -> tuple:
    """A block's options as one comparable tuple, and its FFN, refusing what zoo lacks."""
    from timm.layers import Mlp, SwiGLU
    from timm.models.beit import Attention, Block

    a, mlp = blk.attn, blk.mlp
    where = f"{FROM}: blocks.{i}"
    refuse_unless([
        ("block_fn", type(blk).__name__, type(blk) is Block, "zoo's blocks are timm's Beit Block"),
        ("attn", type(a).__name__, type(a) is Attention, "zoo's attention is timm's Beit Attention"),
        ("mlp", type(mlp).__name__, type(mlp) in (Mlp, SwiGLU), "zoo's FFNs are timm's Mlp and SwiGLU"),
        ("drop_path_rate", "> 0", isinstance(blk.drop_path1, nn.Identity) and isinstance(blk.drop_path2, nn.Identity),
         "zoo has no stochastic depth"),
        ("mlp bias", False, all(getattr(mlp, n).bias is not None for n in ("fc1_g", "fc1_x", "fc1", "fc2") if hasattr(mlp, n)),
         "zoo's Beit MLP has biases"),
        ("attn_head_dim", a.qkv.out_features // 3, a.qkv.out_features == 3 * a.proj.out_features,
         "zoo's ViT head size is embed_dim / num_heads"),
    ], where)
    if type(mlp) is SwiGLU:
        refuse_unless([("SwiGLU act_layer", type(mlp.act).__name__, type(mlp.act) is nn.SiLU, "zoo's SwiGLU gates with SiLU")], where)
        ffn = {"kind": "swiglu", "hidden": mlp.fc2.in_features}
    else:
        ffn = {**activation_of(mlp.act, FROM), "hidden": mlp.fc1.out_features}
    ffn.update(bias=True, norm=not isinstance(mlp.norm, nn.Identity))
    drops = (a.proj_drop.p, mlp.drop1.p, mlp.drop2.p)
    if len(set(drops)) > 1:
        raise unsupported(where, "proj_drop_rate", drops, "zoo's residual and MLP dropout here must match")
    scale = None if blk.gamma_1 is None else float(blk.init_values)
    key = (a.num_heads, a.q_bias is not None, a.relative_position_bias_table is not None, repr(ffn), a.attn_drop.p, drops[0], scale)
    return key, ffn


def _spec(m: nn.Module) -> dict:
    """The zoo spec (a mapping) of a timm Beit (refusing what zoo cannot express)."""
    _check_model(m)
    blocks = [_block(blk, i) for i, blk in enumerate(m.blocks)]
    if len({key for key, _ in blocks}) > 1:
        raise unsupported(FROM, "blocks", "differ", "zoo's ViT repeats one block spec")
    (heads, qkv_bias, rel_bias, _, attn_drop, proj_drop, scale), ffn = blocks[0]
    pe = m.patch_embed
    norms = [m.norm if not isinstance(m.norm, nn.Identity) else m.fc_norm]
    norms += [n for blk in m.blocks for n in (blk.norm1, blk.norm2, blk.mlp.norm) if not isinstance(n, nn.Identity)]
    position, layers = {"kind": "none" if m.pos_embed is None else "learned"}, []
    if rel_bias and m.pos_embed is None:
        position = {"kind": "relative_bias2d"}
    elif rel_bias:  # positions added to the embeddings, and every layer biased by its table
        layers = [{"at": "0:", "position": {"kind": "relative_bias2d"}}]
    return {
        "family": "vit", "image_size": pe.img_size[0], "patch_size": pe.patch_size[0], "in_channels": pe.proj.in_channels,
        "head": {"kind": "linear", "num_classes": m.head.out_features} if isinstance(m.head, nn.Linear) else {"kind": "none"},
        "d_model": m.embed_dim, "n_layers": len(m.blocks), "pool": {"kind": {"token": "cls", "avg": "mean"}[m.global_pool]},
        "fc_norm": not isinstance(m.fc_norm, nn.Identity), "position": position, "layers": layers,
        "block": {
            "attention": {"kind": "mha", "n_heads": heads, "bias": qkv_bias, "key_bias": not qkv_bias,
                          "out_bias": None if qkv_bias else True},
            "ffn": ffn, "norm": {"kind": "layernorm", "eps": layernorm_eps(norms, FROM)}, "kind": "pre", "layer_scale": scale,
        },
        "dropout": {"embedding": m.pos_drop.p, "residual": proj_drop, "attention": attn_drop, "ffn": proj_drop},
        "init": {"scheme": "trunc_normal", "std": 0.02},
    }


def _rel_bias_of(s: FamilySpec) -> bool:
    """Whether every layer has its relative_bias2d (False: none has), refusing layers that differ."""
    layers = s.stack_layers()
    if any(layer.block != s.block for layer in layers):
        raise unsupported(TO, "layers", "a block of their own", "timm's Beit repeats one block")
    kinds = {(layer.position or s.position).kind for layer in layers}
    if len(kinds) > 1:
        raise unsupported(TO, "layers.position", sorted(kinds), "timm's Beit biases every layer alike")
    kind = kinds.pop()
    if kind not in ("relative_bias2d", "learned", "none") or (kind == "relative_bias2d") != (
            s.position.kind == "relative_bias2d" or any(layer.position is not None for layer in layers)):
        raise unsupported(TO, "layers.position.kind", kind, "timm's Beit biases its layers by relative_bias2d or not at all")
    if any(layer.position is not None for layer in layers) and s.position.kind != "learned":
        raise unsupported(TO, "layers.position", "relative_bias2d", "timm's Beit's layers have a relative_bias2d of their "
                          "own beside learned positions only; without a learned table, give the model position: "
                          "relative_bias2d alone")
    return kind == "relative_bias2d"


def _rules(s: FamilySpec, m: nn.Module) -> list[Rule]:
    """zoo <-> Beit names: the fused ``qkv`` with its ``q_bias`` and ``v_bias``, SwiGLU's split
    ``fc1_g`` and ``fc1_x`` (zoo's fc1 is [gate | up]), each layer's relative bias table."""
    from timm.layers import SwiGLU

    split_glu = type(m.blocks[0].mlp) is SwiGLU
    rel_bias = m.blocks[0].attn.relative_position_bias_table is not None
    rules = embedding_rules(s)
    for i in range(s.n_layers):
        z, t = f"stack.blocks.{i}.", f"blocks.{i}."
        pairs = [("attn_norm", "norm1"), ("ffn_norm", "norm2"), ("attn.out", "attn.proj"), ("ffn.fc2", "mlp.fc2")]
        pairs += [("ffn.norm", "mlp.norm")] if s.block.ffn.norm else []
        pairs += [] if split_glu else [("ffn.fc1", "mlp.fc1")]
        rules += [rule(f"{z}{a}.{p}", f"{t}{b}.{p}") for a, b in pairs for p in ("weight", "bias")]
        if split_glu:
            rules += [rule(f"{z}ffn.fc1.{p}", f"{t}mlp.fc1_g.{p}", f"{t}mlp.fc1_x.{p}") for p in ("weight", "bias")]
        rules.append(rule(f"{z}attn.qkv.weight", f"{t}attn.qkv.weight"))
        rules += [rule(f"{z}attn.{b}", f"{t}attn.{b}") for b in ("q_bias", "v_bias") if s.block.attention.bias]
        if rel_bias:  # one table a layer, in layer order
            rules.append(rule(f"stack.positions.{i}.weight", f"{t}attn.relative_position_bias_table"))
        if s.block.layer_scale is not None:
            rules += [rule(f"{z}ls_attn.gamma", f"{t}gamma_1"), rule(f"{z}ls_ffn.gamma", f"{t}gamma_2")]
    return rules + output_rules(s)


def _kwargs(s: FamilySpec) -> dict:
    """Beit arguments for ``s`` (its claims checked), refusing what they let through and timm's Beit
    still cannot express."""
    att, ffn, d = s.block.attention, s.block.ffn, s.d_model
    rel_bias = _rel_bias_of(s)
    refuse_unless([
        ("block.attention.n_kv_heads", att.n_kv_heads, att.n_kv_heads == att.n_heads, "timm's Beit has multi-head attention only"),
        ("block.attention.head_dim", (att.qk_size(d), att.v_size(d)),
         d % att.n_heads == 0 and att.qk_size(d) == att.v_size(d) == d // att.n_heads, "timm's Beit head size is d_model / n_heads"),
        ("block.attention.key_bias", att.key_bias, not att.bias or not att.key_bias, "timm's Beit has q and v biases, no k bias"),
        ("block.attention.out_bias", att.out_bias, att.has_out_bias, "timm's Beit has a bias on the output projection"),
        ("dropout.ffn", s.dropout.ffn, s.dropout.ffn == s.dropout.residual, "timm's proj_drop_rate covers the MLP and the residuals"),
    ], TO)
    return dict(
        img_size=s.image_size, patch_size=s.patch_size, in_chans=s.in_channels, num_classes=s.num_classes or 0,
        global_pool=_POOLS[s.pool.kind], embed_dim=d, depth=s.n_layers, num_heads=att.n_heads, qkv_bias=att.bias,
        mlp_ratio=mlp_ratio(d, ffn.hidden_size(d)), swiglu_mlp=ffn.kind == "swiglu", scale_mlp=ffn.norm,
        pos_drop_rate=s.dropout.embedding, proj_drop_rate=s.dropout.residual, attn_drop_rate=s.dropout.attention,
        norm_layer=functools.partial(nn.LayerNorm, eps=s.block.norm.eps), init_values=s.block.layer_scale,
        use_abs_pos_emb=s.position.kind == "learned", use_rel_pos_bias=rel_bias, use_fc_norm=s.fc_norm,
    )


class Beit(Architecture):
    """timm's Beit."""

    name = "Beit"
    module = "timm.models.beit"
    base_model = "beit_base_patch16_224"
    claims = CLAIMS
    spec = staticmethod(_spec)
    rules = staticmethod(_rules)
    kwargs = staticmethod(_kwargs)
