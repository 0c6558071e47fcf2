"""Model specs: strict pydantic models, YAML in and out, dotted overrides, presets, JSON Schema.

A spec says everything needed to build a model and nothing else. Specs never import torch, so a
spec can be read, validated and summarised cheaply. Every part with a ``kind`` is looked up in its
registry (:mod:`zoo.registry`), so a part a user registers is as valid in a spec file as a built-in.

Rules: unknown keys are errors; cross-field rules (d_model % n_heads, n_heads % n_kv_heads, even
RoPE head size, image_size % patch_size, ...) are checked with messages that name the field and the
fix; nothing is rewritten behind the user's back (derived sizes are properties).

    zoo.spec.base       Spec, ComponentSpec, and the dispatch of a part's spec by its registered kind
    zoo.spec.parts      the specs of attention, positions, FFNs and norms
    zoo.spec.families   FamilySpec and the four families: decoder, encoder, encoder_decoder, vit
    zoo.spec.load       YAML files, presets, dotted overrides, validation errors (SpecError), JSON Schema
"""

from zoo.spec.base import ComponentSpec, Dispatch, Rate, Spec
from zoo.spec.families import (
    BlockSpec,
    ClassifierSpec,
    ConvStemSpec,
    DecoderSpec,
    DropoutSpec,
    EmbeddingSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    FamilySpec,
    InitSpec,
    MLMHeadSpec,
    ModelSpec,
    ParallelSpec,
    TextSpec,
    VitSpec,
)
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
from zoo.spec.parts import (
    FFN,
    AlibiSpec,
    Attention,
    AttentionSpec,
    ClsPoolSpec,
    FFNSpec,
    GatedFFNSpec,
    GeGLUSpec,
    GeluFFNSpec,
    LayerNormSpec,
    LearnedSpec,
    MapPoolSpec,
    MeanPoolSpec,
    NoPositionSpec,
    Norm,
    NormSpec,
    Pool,
    PoolSpec,
    Position,
    PositionSpec,
    QKNormSpec,
    ReluFFNSpec,
    RMSNormSpec,
    RopeSpec,
    SiluFFNSpec,
    SinCos2dSpec,
    SinusoidalSpec,
    SwiGLUSpec,
)

__all__ = [
    "FFN", "PRESETS_DIR", "AlibiSpec", "Attention", "AttentionSpec", "BlockSpec", "ClassifierSpec", "ClsPoolSpec",
    "ComponentSpec", "ConvStemSpec", "DecoderSpec", "Dispatch", "DropoutSpec", "EmbeddingSpec",
    "EncoderDecoderSpec", "EncoderSpec", "FFNSpec", "FamilySpec", "GatedFFNSpec", "GeGLUSpec", "GeluFFNSpec",
    "InitSpec", "LayerNormSpec", "LearnedSpec", "MLMHeadSpec", "MapPoolSpec", "MeanPoolSpec", "ModelSpec",
    "NoPositionSpec", "Norm", "NormSpec", "ParallelSpec", "Pool", "PoolSpec", "Position", "PositionSpec", "QKNormSpec",
    "RMSNormSpec", "Rate", "ReluFFNSpec", "RopeSpec", "SiluFFNSpec", "SinCos2dSpec",
    "SinusoidalSpec", "Spec", "SpecError", "SwiGLUSpec", "TextSpec", "VitSpec", "apply_overrides", "json_schema",
    "load_spec", "parse_spec", "preset_names", "preset_path", "read_yaml", "to_yaml",
]
