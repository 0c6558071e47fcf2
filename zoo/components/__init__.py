"""Interchangeable parts; importing this package registers the built-in builders."""

from zoo.components import (  # noqa: F401
    attention,
    block,
    deltanet,
    disentangled,
    dropout,
    embedding,
    ffn,
    head,
    linear,
    mla,
    moe,
    norm,
    pool,
    position,
    relbias2d,
    rope,
    rope2d,
    stack,
)
from zoo.components.attention import Attention, attention_mask
from zoo.components.block import (
    Block,
    BlockContext,
    LayerScale,
    ParallelBlock,
    PostNormBlock,
    PostSublayerNormBlock,
    PreNormBlock,
    build_norm,
    build_sublayers,
)
from zoo.components.deltanet import GatedDeltaNet
from zoo.components.dropout import Dropout
from zoo.components.embedding import PatchEmbedding, TokenEmbedding
from zoo.components.ffn import MLP, GatedMLP
from zoo.components.head import ClassifierHead, LMHead, MLMHead
from zoo.components.linear import Linear
from zoo.components.mla import LatentAttention
from zoo.components.moe import MoE, load_balancing_loss, router_z_loss
from zoo.components.norm import RMSNorm
from zoo.components.pool import AttentionPool, ClsPool, MeanPool
from zoo.components.position import (
    AlibiPosition,
    LearnedPosition,
    NoPosition,
    Position,
    SinCos2dPosition,
    SinusoidalPosition,
)
from zoo.components.relbias2d import GridRelativeBias
from zoo.components.rope import RotaryPosition
from zoo.components.rope2d import GridRotaryPosition, MixedGridRotaryPosition
from zoo.components.stack import Stack, StackContext

__all__ = [
    "Attention", "attention_mask", "Block", "BlockContext", "build_norm", "build_sublayers", "LayerScale", "PreNormBlock", "PostNormBlock",
    "PostSublayerNormBlock", "ParallelBlock", "Stack", "StackContext", "TokenEmbedding", "PatchEmbedding", "MLP",
    "GatedMLP", "Linear", "Dropout", "RMSNorm", "Position", "NoPosition", "LearnedPosition", "SinusoidalPosition",
    "RotaryPosition", "GridRotaryPosition", "MixedGridRotaryPosition", "GridRelativeBias", "AlibiPosition", "SinCos2dPosition", "ClsPool", "MeanPool", "AttentionPool", "LMHead",
    "MLMHead", "ClassifierHead", "LatentAttention", "MoE", "load_balancing_loss", "router_z_loss", "GatedDeltaNet",
]
