"""Vision Transformer (Dosovitskiy et al. 2021), laid out as timm's VisionTransformer.

    images [B, C, H, W] -> [conv stem ->] patches [B, N, D] -> [class token;] + positions -> blocks -> pool -> logits
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components.block import BlockContext
from zoo.components.dropout import Dropout
from zoo.components.embedding import PatchEmbedding
from zoo.components.linear import Linear
from zoo.models.common import build_part, build_position, build_stack, init_weights
from zoo.registry import register
from zoo.spec import VitSpec


class VisionTransformer(nn.Module):
    """``model(images[B,C,H,W]) -> logits[B,num_classes]``; ``features(images) -> [B, D]`` pooled."""

    is_causal = False

    def __init__(self, spec: VitSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        stem = list(zip(spec.stem.channels, spec.stem.layer_strides)) if spec.stem else []
        self.patch_embed = PatchEmbedding(in_channels=spec.in_channels, dim=d, patch_size=spec.patch_size, stem=stem)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.class_token else None
        self.position = build_position(spec, max_len=spec.n_tokens, grid=spec.grid)
        self.drop = Dropout(spec.dropout.embedding)
        self.stack = build_stack(spec, spec.n_layers, final_norm=spec.has_final_norm and not spec.fc_norm)
        self.fc_norm = build_part("norm", spec.block.norm, dim=d) if spec.fc_norm else nn.Identity()
        self.head = Linear(d, spec.num_classes)
        init_weights(self, spec)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)  # as timm

    def _check(self, images: object) -> None:
        s = self.spec
        want = (s.in_channels, s.image_size, s.image_size)
        if not isinstance(images, Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != want:
            got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(
                f"images: expected a float tensor [batch, {want[0]}, {want[1]}, {want[2]}] (in_channels, image_size), "
                f"got {got}; resize the images or set image_size/in_channels in the spec"
            )

    def features(self, images: Tensor) -> Tensor:
        """Pooled features [B, D]: the class token, or the mean of the patch tokens."""
        self._check(images)
        x = self.patch_embed(images)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)  # (B, 1 + N, D)
        positions = torch.arange(x.shape[1], device=x.device)
        x = self.drop(self.position.add(x, positions))
        x = self.stack(x, BlockContext(pos=self.position, positions=positions))
        prefix = int(self.cls_token is not None)
        pooled = x[:, 0] if self.spec.pool == "cls" else x[:, prefix:].mean(dim=1)
        return self.fc_norm(pooled)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))  # (B, num_classes)


@register("family", "vit")
def _build(spec: VitSpec) -> VisionTransformer:
    return VisionTransformer(spec)
