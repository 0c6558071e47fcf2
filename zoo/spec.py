"""Model specs: strict pydantic models, YAML in and out, dotted overrides, presets, JSON Schema.

A spec says everything needed to build a model and nothing else. Specs never import torch, so a
spec can be read, validated and summarised cheaply. Every part with a ``kind`` is looked up in its
registry (:mod:`zoo.registry`), so a part a user registers is as valid in a spec file as a built-in.

Rules: unknown keys are errors; cross-field rules (d_model % n_heads, n_heads % n_kv_heads, even
RoPE head size, image_size % patch_size, ...) are checked with messages that name the field and the
fix; nothing is rewritten behind the user's back (derived sizes are properties).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterable, Literal, Mapping, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)
from pydantic_core import core_schema

from zoo.registry import REGISTRIES, RegistryError, registry, suggest

__all__ = [
    "Spec", "ComponentSpec", "AttentionSpec", "PositionSpec", "FFNSpec", "NormSpec", "FamilySpec",
    "BlockSpec", "DropoutSpec", "InitSpec", "DecoderSpec", "EncoderSpec", "EncoderDecoderSpec",
    "VitSpec", "ConvStemSpec", "SpecError", "load_spec", "parse_spec", "apply_overrides", "preset_names",
    "preset_path", "to_yaml", "json_schema",
]

PRESETS_DIR = Path(__file__).parent / "presets"
Rate = Annotated[float, Field(ge=0.0, lt=1.0)]


class SpecError(ValueError):
    """A spec that cannot be used; the message names each bad field and the fix."""


class Spec(BaseModel):
    """Base of every spec: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ComponentSpec(Spec):
    """A part chosen by ``kind`` from its registry."""

    kind: str


class _Dispatch:
    """Validate a ``{kind: ...}`` mapping with the spec class its registry has for that kind."""

    def __init__(self, part: str, key: str = "kind") -> None:
        self.part, self.key = part, key

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        reg = registry(self.part)

        def validate(value: Any) -> Any:
            if isinstance(value, ComponentSpec):
                value = value.model_dump()
            if not isinstance(value, Mapping):
                raise ValueError(f"expected a mapping such as {{{self.key}: {reg.names()[0]}}}, got {value!r}")
            if self.key not in value:
                raise ValueError(f"missing '{self.key}': one of {', '.join(reg.names())}")
            try:
                cls = reg.spec(value[self.key])
            except RegistryError as e:
                raise ValueError(str(e)) from None
            return cls.model_validate(dict(value))

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v.model_dump(mode="json"), when_used="always"
            ),
        )

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        # Built when asked, so parts registered later appear too.
        reg = registry(self.part)
        members = []
        seen = set()
        for kind in reg.names():
            cls = reg.spec(kind)
            if cls not in seen:
                seen.add(cls)
                members.append(handler(cls.__pydantic_core_schema__))
        return {"oneOf": members, "description": f"a {self.part}, chosen by {self.key}: {', '.join(reg.names())}"}


# ----------------------------------------------------------------------------------------- attention
class AttentionSpec(ComponentSpec):
    """Multi-head attention. ``n_kv_heads`` picks MHA (= n_heads), GQA (a divisor) or MQA (1)."""

    kind: Literal["mha", "gqa", "mqa"] = "mha"
    n_heads: PositiveInt = 8
    n_kv_heads: PositiveInt | None = Field(None, description="key/value heads; default: mha n_heads, mqa 1")
    head_dim: PositiveInt | None = Field(None, description="query/key size per head; default d_model // n_heads")
    v_head_dim: PositiveInt | None = Field(None, description="value size per head; default d_model // n_heads")
    bias: bool = True

    @model_validator(mode="after")
    def _check_heads(self) -> AttentionSpec:
        h, g = self.n_heads, self.n_kv_heads
        if self.kind == "mha" and g not in (None, h):
            raise ValueError(f"kind mha has n_kv_heads == n_heads ({h}), got n_kv_heads={g}; use kind: gqa")
        if self.kind == "mqa" and g not in (None, 1):
            raise ValueError(f"kind mqa has one key/value head, got n_kv_heads={g}; use kind: gqa")
        if self.kind == "gqa" and g is None:
            raise ValueError("kind gqa needs n_kv_heads (a divisor of n_heads)")
        if g is not None and h % g:
            divisors = [d for d in range(1, h + 1) if h % d == 0]
            raise ValueError(f"n_heads ({h}) must be divisible by n_kv_heads ({g}); choose n_kv_heads from {divisors}")
        return self

    @property
    def kv_heads(self) -> int:
        if self.n_kv_heads is not None:
            return self.n_kv_heads
        return 1 if self.kind == "mqa" else self.n_heads

    def qk_size(self, d_model: int) -> int:
        return self.head_dim or d_model // self.n_heads

    def v_size(self, d_model: int) -> int:
        return self.v_head_dim or d_model // self.n_heads


# ----------------------------------------------------------------------------------------- positions
class PositionSpec(ComponentSpec):
    """Where order information enters: added to embeddings, rotating q/k, or biasing scores."""


class NoPositionSpec(PositionSpec):
    kind: Literal["none"] = "none"


class SinusoidalSpec(PositionSpec):
    """The paper's fixed sinusoids, frequencies base^(-2i/D). ``interleaved``: sin/cos alternate (the
    paper's formula); ``concat``: all sines then all cosines (HF Marian). tensor2tensor and fairseq
    also concatenate but space their frequencies as base^(-i/(D/2-1)), a slightly different table."""

    kind: Literal["sinusoidal"] = "sinusoidal"
    base: PositiveFloat = 10000.0
    layout: Literal["interleaved", "concat"] = "interleaved"


class LearnedSpec(PositionSpec):
    kind: Literal["learned"] = "learned"


class RopeSpec(PositionSpec):
    """Rotary embeddings (rotate-half layout, as HF LLaMA)."""

    kind: Literal["rope"] = "rope"
    base: PositiveFloat = 10000.0


class AlibiSpec(PositionSpec):
    kind: Literal["alibi"] = "alibi"


class SinCos2dSpec(PositionSpec):
    """Fixed 2-D sin-cos table over the patch grid (ViT; MAE layout, zero row for the class token)."""

    kind: Literal["sincos2d"] = "sincos2d"
    base: PositiveFloat = 10000.0


# --------------------------------------------------------------------------------------------- FFN
class FFNSpec(ComponentSpec):
    """Position-wise feed-forward network. ``hidden`` defaults per kind (see ``hidden_size``)."""

    hidden: PositiveInt | None = None
    bias: bool = True

    def hidden_size(self, d_model: int) -> int:
        return self.hidden or 4 * d_model


class ReluFFNSpec(FFNSpec):
    kind: Literal["relu"] = "relu"


class GeluFFNSpec(FFNSpec):
    kind: Literal["gelu"] = "gelu"
    approximate: Literal["none", "tanh"] = "none"


class SiluFFNSpec(FFNSpec):
    """Two-layer FFN with SiLU (swish), as Marian's ``activation_function: swish``."""

    kind: Literal["silu"] = "silu"


class GatedFFNSpec(FFNSpec):
    """Gated linear unit FFN. Default hidden: 2/3 of 4 * d_model, rounded up to a multiple of 64,
    which keeps the parameter count of the two-layer FFN it replaces."""

    kind: Literal["swiglu", "geglu"] = "swiglu"

    def hidden_size(self, d_model: int) -> int:
        return self.hidden or 64 * math.ceil(8 * d_model / 3 / 64)


class GeGLUSpec(GatedFFNSpec):
    kind: Literal["geglu"] = "geglu"
    approximate: Literal["none", "tanh"] = "none"


class SwiGLUSpec(GatedFFNSpec):
    kind: Literal["swiglu"] = "swiglu"


# -------------------------------------------------------------------------------------------- norms
class NormSpec(ComponentSpec):
    """Normalisation and where blocks put it: ``post`` (the paper: norm after each residual add) or
    ``pre`` (GPT-2, LLaMA, ViT: norm before each sub-layer, plus a final norm)."""

    placement: Literal["pre", "post"] = "pre"
    eps: PositiveFloat = 1e-5


class LayerNormSpec(NormSpec):
    kind: Literal["layernorm"] = "layernorm"
    bias: bool = True


class RMSNormSpec(NormSpec):
    kind: Literal["rmsnorm"] = "rmsnorm"


Attention = Annotated[ComponentSpec, _Dispatch("attention")]
Position = Annotated[ComponentSpec, _Dispatch("position")]
FFN = Annotated[ComponentSpec, _Dispatch("ffn")]
Norm = Annotated[ComponentSpec, _Dispatch("norm")]


# ------------------------------------------------------------------------------------ shared pieces
class BlockSpec(Spec):
    """One layer: self-attention [+ cross-attention] + FFN, each with a residual and a norm."""

    attention: Attention = Field(default_factory=AttentionSpec)
    cross_attention: Attention | None = Field(None, description="encoder-decoder only; default: as attention")
    ffn: FFN = Field(default_factory=ReluFFNSpec)
    norm: Norm = Field(default_factory=LayerNormSpec)

    @property
    def cross(self) -> AttentionSpec:
        return self.cross_attention or self.attention


class DropoutSpec(Spec):
    """Dropout rates. The paper's P_drop is ``embedding`` (on the embedding + position sum) and
    ``residual`` (on each sub-layer output before the residual add)."""

    embedding: Rate = 0.0
    residual: Rate = 0.0
    attention: Rate = Field(0.0, description="on the attention weights")
    ffn: Rate = Field(0.0, description="on the FFN's hidden activation")


class InitSpec(Spec):
    """Weight initialisation. ``normal``: N(0, std) for linear and embedding weights (GPT-2, BERT);
    ``xavier``: Xavier-uniform linears and N(0, d_model^-1/2) embeddings (the paper, fairseq);
    ``trunc_normal``: N(0, std) truncated at +-2 (timm ViT's ``trunc_normal_(std=.02)``). ``scaled_residual`` divides the std of each
    residual output projection by sqrt(2 * n_layers) (GPT-2)."""

    scheme: Literal["normal", "xavier", "trunc_normal"] = "normal"
    std: PositiveFloat = 0.02
    scaled_residual: bool = False


class EmbeddingSpec(Spec):
    """Token embedding options: ``scale`` multiplies by sqrt(d_model) (the paper); ``norm`` puts a
    norm after the embedding sum (BERT)."""

    scale: bool = False
    norm: bool = False


class FamilySpec(Spec):
    """Fields every model family has."""

    family: str
    name: str | None = Field(None, description="a label; never changes behaviour")
    d_model: PositiveInt = 512
    n_layers: PositiveInt = 6
    block: BlockSpec = Field(default_factory=BlockSpec)
    position: Position = Field(default_factory=SinusoidalSpec)
    dropout: DropoutSpec = Field(default_factory=DropoutSpec)
    init: InitSpec = Field(default_factory=InitSpec)


    @model_validator(mode="after")
    def _check_shared(self) -> FamilySpec:
        d, att = self.d_model, self.block.attention
        problems = []
        for field, spec in (("attention", att), ("cross_attention", self.block.cross_attention)):
            if not isinstance(spec, AttentionSpec):
                continue
            if (spec.head_dim is None or spec.v_head_dim is None) and d % spec.n_heads:
                divisors = [h for h in range(1, min(d, 64) + 1) if d % h == 0]
                problems.append(
                    f"block.{field}.n_heads: d_model ({d}) must be divisible by n_heads ({spec.n_heads}); "
                    f"choose n_heads from {divisors} or set head_dim and v_head_dim"
                )
        if self.position.kind == "rope" and isinstance(att, AttentionSpec) and att.qk_size(d) % 2:
            problems.append(
                f"position.kind: rope rotates pairs of dimensions, so the query/key head size must be even, "
                f"got {att.qk_size(d)} (d_model {d} / n_heads {att.n_heads}); change n_heads or set block.attention.head_dim"
            )
        if self.block.cross_attention is not None and self.family != "encoder_decoder":
            problems.append(
                f"block.cross_attention: family {self.family} has no cross-attention (only encoder_decoder); remove it"
            )
        if self.init.scaled_residual and self.init.scheme == "xavier":
            problems.append("init.scaled_residual: applies to scheme normal or trunc_normal, not xavier; set it to false")
        allowed = self._allowed_positions()
        if self.position.kind not in allowed:
            problems.append(
                f"position.kind: {self.position.kind!r} does not apply to family {self.family}; use one of {', '.join(allowed)}"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    _foreign_positions: ClassVar[frozenset[str]] = frozenset({"sincos2d"})  # built-in kinds that do not apply

    def _allowed_positions(self) -> list[str]:
        return [n for n in registry("position").names() if n not in self._foreign_positions]

    @property
    def norm_placement(self) -> str:
        return getattr(self.block.norm, "placement", "pre")


class TextSpec(FamilySpec):
    vocab_size: PositiveInt = 32000
    max_seq_len: PositiveInt = Field(1024, description="longest sequence; sizes learned and sinusoidal tables")
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec)
    tie_embeddings: bool = Field(True, description="the output projection shares the token embedding")
    head_bias: bool = Field(False, description="a bias on the output projection")


class DecoderSpec(TextSpec):
    """GPT-style decoder-only language model: ``model(tokens[B,T]) -> logits[B,T,V]``."""

    family: Literal["decoder"] = "decoder"
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="normal", std=0.02, scaled_residual=True))


class MLMHeadSpec(Spec):
    """Masked-LM head: optional transform (linear + GELU + norm, as BERT) before the projection."""

    transform: bool = True


class ClassifierSpec(Spec):
    """Sequence classification: pool the first token (optionally through a tanh ``pooler`` linear,
    as BERT), dropout, linear to ``num_labels``."""

    num_labels: PositiveInt = 2
    pooler: bool = True
    dropout: Rate = 0.1


class EncoderSpec(TextSpec):
    """BERT-style bidirectional encoder: ``model(tokens[B,T], padding_mask) -> logits[B,T,V]``."""

    family: Literal["encoder"] = "encoder"
    type_vocab_size: NonNegativeInt = Field(0, description="segment (token type) embeddings; 0 for none")
    mlm_head: MLMHeadSpec = Field(default_factory=MLMHeadSpec)
    head_bias: bool = True
    classifier: ClassifierSpec | None = None


class EncoderDecoderSpec(TextSpec):
    """The original Transformer: ``model(src[B,S], tgt_in[B,T], masks) -> logits[B,T,V]``."""

    family: Literal["encoder_decoder"] = "encoder_decoder"
    n_encoder_layers: PositiveInt | None = Field(None, description="default: n_layers")
    n_decoder_layers: PositiveInt | None = Field(None, description="default: n_layers")
    src_vocab_size: PositiveInt | None = Field(None, description="default: vocab_size (a shared vocabulary)")
    share_embeddings: bool = Field(True, description="source and target embeddings are one matrix")
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="xavier"))

    @model_validator(mode="after")
    def _check_sharing(self) -> EncoderDecoderSpec:
        if self.share_embeddings and self.src_vocab_size not in (None, self.vocab_size):
            raise ValueError(
                f"share_embeddings: source and target embeddings can only be shared with one vocabulary, "
                f"but src_vocab_size ({self.src_vocab_size}) != vocab_size ({self.vocab_size}); "
                f"set share_embeddings: false or make the sizes equal"
            )
        return self

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def source_vocab_size(self) -> int:
        return self.src_vocab_size or self.vocab_size


class ConvStemSpec(Spec):
    """Convolutions before the patch projection (Xiao et al. 2021, "Early convolutions help
    transformers see better"; timm's hybrid ViTs): one 3x3 conv + BatchNorm + ReLU layer per entry of
    ``channels``, with the matching ``strides`` (default 1). The patch projection then takes
    ``patch_size / prod(strides)`` pixels of the stem's output, so the token grid is unchanged:
    ViTC's ImageNet stem is ``channels: [48, 96, 192, 384], strides: [2, 2, 2, 2]`` with patch 16
    (a 1x1 projection); on small images, stride-1 layers add overlapping local features at a few
    percent of the FLOPs."""

    channels: list[PositiveInt] = Field(min_length=1, description="output channels of each 3x3 conv layer")
    strides: list[PositiveInt] | None = Field(None, description="one per layer; default all 1")

    @property
    def layer_strides(self) -> list[int]:
        return self.strides or [1] * len(self.channels)

    @property
    def stride(self) -> int:
        return math.prod(self.layer_strides)


class VitSpec(FamilySpec):
    """Vision Transformer: ``model(images[B,C,H,W]) -> logits[B,num_classes]``."""

    family: Literal["vit"] = "vit"
    image_size: PositiveInt = 224
    patch_size: PositiveInt = 16
    in_channels: PositiveInt = 3
    num_classes: PositiveInt = 1000
    class_token: bool = True
    pool: Literal["cls", "mean"] = "cls"
    fc_norm: bool = Field(False, description="norm after pooling instead of before (timm's fc_norm)")
    stem: ConvStemSpec | None = Field(None, description="convolutions before the patch projection; null: none (the plain ViT)")
    position: Position = Field(default_factory=LearnedSpec)
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="trunc_normal"))

    @model_validator(mode="after")
    def _check_vit(self) -> VitSpec:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size ({self.image_size}) must be divisible by patch_size ({self.patch_size}); "
                f"e.g. patch_size one of {[p for p in range(2, 33) if self.image_size % p == 0]}"
            )
        if self.position.kind == "sincos2d" and self.d_model % 4:
            raise ValueError(f"position.kind: sincos2d splits d_model in four (row/column x sin/cos); d_model ({self.d_model}) must be divisible by 4")
        if self.pool == "cls" and not self.class_token:
            raise ValueError("pool: cls needs class_token: true; set class_token: true or pool: mean")
        if self.stem is not None:
            stem = self.stem
            if stem.strides is not None and len(stem.strides) != len(stem.channels):
                raise ValueError(
                    f"stem.strides: one stride per conv layer, got {len(stem.strides)} strides for "
                    f"{len(stem.channels)} channels; give {len(stem.channels)} strides or leave strides out (all 1)"
                )
            if self.patch_size % stem.stride:
                raise ValueError(
                    f"stem.strides: their product ({stem.stride}) must divide patch_size ({self.patch_size}), "
                    f"so the patch projection covers whole stem pixels; use strides whose product divides {self.patch_size}"
                )
        return self

    _foreign_positions: ClassVar[frozenset[str]] = frozenset({"sinusoidal", "rope", "alibi"})  # 1-D text positions

    @property
    def grid(self) -> tuple[int, int]:
        n = self.image_size // self.patch_size
        return (n, n)

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1] + int(self.class_token)


ModelSpec = Annotated[FamilySpec, _Dispatch("family", key="family")]

for _part, _base, _members in (
    ("attention", AttentionSpec, {"mha": AttentionSpec, "gqa": AttentionSpec, "mqa": AttentionSpec}),
    ("position", PositionSpec, {"none": NoPositionSpec, "sinusoidal": SinusoidalSpec, "learned": LearnedSpec,
                                "rope": RopeSpec, "alibi": AlibiSpec, "sincos2d": SinCos2dSpec}),
    ("ffn", FFNSpec, {"relu": ReluFFNSpec, "gelu": GeluFFNSpec, "silu": SiluFFNSpec, "swiglu": SwiGLUSpec, "geglu": GeGLUSpec}),
    ("norm", NormSpec, {"layernorm": LayerNormSpec, "rmsnorm": RMSNormSpec}),
    ("family", FamilySpec, {"decoder": DecoderSpec, "encoder": EncoderSpec,
                            "encoder_decoder": EncoderDecoderSpec, "vit": VitSpec}),
):
    REGISTRIES[_part].spec_base = _base
    for _kind, _cls in _members.items():
        REGISTRIES[_part].add_spec(_kind, _cls)


# ----------------------------------------------------------------------------------- errors, YAML
def _format_errors(err: ValidationError, source: str) -> SpecError:
    lines = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key (got {e['input']!r}); remove it or check its spelling"
        elif e["type"] not in ("value_error", "assertion_error", "missing"):
            msg = f"{msg} (got {e['input']!r})"
        lines.extend(f"  {loc}: {line}" if loc else f"  {line}" for line in msg.split("\n"))
    n = len(lines)
    return SpecError(f"invalid spec {source} ({n} problem{'s' if n > 1 else ''}):\n" + "\n".join(lines))


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the strict safe loader; errors name the source and line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise SpecError(f"cannot parse {source} as YAML: {e}") from None


def preset_names() -> list[str]:
    """The shipped presets, by name."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        names = preset_names()
        raise SpecError(
            f"unknown preset {name!r}{suggest(name, names)} (presets: {', '.join(names)}; "
            f"or give the path of a YAML file)"
        )
    return path


def _read_source(source: str | Path) -> tuple[dict, str]:
    text_source = str(source)
    path = Path(source)
    looks_like_path = path.suffix in (".yaml", ".yml") or "/" in text_source or path.is_file()
    if not looks_like_path:
        path = preset_path(text_source)
        label = f"preset {text_source!r}"
    else:
        label = f"file {text_source!r}"
        if not path.is_file():
            raise SpecError(f"no spec file at {text_source!r} (and it is not a preset: {', '.join(preset_names())})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read {label}: {e}") from None
    data = read_yaml(text, label)
    if not isinstance(data, dict):
        raise SpecError(f"{label} must hold a mapping of spec fields (family: ..., d_model: ...), got {type(data).__name__}")
    return data, label


# ------------------------------------------------------------------------------------- overrides
def _registry_at(data: dict, path: list[str]) -> str | None:
    """The registry whose ``kind`` the mapping at ``path`` chooses, found by walking the spec classes."""
    try:
        cls: Any = registry("family").spec(data.get("family"))
    except RegistryError:
        return None
    for i, key in enumerate(path):
        field = getattr(cls, "model_fields", {}).get(key)
        if field is None:
            return None
        dispatch = next((m for m in field.metadata if isinstance(m, _Dispatch)), None)
        if dispatch is None and field.annotation is not None:
            meta = getattr(field.annotation, "__metadata__", ())
            for arg in getattr(field.annotation, "__args__", ()):
                meta = meta + getattr(arg, "__metadata__", ())
            dispatch = next((m for m in meta if isinstance(m, _Dispatch)), None)
        if i == len(path) - 1:
            return dispatch.part if dispatch else None
        if dispatch is not None:
            sub = _get(data, path[: i + 1])
            try:
                cls = registry(dispatch.part).spec(sub.get("kind"))
            except (RegistryError, AttributeError):
                return None
        else:
            ann = field.annotation
            cls = next((a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and issubclass(a, Spec)), None)
            if cls is None:
                return None
    return None


def _get(data: dict, path: list[str]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a spec mapping (values parsed as YAML: 4, 0.1, true, null).

    Setting a ``kind`` keeps only the sibling keys the new kind's spec knows, so
    ``position.kind=rope`` on a sinusoidal preset drops ``layout`` instead of failing on it.
    """
    data = json.loads(json.dumps(data))  # a deep copy of plain data
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise SpecError(f"override {item!r} must look like key.path=value, e.g. block.attention.n_heads=8")
        key, raw = item.split("=", 1)
        path = [p.strip() for p in key.strip().split(".")]
        if not all(path):
            raise SpecError(f"override {item!r}: empty key in {key!r}")
        value = read_yaml(raw, f"the value of override {item!r}") if raw.strip() else ""
        node = data
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise SpecError(f"override {item!r}: {where} is {child!r}, not a mapping with fields")
            node = child
        node[path[-1]] = value
        if path[-1] == "kind":
            part = _registry_at(data, path[:-1])
            if part and value in registry(part):
                known = registry(part).spec(value).model_fields
                for k in [k for k in node if k not in known]:
                    del node[k]
    return data


# ------------------------------------------------------------------------------------ public API
def parse_spec(data: Mapping[str, Any] | FamilySpec, *, source: str = "") -> FamilySpec:
    """Validate a mapping as a model spec (any registered family)."""
    if isinstance(data, FamilySpec):
        return data
    if not isinstance(data, Mapping):
        raise SpecError(f"a spec must be a mapping, got {type(data).__name__}")
    if "family" not in data:
        raise SpecError(f"spec {source}: missing 'family' (one of {', '.join(registry('family').names())})")
    try:
        cls = registry("family").spec(data["family"])
    except RegistryError as e:
        raise SpecError(f"spec {source}: family: {e}") from None
    try:
        return cls.model_validate(dict(data))
    except ValidationError as e:
        raise _format_errors(e, source or "") from None


def load_spec(
    source: str | Path | Mapping[str, Any] | FamilySpec, overrides: Iterable[str] = ()
) -> FamilySpec:
    """A validated spec from a preset name, a YAML file path, a mapping or a spec, plus overrides.

    >>> load_spec("gpt2-small", overrides=["position.kind=rope", "block.ffn.kind=swiglu"])
    """
    overrides = list(overrides)
    if isinstance(source, FamilySpec):
        data, label = source.model_dump(mode="json"), f"{source.name or source.family!r}"
    elif isinstance(source, Mapping):
        data, label = dict(source), "mapping"
    else:
        data, label = _read_source(source)
    if overrides:
        data = apply_overrides(data, overrides)
        label = f"{label} with overrides {overrides}"
    return parse_spec(data, source=label)


def to_yaml(spec: FamilySpec) -> str:
    """The spec as YAML, every field spelled out (defaults included), readable by load_spec."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def json_schema() -> dict:
    """JSON Schema of spec files (any family), for editor completion and validation."""

    class SpecFile(BaseModel):
        spec: ModelSpec

    schema = SpecFile.model_json_schema()
    body = schema["properties"]["spec"]
    body["$defs"] = schema.get("$defs", {})
    body["title"] = "zoo model spec"
    return body
