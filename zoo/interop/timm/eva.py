"""timm's Eva (EVA-02 and EVA: :class:`Eva`), exact in both directions.

Covers ``eva02_tiny/small/base/large_patch14_*`` and every Eva built from options zoo has: learned
positions and/or 2-D RoPE on the patch grid (``RotaryEmbeddingCat``: ``rope2d``, its ``ref_feat_shape``
as ``ref_grid``; DINOv3's ``RotaryEmbeddingDinoV3``: ``rope2d`` with ``coords: centered``; RoPE-Mixed's
learned frequencies, ``RotaryEmbeddingMixed``: ``rope2d_mixed``, ``vit_*_patch16_rope_mixed[_ape]_224``;
the class token not turned), q and v biases without a k bias (``EvaAttention``: ``key_bias: false``) or
on all three (``attn_type='rope'``, timm's ``AttentionRope``, and its grouped-query attention,
``num_kv_heads``, written on split q, k, v projections), a two-layer GELU MLP or SwiGLU, packed
(``GluMlp``) or split (``SwiGLU``), with or without the norm on its hidden activation (``scale_mlp``:
``ffn.norm``), fused or separate q, k, v projections, layer scale on both branches, class token and registers, class-token or mean pooling with the final
norm or ``fc_norm``, a linear head or none, a norm before the blocks (without a patch bias), and
``dynamic_img_size``. zoo writes the fused q, k, v layout and, without ``scale_mlp``, the packed SwiGLU
(timm's defaults); anything else is refused by name.
"""

from __future__ import annotations

import functools

from torch import nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.timm.base import Architecture
from zoo.interop.timm.parts import activation_of, embedding_rules, layernorm_eps, mlp_ratio, output_rules, refuse_unless
from zoo.spec import FamilySpec

__all__ = ["CLAIMS", "Eva"]

FROM, TO = "timm Eva -> zoo", "zoo -> timm Eva"
_POOLS = {"cls": "token", "mean": "avg"}

# The spec fields timm's Eva expresses (zoo.interop.claims); any other is refused.
CLAIMS: Claims = {
    "family": one_of("vit"), "image_size": ANY, "patch_size": ANY, "in_channels": ANY, "d_model": ANY, "n_layers": ANY,
    "head.kind": one_of("linear", "none"), "head.num_classes": ANY, "class_token": ANY, "reg_tokens": ANY,
    "prefix_positions": ANY, "pool.kind": one_of("cls", "mean"), "fc_norm": ANY, "pre_norm": ANY, "patch_bias": ANY,
    "dynamic_size": ANY, "position.kind": one_of("learned", "none", "rope2d", "rope2d_mixed"), "position.base": ANY,
    "position.ref_grid": ANY, "position.coords": ANY, "position.pairs": ANY, "position.indexing": ANY, "layers": ANY,
    "block.kind": one_of("pre"), "block.attention.kind": one_of("mha", "gqa", "mqa"),
    "block.attention.n_heads": ANY, "block.attention.n_kv_heads": ANY, "block.attention.head_dim": ANY,
    "block.attention.v_head_dim": ANY, "block.attention.bias": ANY, "block.attention.out_bias": ANY,
    "block.attention.key_bias": ANY, "block.ffn.kind": one_of("gelu", "swiglu"), "block.ffn.hidden": ANY,
    "block.ffn.bias": one_of(True), "block.ffn.norm": ANY, "block.ffn.approximate": one_of("none"),
    "block.norm.kind": one_of("layernorm"), "block.norm.eps": ANY, "block.norm.bias": one_of(True),
    "block.layer_scale": ANY, "dropout.embedding": ANY, "dropout.residual": ANY, "dropout.attention": ANY,
    "dropout.ffn": ANY,
}


def _check_model(m: nn.Module) -> None:
    from timm.layers import PatchEmbed

    pe = m.patch_embed
    refuse_unless([
        ("global_pool", m.global_pool, m.global_pool in ("token", "avg") and m.attn_pool is None,
         "zoo reads timm's Eva pooled by the class token ('token') or the patch mean ('avg')"),
        ("patch_drop_rate", "> 0", m.patch_drop is None, "zoo has no patch dropout"),
        ("use_post_transformer_norm / use_fc_norm", "both or neither",
         isinstance(m.norm, nn.Identity) != isinstance(m.fc_norm, nn.Identity),
         "zoo's Pre-Norm ViT has one final norm, before pooling or after it (fc_norm)"),
        ("head", type(m.head).__name__, isinstance(m.head, (nn.Linear, nn.Identity)), "zoo's ViT ends in a linear classifier or none"),
        ("drop_rate", m.head_drop.p, m.head_drop.p == 0, "zoo has no dropout before the classifier"),
        ("rope_type", type(m.rope).__name__,
         m.rope is None or type(m.rope).__name__ in ("RotaryEmbeddingCat", "RotaryEmbeddingDinoV3", "RotaryEmbeddingMixed"),
         "zoo's rope2d is timm's RotaryEmbeddingCat ('cat') or RotaryEmbeddingDinoV3 ('dinov3'), its rope2d_mixed "
         "RotaryEmbeddingMixed ('mixed')"),
        ("embed_layer", type(pe).__name__, type(pe) is PatchEmbed and isinstance(pe.norm, nn.Identity),
         "zoo embeds patches with one strided convolution"),
        ("dynamic_img_pad", pe.dynamic_img_pad, not pe.dynamic_img_pad, "zoo takes images whose sides are multiples of the patch size"),
        ("img_size/patch_size", (pe.img_size, pe.patch_size), pe.img_size[0] == pe.img_size[1] and pe.patch_size[0] == pe.patch_size[1],
         "zoo's ViT takes square images and patches"),
    ], FROM)


def _rope_dinov3(m: nn.Module) -> dict:
    """timm's RotaryEmbeddingDinoV3 as a zoo Rope2dSpec mapping (``coords: centered``)."""
    r, head = m.rope, m.embed_dim // m.blocks[0].attn.num_heads
    refuse_unless([
        ("rope min_period/max_period", (r.min_period, r.max_period), r.min_period is None or r.max_period is None,
         "zoo's centered rope2d has the periods base^(i/(K/4)) (rope_temperature)"),
        ("rope normalize_coords", r.normalize_coords, r.normalize_coords == "separate",
         "zoo's centered rope2d maps each side to [-1, 1] by its own length"),
        ("rope_grid_offset", r.grid_offset, r.grid_offset == 0, "zoo's centered rope2d puts each patch at its centre"),
        ("rope_grid_indexing", r.grid_indexing, r.grid_indexing == "ij", "zoo's rope2d turns the first bands by the row"),
        ("rope_shift/jitter/rescale_coords", True, not r.aug_active, "zoo's rope2d has no coordinate augmentation"),
        ("rope dim", r.dim, r.dim == head == m.blocks[0].attn.head_dim, "zoo's rope2d turns whole heads of embed_dim / num_heads"),
    ], FROM)
    return {"kind": "rope2d", "base": float(r.temperature), "coords": "centered",
            "pairs": "half" if r.rotate_half else "interleaved"}


def _rope_mixed(m: nn.Module) -> dict:
    """timm's RotaryEmbeddingMixed as a zoo Rope2dMixedSpec mapping (its frequencies are each layer's)."""
    r, heads = m.rope, m.blocks[0].attn.num_heads
    refuse_unless([
        ("rope_shift/jitter/rescale_coords", True, not r.aug_active, "zoo's rope2d_mixed has no coordinate augmentation"),
        ("rope dim / depth / num_heads", (r.dim, r.depth, r.num_heads),
         r.dim == m.embed_dim and r.depth == len(m.blocks) and r.num_heads == heads
         and r.dim // heads == m.blocks[0].attn.head_dim, "zoo's rope2d_mixed turns whole heads of every layer"),
        ("rope_grid_indexing", r.grid_indexing, r.grid_indexing in ("xy", "ij"), "zoo's rope2d_mixed indexes xy or ij"),
        ("rope_rotate_half", True, not any(getattr(b.attn, "rotate_half", False) for b in m.blocks),
         "RoPE-Mixed turns interleaved pairs"),
        ("num_kv_heads", True, all(getattr(b.attn, "num_kv_heads", heads) == heads for b in m.blocks),
         "RoPE-Mixed's frequencies are per query head, and timm turns the keys by them too"),
    ], FROM)
    return {"kind": "rope2d_mixed", "base": float(r.temperature), "indexing": r.grid_indexing}


def _rope(m: nn.Module) -> dict | None:
    """timm's RotaryEmbeddingCat (RotaryEmbeddingDinoV3, RotaryEmbeddingMixed) as a zoo Rope2dSpec
    (Rope2dMixedSpec) mapping (None without RoPE)."""
    r = m.rope
    if r is None:
        return None
    if type(r).__name__ == "RotaryEmbeddingDinoV3":
        return _rope_dinov3(m)
    if type(r).__name__ == "RotaryEmbeddingMixed":
        return _rope_mixed(m)
    ref = r.ref_feat_shape
    head = m.embed_dim // m.blocks[0].attn.num_heads
    refuse_unless([
        ("rope in_pixels", r.in_pixels, not r.in_pixels and r.grid_type == "index", "zoo's rope2d turns by grid indices"),
        ("rope_grid_offset", r.grid_offset, r.grid_offset == 0, "zoo's rope2d counts rows and columns from 0"),
        ("rope_grid_indexing", r.grid_indexing, r.grid_indexing == "ij", "zoo's rope2d turns the first half by the row"),
        ("rope_shift/jitter/rescale_coords", True, not r.aug_active, "zoo's rope2d has no coordinate augmentation"),
        ("rope dim", r.dim, r.dim == head == m.blocks[0].attn.head_dim, "zoo's rope2d turns whole heads of embed_dim / num_heads"),
        ("ref_feat_shape", ref, ref is None or (len(ref) == 2 and ref[0] == ref[1]), "zoo's rope2d stretches to a square reference grid"),
    ], FROM)
    return {"kind": "rope2d", "base": float(r.temperature), "ref_grid": None if ref is None else int(ref[0]),
            "pairs": "half" if r.rotate_half else "interleaved"}


def _block(blk: nn.Module, i: int) -> tuple:
    """A block's options as one comparable tuple, refusing what zoo lacks."""
    from timm.layers import AttentionRope, GluMlp, Mlp, SwiGLU
    from timm.models.eva import EvaAttention, EvaBlock

    a, mlp = blk.attn, blk.mlp
    where = f"{FROM}: blocks.{i}"
    refuse_unless([
        ("block_fn", type(blk).__name__, type(blk) is EvaBlock, "zoo's blocks are timm's Pre-Norm EvaBlock"),
        ("attn_type", type(a).__name__, type(a) in (EvaAttention, AttentionRope),
         "zoo's attention is timm's EvaAttention ('eva') or AttentionRope ('rope')"),
        ("mlp", type(mlp).__name__, type(mlp) in (Mlp, GluMlp, SwiGLU), "zoo's FFNs are timm's Mlp, GluMlp and SwiGLU"),
        ("drop_path_rate", "> 0", isinstance(blk.drop_path1, nn.Identity) and isinstance(blk.drop_path2, nn.Identity),
         "zoo has no stochastic depth"),
        ("layer scale", "on one branch", (blk.gamma_1 is None) == (blk.gamma_2 is None), "zoo's layer scale is on both branches"),
    ], where)
    refuse_unless([
        ("scale_attn_inner", True, isinstance(a.norm, nn.Identity), "zoo has no norm inside attention"),
        ("gated_attn", True, a.gate is None, "zoo's attention has no output gate"),
        ("qk_norm", True, isinstance(a.q_norm, nn.Identity) and isinstance(a.k_norm, nn.Identity),
         "zoo reads timm's Eva without qk-norm"),
        ("mlp bias", False, all(lin.bias is not None for lin in _mlp_linears(mlp)), "zoo's Eva MLP has biases"),
        ("proj_bias", False, a.proj.bias is not None, "zoo's Eva attention has an output bias"),
    ], where)
    if type(mlp) is GluMlp:
        refuse_unless([("GluMlp", (type(mlp.act).__name__, mlp.gate_last), type(mlp.act) is nn.SiLU and not mlp.gate_last
                  and mlp.chunk_dim == -1, "zoo's packed SwiGLU is [gate | up] with SiLU")], where)
        ffn = {"kind": "swiglu", "hidden": mlp.fc2.in_features}
    elif type(mlp) is SwiGLU:
        refuse_unless([("SwiGLU act_layer", type(mlp.act).__name__, type(mlp.act) is nn.SiLU, "zoo's SwiGLU gates with SiLU")], where)
        ffn = {"kind": "swiglu", "hidden": mlp.fc2.in_features}
    else:
        ffn = {**activation_of(mlp.act, FROM), "hidden": mlp.fc1.out_features}
    ffn.update(bias=True, norm=not isinstance(mlp.norm, nn.Identity))
    fused, own = a.qkv is not None, type(a) is AttentionRope  # AttentionRope: the projections' own biases, k's too
    qkv_bias = (a.qkv.bias if own and fused else a.q_bias if fused else a.q_proj.bias) is not None
    drops = (a.proj_drop.p, mlp.drop1.p, mlp.drop2.p)
    if len(set(drops)) > 1:
        raise unsupported(where, "proj_drop_rate", drops, "zoo's residual and MLP dropout here must match")
    scale = None if blk.gamma_1 is None else float(blk.init_values)
    kv_heads = getattr(a, "num_kv_heads", a.num_heads)  # AttentionRope's grouped-query attention
    return (a.num_heads, a.head_dim, qkv_bias, own, kv_heads, repr(ffn), a.attn_drop.p, drops[0], scale), ffn


def _mlp_linears(mlp: nn.Module) -> list[nn.Module]:
    return [getattr(mlp, name) for name in ("fc1", "fc1_g", "fc1_x", "fc2") if hasattr(mlp, name)]


def _spec(m: nn.Module) -> dict:
    """The zoo spec (a mapping) of a timm Eva (refusing what zoo cannot express)."""
    _check_model(m)
    blocks = [_block(blk, i) for i, blk in enumerate(m.blocks)]
    if len({key for key, _ in blocks}) > 1:
        raise unsupported(FROM, "blocks", "differ", "zoo's ViT repeats one block spec")
    (heads, head_dim, qkv_bias, k_bias, kv_heads, _, attn_drop, proj_drop, scale), ffn = blocks[0]
    if head_dim * heads != m.embed_dim:
        raise unsupported(FROM, "attn_head_dim", head_dim, "zoo's ViT head size is embed_dim / num_heads")
    pe, rope = m.patch_embed, _rope(m)
    norms = [m.norm if not isinstance(m.norm, nn.Identity) else m.fc_norm]
    norms += [n for blk in m.blocks for n in (blk.norm1, blk.norm2, blk.mlp.norm) if not isinstance(n, nn.Identity)]
    norms += [] if isinstance(m.norm_pre, nn.Identity) else [m.norm_pre]
    position, layers = {"kind": "none" if m.pos_embed is None else "learned"}, []
    if rope is not None and m.pos_embed is None:
        position = rope
    elif rope is not None:  # positions added to the embeddings, and every layer turns by the grid
        layers = [{"at": "0:", "position": rope}]
    return {
        "family": "vit", "image_size": pe.img_size[0], "patch_size": pe.patch_size[0], "in_channels": pe.proj.in_channels,
        "head": {"kind": "linear", "num_classes": m.head.out_features} if isinstance(m.head, nn.Linear) else {"kind": "none"},
        "d_model": m.embed_dim, "n_layers": len(m.blocks), "class_token": m.cls_token is not None,
        "reg_tokens": 0 if m.reg_token is None else m.reg_token.shape[1],
        "prefix_positions": not m.no_embed_class or m.pos_embed is None, "pool": {"kind": {"token": "cls", "avg": "mean"}[m.global_pool]},
        "fc_norm": not isinstance(m.fc_norm, nn.Identity), "pre_norm": not isinstance(m.norm_pre, nn.Identity),
        "patch_bias": pe.proj.bias is not None, "dynamic_size": m.dynamic_img_size, "position": position, "layers": layers,
        "block": {
            "attention": {"kind": "mha" if kv_heads == heads else "gqa", "n_heads": heads, "n_kv_heads": kv_heads,
                          "bias": qkv_bias, "key_bias": k_bias or not qkv_bias,
                          "out_bias": None if qkv_bias else True},
            "ffn": ffn, "norm": {"kind": "layernorm", "eps": layernorm_eps(norms, FROM)}, "kind": "pre", "layer_scale": scale,
        },
        "dropout": {"embedding": m.pos_drop.p, "residual": proj_drop, "attention": attn_drop, "ffn": proj_drop},
        "init": {"scheme": "trunc_normal", "std": 0.02},
    }


def _rules(s: FamilySpec, m: nn.Module) -> list[Rule]:
    """zoo <-> Eva names, in the layout of the Eva ``m``: fused q, k, v in one ``qkv`` (else
    ``q_proj``, ``k_proj``, ``v_proj``); SwiGLU's split ``fc1_g`` and ``fc1_x`` (else GluMlp's packed
    ``fc1``). zoo builds the fused layout and, without ``scale_mlp``, the packed SwiGLU (timm's defaults)."""
    from timm.layers import SwiGLU

    fused, split_glu = m.blocks[0].attn.qkv is not None, type(m.blocks[0].mlp) is SwiGLU
    rules = embedding_rules(s)
    att, ffn = s.block.attention, s.block.ffn
    mixed = [(layer.position or s.position).kind == "rope2d_mixed" for layer in s.stack_layers()]
    for i in range(s.n_layers):
        z, t = f"stack.blocks.{i}.", f"blocks.{i}."
        pairs = [("attn_norm", "norm1"), ("ffn_norm", "norm2"), ("attn.out", "attn.proj"), ("ffn.fc2", "mlp.fc2")]
        pairs += [("ffn.norm", "mlp.norm")] if ffn.norm else []
        pairs += [] if split_glu else [("ffn.fc1", "mlp.fc1")]
        rules += [rule(f"{z}{a}.{p}", f"{t}{b}.{p}") for a, b in pairs for p in ("weight", "bias")]
        if split_glu:  # zoo's fc1 is [gate | up]
            rules += [rule(f"{z}ffn.fc1.{p}", f"{t}mlp.fc1_g.{p}", f"{t}mlp.fc1_x.{p}") for p in ("weight", "bias")]
        own = att.bias and att.key_bias  # AttentionRope's: q, k and v biases of the projections
        if fused:
            rules.append(rule(f"{z}attn.qkv.weight", f"{t}attn.qkv.weight"))
            rules += [rule(f"{z}attn.qkv.bias", f"{t}attn.qkv.bias")] if own else []
            rules += [rule(f"{z}attn.{b}", f"{t}attn.{b}") for b in ("q_bias", "v_bias") if att.bias and not own]
        else:
            rules.append(rule(f"{z}attn.qkv.weight", *(f"{t}attn.{n}_proj.weight" for n in "qkv")))
            rules += [rule(f"{z}attn.qkv.bias", *(f"{t}attn.{n}_proj.bias" for n in "qkv"))] if own else []
            rules += [rule(f"{z}attn.{n}_bias", f"{t}attn.{n}_proj.bias") for n in "qv" if att.bias and not own]
        if mixed[i]:  # layer i's slice of every layer's frequencies
            rules.append(rule(f"stack.positions.{i}.freqs", "rope.freqs", part=(1, i)))
        if s.block.layer_scale is not None:
            rules += [rule(f"{z}ls_attn.gamma", f"{t}gamma_1"), rule(f"{z}ls_ffn.gamma", f"{t}gamma_2")]
    return rules + output_rules(s)


def _rope_of(s: FamilySpec):
    """The one rope2d of every layer (None without one), refusing layers that differ."""
    layers = s.stack_layers()
    if any(layer.block != s.block for layer in layers):
        raise unsupported(TO, "layers", "a block of their own", "timm's Eva repeats one block")
    own = {layer.position.model_dump_json() if layer.position is not None else None for layer in layers}
    if len(own) > 1:
        raise unsupported(TO, "layers", "positions that differ", "timm's Eva turns every layer alike")
    if layers[0].position is not None and s.position.kind != "learned":
        raise unsupported(TO, "layers.position", layers[0].position.kind, "timm's Eva's layers have a rope2d of their own "
                          "beside learned positions only; without a learned table, give the model position: rope2d alone")
    pos, ropes = layers[0].position or s.position, ("rope2d", "rope2d_mixed")
    if pos.kind not in (*ropes, "learned", "none") or (layers[0].position is not None and pos.kind not in ropes):
        raise unsupported(TO, "layers.position.kind", pos.kind, "timm's Eva turns its layers by rope2d, rope2d_mixed or "
                          "not at all")
    return pos if pos.kind in ropes else None


def _kwargs(s: FamilySpec) -> dict:
    """Eva arguments for ``s`` (its claims checked), refusing what they let through and timm's Eva
    still cannot express."""
    att, ffn, d = s.block.attention, s.block.ffn, s.d_model
    rope = _rope_of(s)
    mixed, grouped = rope is not None and rope.kind == "rope2d_mixed", att.n_kv_heads != att.n_heads
    refuse_unless([
        ("block.attention.key_bias", att.key_bias, not grouped or not att.bias or att.key_bias,
         f"timm's Eva groups key/value heads (n_kv_heads is {att.n_kv_heads}) in AttentionRope, with q, k and v biases "
         f"or none"),
        ("position.kind", "rope2d_mixed", not grouped or not mixed, f"RoPE-Mixed's frequencies are per query head and timm's "
         f"Eva turns the keys by them too: n_kv_heads ({att.n_kv_heads}) must equal n_heads"),
        ("block.attention.head_dim", (att.qk_size(d), att.v_size(d)),
         d % att.n_heads == 0 and att.qk_size(d) == att.v_size(d) == d // att.n_heads, "timm's Eva head size is d_model / n_heads"),
        ("block.attention.out_bias", att.out_bias, att.has_out_bias, "timm's Eva has a bias on the output projection"),
        ("dropout.ffn", s.dropout.ffn, s.dropout.ffn == s.dropout.residual, "timm's proj_drop_rate covers the MLP and the residuals"),
        ("patch_bias", s.patch_bias, s.patch_bias != s.pre_norm, f"timm's Eva has a patch bias without the pre-norm and none with "
         f"it (pre_norm is {s.pre_norm})"),
    ], TO)
    pos, gqa = s.position.kind, att.n_kv_heads if grouped else None  # GQA: AttentionRope on split q, k, v projections
    cat = rope is not None and not mixed
    return dict(
        img_size=s.image_size, patch_size=s.patch_size, in_chans=s.in_channels, num_classes=s.num_classes or 0,
        global_pool=_POOLS[s.pool.kind], embed_dim=d, depth=s.n_layers, num_heads=att.n_heads, qkv_bias=att.bias,
        qkv_fused=gqa is None, num_kv_heads=gqa, mlp_ratio=mlp_ratio(d, ffn.hidden_size(d)), swiglu_mlp=ffn.kind == "swiglu",
        scale_mlp=ffn.norm,
        pos_drop_rate=s.dropout.embedding, proj_drop_rate=s.dropout.residual, attn_drop_rate=s.dropout.attention,
        norm_layer=functools.partial(nn.LayerNorm, eps=s.block.norm.eps), init_values=s.block.layer_scale,
        class_token=s.class_token, num_reg_tokens=s.reg_tokens, no_embed_class=not s.prefix_positions,
        use_abs_pos_emb=pos == "learned", use_rot_pos_emb=rope is not None,
        rope_temperature=rope.base if rope is not None else 10000.0,
        rope_type="mixed" if mixed else "dinov3" if cat and rope.coords == "centered" else "cat",
        rope_rotate_half=cat and rope.pairs == "half", rope_grid_indexing=rope.indexing if mixed else "ij",
        ref_feat_shape=None if not cat or rope.ref_grid is None else (rope.ref_grid, rope.ref_grid),
        attn_type="rope" if att.bias and att.key_bias or gqa else "eva",
        use_pre_transformer_norm=s.pre_norm, use_post_transformer_norm=not s.fc_norm, use_fc_norm=s.fc_norm,
        dynamic_img_size=s.dynamic_size,
    )


class Eva(Architecture):
    """timm's Eva."""

    name = "Eva"
    module = "timm.models.eva"
    base_model = "eva02_tiny_patch14_224"
    claims = CLAIMS
    spec = staticmethod(_spec)
    rules = staticmethod(_rules)
    kwargs = staticmethod(_kwargs)
