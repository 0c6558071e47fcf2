"""Model specs: strict pydantic models, YAML in and out, dotted overrides, presets, JSON Schema.

A spec says everything needed to build a model and nothing else. Specs never import torch, so a
spec can be read, validated and summarised cheaply. Every part with a ``kind`` is looked up in its
registry (:mod:`zoo.registry`), so a part a user registers is as valid in a spec file as a built-in.

Rules: unknown keys are errors; cross-field rules (d_model % n_heads, n_heads % n_kv_heads, even
RoPE head size, image_size % patch_size, ...) are checked with messages that name the field and the
fix; nothing is rewritten behind the user's back (derived sizes are properties).

    zoo.spec.base       Spec, ComponentSpec, and the dispatch of a part's spec by its registered kind
    zoo.spec.attention  attention (mha, gqa, mqa), its qk-norm and temperature
    zoo.spec.parts      the specs of FFNs, norms, heads and ViT pools, attention's and positions' re-exported
    zoo.spec.pooling    a text sequence's pools (eos, last) and the pooled vector's projection
    zoo.spec.mla        multi-head latent attention (attention.kind: mla): q/kv latents, a decoupled rotary key
    zoo.spec.deltanet   gated DeltaNet linear attention (attention.kind: gated_deltanet): a recurrent state
    zoo.spec.disentangled  DeBERTa's disentangled attention (attention.kind: disentangled) and its relative table
    zoo.spec.moe        the mixture-of-experts FFN (ffn.kind: moe): experts, router, shared expert
    zoo.spec.rope       the scalings of RoPE's frequencies (linear, dynamic, llama3, yarn, longrope)
    zoo.spec.blocks     the block kinds (pre, post, post_sublayer, parallel, sandwich) and per-layer patterns
    zoo.spec.families   FamilySpec and the four families: decoder, encoder, encoder_decoder, vit
    zoo.spec.migrate    0.1's field names (norm.placement, head options) read as today's, with a note
    zoo.spec.load       YAML files, presets, dotted overrides, validation errors (SpecError), JSON Schema
"""

from zoo.spec.base import ComponentSpec, Dispatch, Kinds, Rate, Spec
from zoo.spec.blocks import (
    AnyBlock,
    BlockSpec,
    Layer,
    LayerPattern,
    ParallelBlockSpec,
    PostBlockSpec,
    PostSublayerBlockSpec,
    PreBlockSpec,
    SandwichBlockSpec,
    select_layers,
)
from zoo.spec.families import (
    ClassifierSpec,
    ConvStemSpec,
    DecoderSpec,
    DropoutSpec,
    EmbeddingSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    FamilySpec,
    InitSpec,
    ModelSpec,
    TextSpec,
    VitSpec,
)
from zoo.spec.disentangled import DisentangledSpec, RelativeEmbeddingSpec
from zoo.spec.load import (
    PRESETS_DIR,
    SpecError,
    apply_overrides,
    json_schema,
    load_spec,
    parse_spec,
    preset_names,
    preset_path,
    read_yaml,
    to_yaml,
)
from zoo.spec.migrate import SpecNote
from zoo.spec.mla import MLASpec
from zoo.spec.deltanet import GatedDeltaNetSpec
from zoo.spec.moe import MoERouterSpec, MoESpec
from zoo.spec.parts import (
    AlibiSpec,
    AnyAttention,
    AnyFFN,
    AnyHead,
    AnyNorm,
    AnyPool,
    AnyPosition,
    AttentionSpec,
    ClsPoolSpec,
    FFNBaseSpec,
    FFNSpec,
    GatedFFNSpec,
    GeGLUSpec,
    GeluFFNSpec,
    HeadSpec,
    LayerNormSpec,
    LearnedSpec,
    LinearHeadSpec,
    LMHeadSpec,
    MapPoolSpec,
    MeanPoolSpec,
    MLMHeadSpec,
    NoHeadSpec,
    NoPositionSpec,
    NormSpec,
    PoolSpec,
    PositionSpec,
    QKNormSpec,
    QuickGeluFFNSpec,
    RelativeBias2dSpec,
    RelativeBiasSpec,
    Relu2FFNSpec,
    ReluFFNSpec,
    RMSNormSpec,
    Rope2dMixedSpec,
    Rope2dSpec,
    RopeSpec,
    SiluFFNSpec,
    SinCos2dSpec,
    SinusoidalSpec,
    SwiGLUSpec,
)
from zoo.spec.pooling import EosPoolSpec, LastPoolSpec, ProjectionSpec
from zoo.spec.rope import (
    AnyRopeScaling,
    DynamicScalingSpec,
    LinearScalingSpec,
    Llama3ScalingSpec,
    LongRopeScalingSpec,
    RopeScalingSpec,
    YarnScalingSpec,
)

__all__ = [
    "PRESETS_DIR", "AlibiSpec", "AnyAttention", "AnyBlock", "AnyFFN", "AnyHead", "AnyNorm", "AnyPool", "AnyPosition",
    "AnyRopeScaling", "AttentionSpec", "BlockSpec", "ClassifierSpec", "ClsPoolSpec", "ComponentSpec", "ConvStemSpec",
    "DecoderSpec", "Dispatch", "DropoutSpec", "DynamicScalingSpec", "EmbeddingSpec", "EncoderDecoderSpec",
    "EncoderSpec", "FFNBaseSpec", "FFNSpec", "FamilySpec", "GatedFFNSpec", "GeGLUSpec", "GeluFFNSpec", "HeadSpec", "InitSpec", "Kinds",
    "LMHeadSpec", "Layer", "LayerNormSpec", "LayerPattern", "LearnedSpec", "LinearHeadSpec", "LinearScalingSpec",
    "Llama3ScalingSpec", "LongRopeScalingSpec", "DisentangledSpec", "MLASpec", "RelativeEmbeddingSpec", "MLMHeadSpec", "MapPoolSpec", "MeanPoolSpec", "MoERouterSpec", "MoESpec", "ModelSpec", "NoHeadSpec",
    "NoPositionSpec", "NormSpec", "ParallelBlockSpec", "PoolSpec", "PositionSpec", "PostBlockSpec",
    "PostSublayerBlockSpec", "PreBlockSpec", "QKNormSpec", "QuickGeluFFNSpec", "RMSNormSpec", "Rate", "RelativeBias2dSpec", "RelativeBiasSpec", "Relu2FFNSpec", "ReluFFNSpec",
    "Rope2dMixedSpec", "Rope2dSpec", "RopeScalingSpec", "RopeSpec", "SandwichBlockSpec", "SiluFFNSpec", "SinCos2dSpec", "SinusoidalSpec", "Spec", "SpecError", "SpecNote", "SwiGLUSpec",
    "TextSpec", "VitSpec", "YarnScalingSpec", "apply_overrides", "json_schema", "load_spec", "parse_spec",
    "preset_names", "preset_path", "read_yaml", "select_layers", "to_yaml",
]
__all__ += ["EosPoolSpec", "LastPoolSpec", "ProjectionSpec"]
__all__ += ["GatedDeltaNetSpec"]
