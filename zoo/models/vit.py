"""Vision Transformer (Dosovitskiy et al. 2021), laid out as timm's VisionTransformer.

    images [B, C, H, W] -> [conv stem ->] patches [B, N, D] -> [class token; registers;] + positions
                        -> [pre_norm ->] blocks -> pool -> [fc_norm] -> logits

Positions are added to every token, or, with ``prefix_positions: false``, to the patches before the
class token and registers are put in front (timm's ``no_embed_class``). With ``dynamic_size`` the
position table is fitted to each input's patch grid. Inside attention, the layers get each token's
place on the grid, (row, column) and (-1, -1) for the prefix (:func:`grid_positions`), which a 2-D
RoPE turns queries and keys by (EVA-02) and a 2-D relative bias reads its scores' bias from (BEiT).

A :class:`~zoo.models.patches.PatchBatch` (images of mixed sizes as padded patch lists; NaViT, timm's
NaFlexVit) goes where images go: each image's position table fitted to its own grid and read at its
patches' coordinates, the padding hidden from attention and left out of pooling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from zoo.components import parts
from zoo.components.dropout import Dropout
from zoo.components.embedding import PatchEmbedding
from zoo.components.rope2d import grid_positions
from zoo.components.stack import Stack, StackContext
from zoo.kernels import Mask
from zoo.models.common import build_part, build_position, build_stack, init_weights
from zoo.models.family import Family
from zoo.models.patches import PatchBatch
from zoo.registry import register
from zoo.spec import VitSpec


@dataclass(frozen=True)
class VitFeatures:
    """Per-block outputs of :meth:`VisionTransformer.features`, in block order.

    ``layers``: the blocks' indices; ``patches``: each block's patch tokens, [B, D, h, w] on the
    patch grid (or [B, h*w, D] with ``grid=False``); ``prefix``: each block's class and register
    tokens [B, P, D] (P = 0 without them); ``grid``: (h, w)."""

    layers: list[int]
    patches: list[Tensor]
    prefix: list[Tensor]
    grid: tuple[int, int]


class VisionTransformer(Family):
    """``model(images[B,C,H,W]) -> logits[B,num_classes]`` (the pooled features [B, D] without a
    head); ``pooled(images) -> [B, D]`` the head's input; ``features(images, layers)`` the tokens of
    chosen blocks."""

    is_causal = False
    unit = "image"
    summary_parts = {"cls_token": "embeddings", "reg_token": "embeddings", "norm_pre": "norms"}

    def __init__(self, spec: VitSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        stem = list(zip(spec.stem.channels, spec.stem.layer_strides)) if spec.stem else []
        self.patch_embed = PatchEmbedding(in_channels=spec.in_channels, dim=d, patch_size=spec.patch_size, stem=stem,
                                          bias=spec.patch_bias,
                                          norm=build_part("norm", spec.block.norm, dim=d) if spec.patch_norm else None)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, spec.reg_tokens, d)) if spec.reg_tokens else None
        self.position = build_position(spec, max_len=spec.n_positions, grid=spec.grid)
        self.drop = Dropout(spec.dropout.embedding)
        self.norm_pre = build_part("norm", spec.block.norm, dim=d) if spec.pre_norm else nn.Identity()
        self.stack = build_stack(spec, max_len=spec.n_positions, final_norm=spec.has_final_norm and not spec.fc_norm)
        self.pool = build_part("pool", spec.pool, dim=d, block=spec.block)
        self.fc_norm = build_part("norm", spec.block.norm, dim=d) if spec.fc_norm else nn.Identity()
        self.head = build_part("head", spec.head, dim=d, vocab_size=0, norm=spec.block.norm, embedding=None)
        init_weights(self, spec)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)  # as timm

    # ------------------------------------------------------------------------------ embedding
    def _grid(self, images: object) -> tuple[int, int]:
        """The patch grid of ``images``, refusing a shape the model cannot take."""
        s = self.spec
        fixed = (s.in_channels, s.image_size, s.image_size)
        ok = isinstance(images, Tensor) and images.dim() == 4 and images.shape[1] == s.in_channels
        if isinstance(images, Tensor) and not images.is_floating_point():
            raise ValueError(f"images: expected a float tensor, got {images.dtype}; convert pixels to floats as the model "
                             f"was trained on them (e.g. images.float() / 255, then its normalisation)")
        if ok and s.dynamic_size:
            h, w = images.shape[2:]
            if h >= s.patch_size and w >= s.patch_size and h % s.patch_size == 0 and w % s.patch_size == 0:
                return h // s.patch_size, w // s.patch_size
            raise ValueError(
                f"images: height and width must be multiples of patch_size ({s.patch_size}), got {h} x {w}; "
                f"crop or pad the images"
            )
        if ok and tuple(images.shape[1:]) == fixed:
            return s.grid
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        hint = ", or set dynamic_size: true to take other sizes" if ok else ""
        raise ValueError(
            f"images: expected a float tensor [batch, {fixed[0]}, {fixed[1]}, {fixed[2]}] (in_channels, image_size), "
            f"got {got}; resize the images or set image_size/in_channels in the spec{hint}"
        )

    def _add_positions(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        """x [B, n_positions rows' tokens, D] + the position table fitted to ``grid``."""
        if grid == self.spec.grid:
            return self.position.add(x, torch.arange(x.shape[1], device=x.device))
        prefix = self.spec.n_prefix if self.spec.prefix_positions else 0
        table = self.position.fit_grid(grid, trained=self.spec.grid, prefix=prefix)
        return x if table is None else x + table.to(x.dtype)

    def embed(self, images: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """The first block's input [B, T, D] (prefix tokens, then patches, with positions, embedding
        dropout and ``pre_norm``) and the patch grid (h, w)."""
        grid = self._grid(images)
        x = self.patch_embed(images)  # (B, N, D)
        prefix = [t.expand(x.shape[0], -1, -1).to(x.dtype) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.spec.prefix_positions:
            x = self._add_positions(torch.cat([*prefix, x], dim=1), grid)  # (B, P + N, D)
        else:
            x = torch.cat([*prefix, self._add_positions(x, grid)], dim=1)
        return self.norm_pre(self.drop(x)), grid

    def _context(self, x: Tensor, grid: tuple[int, int]) -> StackContext:
        """The stack's context, each layer's attention given the tokens' grid positions [T, 2] (and a
        score bias read from them, where its position has one)."""
        ctx = self.stack.context(self.position, x, None, causal=False, check_length=False)  # added by embed()
        places = grid_positions(grid, self.spec.n_prefix, x.device)
        made = {}
        for i, c in enumerate(ctx.layers):  # one rotation and bias a layer variant, as the stack makes them
            if id(c) not in made:
                heads = self.stack.variants[self.stack.variant_of[i]][2]
                bias = c.pos.bias(heads, places, places)
                mask = c.mask if bias is None else Mask(len(places), len(places), bias=bias, device=x.device)
                made[id(c)] = replace(c, positions=places, mask=mask,
                                      rotation=c.pos.rotation(places) if c.rotation is not None else None)
        return replace(ctx, layers=tuple(made[id(c)] for c in ctx.layers))

    def embed_patches(self, batch: PatchBatch) -> tuple[Tensor, Tensor]:
        """The first block's input [B, P + N, D] for a batch of patch lists, and the tokens' padding
        mask [B, P + N] (True at the prefix and the valid patches)."""
        s = self.spec
        grids = batch.grids(s.patch_size, s.in_channels)
        if any(layer.position is not None for layer in s.stack_layers()) or s.position.kind not in ("learned", "sincos2d", "none"):
            raise ValueError(f"patches: patch lists take positions added to the tokens (learned, sincos2d or none), one "
                             f"grid per image; position.kind {s.position.kind!r} or the layers' positions need one grid "
                             f"for the batch: pass images [B, C, H, W]")
        if not s.dynamic_size and any(g != s.grid for g in grids):
            raise ValueError(f"patches: an image's grid {next(g for g in grids if g != s.grid)} is not the model's {s.grid} "
                             f"(image_size / patch_size); set dynamic_size: true to fit positions to each image")
        x = self.patch_embed.flat(batch.patches)  # (B, N, D)
        b = x.shape[0]
        prefix = [t.expand(b, -1, -1).to(x.dtype) for t in (self.cls_token, self.reg_token) if t is not None]
        rows = s.n_prefix if s.prefix_positions else 0
        added = batch.positions(grids, lambda g: self.position.fit_grid(g, trained=s.grid, prefix=rows), rows)
        if added is not None:
            pre, pos = added
            x = x + pos.to(x.dtype)
            if rows:
                prefix = [torch.cat(prefix, dim=1) + pre.to(x.dtype)]
        x = torch.cat([*prefix, x], dim=1)
        mask = torch.cat([batch.valid.new_ones(b, s.n_prefix), batch.valid], dim=1)
        return self.norm_pre(self.drop(x)), mask

    # ------------------------------------------------------------------------------- outputs
    def pooled(self, images: Tensor | PatchBatch) -> Tensor:
        """The head's input [B, D]: the tokens pooled (class token, patch mean or attention pooling),
        after the final norm or through ``fc_norm``; of images, or of a :class:`PatchBatch` (its
        padding hidden from attention and from the pool)."""
        if isinstance(images, PatchBatch):
            x, mask = self.embed_patches(images)
            x = self.stack(x, self.stack.context(self.position, x, mask, causal=False, check_length=False))
            return self.fc_norm(self.pool(x, self.spec.n_prefix, padding_mask=mask))
        x, grid = self.embed(images)
        x = self.stack(x, self._context(x, grid))
        return self.fc_norm(self.pool(x, self.spec.n_prefix))

    def forward(self, images: Tensor | PatchBatch) -> Tensor:
        """Logits [B, num_classes] (the pooled features [B, D] without a head) of images [B, C, H, W]
        or of a :class:`PatchBatch`."""
        return self.head(self.pooled(images))  # (B, num_classes)

    def features(self, images: Tensor, layers: int | Sequence[int] | None = None, *, norm: bool = False,
                 grid: bool = True) -> VitFeatures:
        """The outputs of chosen blocks (timm's ``forward_intermediates``): ``layers`` None for every
        block, an int n for the last n, or block indices (negative from the end); blocks after the
        last one chosen are not run. ``norm`` passes each through the final norm (an identity with
        ``fc_norm``); ``grid`` lays the patch tokens out as [B, D, h, w]."""
        n = len(self.stack.blocks)
        take = self._take(n, layers)
        x, (h, w) = self.embed(images)
        ctx = self._context(x, (h, w))
        outs = []
        for i, block in enumerate(self.stack.blocks[: max(take) + 1]):
            x = block(x, ctx.layers[i])
            if i in take:
                outs.append(self.stack.norm(x) if norm else x)
        p = self.spec.n_prefix
        patches = [y[:, p:] for y in outs]
        if grid:
            patches = [y.reshape(y.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous() for y in patches]
        return VitFeatures(layers=sorted(take), patches=patches, prefix=[y[:, :p] for y in outs], grid=(h, w))

    @staticmethod
    def _take(n: int, layers: int | Sequence[int] | None) -> set[int]:
        if layers is None:
            return set(range(n))
        if isinstance(layers, int) and not isinstance(layers, bool):
            if not 0 < layers <= n:
                raise ValueError(f"layers: the last {layers} blocks of {n}; give 1 to {n}, or block indices")
            return set(range(n - layers, n))
        chosen = set()
        for i in layers:
            if not isinstance(i, int) or not -n <= i < n:
                raise ValueError(f"layers: {i!r} is no block index of {n} blocks (0 to {n - 1}, or -{n} to -1)")
            chosen.add(i % n)
        if not chosen:
            raise ValueError("layers: no block chosen; give block indices, a count, or None for every block")
        return chosen


    # ----------------------------------------------------------------------------- costs
    def sequence(self, seq: int) -> int:
        return self.spec.n_tokens

    def example_inputs(self, batch: int, seq: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        size = self.spec.image_size
        return (torch.randn(batch, self.spec.in_channels, size, size, generator=generator),)

    def stacks(self, seq: int) -> list[tuple[Stack, int, int | None]]:
        return [(self.stack, self.spec.n_tokens, None)]

    def flops(self, seq: int) -> int:
        """One image: the patch embedding, the blocks over every token, the pool (attention pooling
        reads every patch) and the head on one vector."""
        s = self.spec
        patches = s.grid[0] * s.grid[1]
        return (self.patch_embed.image_flops(s.image_size) + self.stack.flops(s.n_tokens) + parts.flops(self.pool, patches)
                + parts.flops(self.head, 1))

    def saved(self, seq: int) -> tuple[int, int]:
        """One image: the images, the stem's activations, the pre-norm's output, the blocks, what the
        pool keeps per patch, the pooled vector and the head's input and logits."""
        s = self.spec
        n, patches = s.n_tokens, s.grid[0] * s.grid[1]
        elements, masks = self.stack.saved(n, rotates=self.position.rotates)
        elements += s.in_channels * s.image_size**2 + self.patch_embed.image_saved(s.image_size) + s.pre_norm * n * s.d_model
        elements += s.patch_norm * patches * s.d_model  # the patch norm's input
        elements += s.d_model + parts.saved_per_token(self.head) + patches * parts.saved_per_token(self.pool)
        return elements, masks + (n * s.d_model if s.dropout.embedding else 0)


@register("family", "vit")
def _build(spec: VitSpec) -> VisionTransformer:
    return VisionTransformer(spec)
