"""The HF converters' entry points: the architectures by name, and the two directions."""

from __future__ import annotations

from typing import Any

from torch import nn

from zoo.build import build
from zoo.interop.claims import claims_family, claims_value
from zoo.interop.common import (
    ConversionError,
    check_covered,
    check_used,
    device_dtype,
    first_expressing,
    load_exact,
    reference_state,
    zoo_state,
)
from zoo.interop.hf.bart import Bart, MBart
from zoo.interop.hf.base import Architecture
from zoo.interop.hf.bert import Bert, BertClassifier
from zoo.interop.hf.cohere import Cohere
from zoo.interop.hf.distilbert import DistilBert, DistilBertClassifier
from zoo.interop.hf.gemma import Gemma
from zoo.interop.hf.gemma2 import Gemma2
from zoo.interop.hf.gemma3 import Gemma3
from zoo.interop.hf.gpt2 import GPT2
from zoo.interop.hf.gpt_oss import GptOss
from zoo.interop.hf.gpt_neox import GPTNeoX
from zoo.interop.hf.granite import Granite
from zoo.interop.hf.llama import Llama
from zoo.interop.hf.marian import Marian
from zoo.interop.hf.mistral import Mistral
from zoo.interop.hf.mixtral import Mixtral
from zoo.interop.hf.modernbert import ModernBert, ModernBertClassifier
from zoo.interop.hf.nemotron import Nemotron
from zoo.interop.hf.olmo import Olmo
from zoo.interop.hf.olmo2 import Olmo2
from zoo.interop.hf.olmoe import Olmoe
from zoo.interop.hf.phi3 import Phi3
from zoo.interop.hf.qwen2 import Qwen2
from zoo.interop.hf.qwen3 import Qwen3
from zoo.interop.hf.qwen_moe import Qwen2Moe, Qwen3Moe
from zoo.interop.hf.smollm3 import SmolLM3
from zoo.interop.hf.llama4 import Llama4
from zoo.interop.hf.stablelm import StableLm
from zoo.interop.hf.t5 import T5
from zoo.interop.hf.roberta import Roberta, RobertaClassifier, XLMRoberta, XLMRobertaClassifier
from zoo.interop.hf.electra import Electra, ElectraClassifier
from zoo.interop.hf.albert import Albert, AlbertClassifier
from zoo.interop.hf.mpnet import MPNet, MPNetClassifier
from zoo.interop.hf.clip import ClipText, ClipTextProjection, Siglip2Text, SiglipText
from zoo.interop.hf.m2m100 import M2M100
from zoo.interop.hf.deepseek import DeepseekV2, DeepseekV3
from zoo.interop.hf.deberta_v2 import DebertaV2, DebertaV2Classifier
from zoo.interop.hf.qwen3_next import Qwen3Next
from zoo.spec import FamilySpec, parse_spec

__all__ = ["ARCHS", "TEXT_MODELS", "arch_for_spec", "by_model_type", "from_hf", "hf_config", "hf_spec", "to_hf"]

# A spec converts by default to the first of these that expresses it: the classes with heads, then
# the backbones of those that have one (GPT2Model, LlamaModel, ...), which take the specs with head: none
_WITH_HEADS = (GPT2, Bert, Llama, Marian, Bart, MBart, Mistral, Qwen2, GPTNeoX, Olmo2, Gemma, Qwen3, Phi3, Gemma2, Gemma3,
               Mixtral, Qwen2Moe, Qwen3Moe, Olmoe, StableLm, Granite, Cohere, SmolLM3, T5, Roberta, XLMRoberta, DistilBert,
               ModernBert, Olmo, Nemotron)
_WITH_HEADS += (Electra, Albert, MPNet, M2M100, GptOss, DeepseekV3, Llama4, DebertaV2, Qwen3Next)
_WITH_HEADS += (DeepseekV2,)
_CLASSIFIERS = (DebertaV2Classifier, BertClassifier, RobertaClassifier, XLMRobertaClassifier, ElectraClassifier,
                DistilBertClassifier, AlbertClassifier, MPNetClassifier, ModernBertClassifier)  # *ForSequenceClassification: head none, a classifier
_TOWERS = (ClipText, ClipTextProjection, SiglipText, Siglip2Text)  # text towers: head none, a pooled output
_ALL = (*_WITH_HEADS, *_CLASSIFIERS, *_TOWERS, *(a.headless() for a in _WITH_HEADS if a.base is not None))
ARCHS: dict[str, type[Architecture]] = {a.name: a for a in _ALL}
if len(ARCHS) != len(_ALL):  # a converter bug: a subclass must set its own name and base
    raise TypeError(f"two converters name one HF class among {[a.name for a in _ALL]}")
# multimodal classes whose text model converts when asked for by name (architecture=): the class ->
# (its model_type, the text model's class, its attribute, which is also its checkpoint names' prefix)
TEXT_MODELS = {"Llama4ForConditionalGeneration": ("llama4", Llama4.name, "language_model")}


def by_model_type(model_type: str | None, architectures: list[str] | None = None) -> type[Architecture] | None:
    """The architecture whose HF ``model_type`` (gpt2, bert, llama, marian, bart, mbart, mistral, qwen2, gpt_neox,
    olmo2, gemma, qwen3, phi3, gemma2, gemma3_text, mixtral, qwen2_moe, qwen3_moe, olmoe, stablelm, granite, cohere,
    smollm3, t5, roberta, xlm-roberta, distilbert, modernbert, olmo, nemotron, electra, albert, mpnet, clip_text_model,
    siglip_text_model, siglip2_text_model, m2m_100, gpt_oss, deepseek_v3, llama4_text,
    deberta-v2, qwen3_next, deepseek_v2) is ``model_type``:
    the one of a class named in ``architectures`` (a config's: ``["LlamaModel"]``) where there is one, else the first
    (the class with the head), or None."""
    of_type = [a for a in ARCHS.values() if a.model_type == model_type]
    named = [a for a in of_type if a.name in (architectures or ())]
    return (named or of_type or [None])[0]


def _text_model(hf_model: nn.Module, architecture: str | None) -> nn.Module:
    """``hf_model``, or the text model of a multimodal one where ``architecture`` names its class."""
    name = type(hf_model).__name__
    if name in TEXT_MODELS:
        _, text, attribute = TEXT_MODELS[name]
        if architecture != text:
            raise ConversionError(f"from_hf: {name} holds a vision tower and a projector, which zoo does not convert; "
                                  f"architecture={text!r} converts its text model ({attribute}) alone")
        return getattr(hf_model, attribute)
    if architecture not in (None, name):
        raise ConversionError(f"from_hf: architecture={architecture!r} does not read a {name}; leave it out")
    return hf_model


def _refuse_quantized(hf_model: nn.Module) -> None:
    """Refuse a model whose weights transformers holds quantized (packed, with scales) in memory."""
    if getattr(hf_model, "is_quantized", False) or getattr(hf_model.config, "_is_quantized", False):
        method = getattr(getattr(hf_model.config, "quantization_config", None), "quant_method", "quantized")
        raise ConversionError(f"from_hf: this {type(hf_model).__name__}'s weights are quantized in memory "
                              f"({getattr(method, 'value', method)}); load it dequantized (gpt-oss: "
                              f"quantization_config=Mxfp4Config(dequantize=True)), or convert its folder with zoo.interop.convert")


def _arch_of_model(hf_model: nn.Module) -> type[Architecture]:
    name = type(hf_model).__name__
    if name not in ARCHS:
        raise ConversionError(f"from_hf: {name} does not convert; supported: {', '.join(ARCHS)}")
    return ARCHS[name]


def arch_for_spec(spec: FamilySpec, architecture: str | None) -> type[Architecture]:
    if architecture is not None:
        if architecture not in ARCHS:
            raise ConversionError(f"to_hf: unknown architecture {architecture!r}; choose from {', '.join(ARCHS)}")
        return ARCHS[architecture]
    family = [a for a in ARCHS.values() if claims_family(a.claims, spec.family)]
    if not family:
        raise ConversionError(f"to_hf: family {spec.family!r} has no HF counterpart here (a vit converts with "
                              f"zoo.interop.timm.to_timm)")
    candidates = [a for a in family if claims_value(a.claims, "head.kind", spec.head.kind)] or family  # else the reasons
    return first_expressing(candidates, lambda arch: arch.express(spec, {}),
                            f"to_hf: no HF architecture expresses this {spec.family} (pass architecture= to pick one)")


def hf_spec(config: Any) -> FamilySpec:
    """The zoo spec of the model an HF config describes (its ``model_type`` and ``architectures``: see
    :func:`by_model_type`; a backbone such as ``LlamaModel`` reads as ``head: none``). Tying follows
    the config; :func:`from_hf` reads it from the model instead."""
    arch = by_model_type(getattr(config, "model_type", None), getattr(config, "architectures", None))
    multimodal = [name for name, (model_type, _, _) in TEXT_MODELS.items() if model_type == getattr(config, "model_type", None)]
    if multimodal:
        raise ConversionError(f"hf_spec: a {multimodal[0]} config holds a vision tower's too, which zoo does not convert; "
                              f"hf_spec(config.text_config) gives its text model's spec")
    if arch is None:
        types = ", ".join(dict.fromkeys(a.model_type for a in ARCHS.values()))
        raise ConversionError(f"hf_spec: model_type {getattr(config, 'model_type', None)!r} does not convert; supported: {types}")
    return parse_spec(arch.spec(config, None), source=f"from {arch.name} config")


def hf_config(spec: FamilySpec, architecture: str | None = None, **config: Any):
    """The HF config of ``spec`` for ``architecture`` (default: by family), naming it in
    ``architectures``. ``config`` adds fields the spec does not decide (token ids, generation
    settings); fields the spec decides are refused."""
    import transformers

    arch = arch_for_spec(spec, architecture)
    fields = arch.express(spec, config)
    clash = sorted(set(config) & set(fields) - {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"})
    if clash:
        raise ConversionError(f"to_hf: {', '.join(clash)} follow from the zoo spec; change the spec instead")
    return getattr(transformers, arch.config_name)(**{"architectures": [arch.name], **fields, **config})


def from_hf(hf_model: nn.Module, architecture: str | None = None) -> nn.Module:
    """A zoo model computing what ``hf_model`` computes: its spec from the config, its tensors copied.
    A multimodal model (:data:`TEXT_MODELS`: Llama4ForConditionalGeneration) is refused unless
    ``architecture`` names its text model's class (Llama4ForCausalLM): then that alone converts, as
    ``from_hf(hf_model.language_model)`` does, and its vision tower and projector are left out."""
    _refuse_quantized(hf_model)
    hf_model = _text_model(hf_model, architecture)
    arch = _arch_of_model(hf_model)
    where = f"{arch.name} -> zoo"
    spec = parse_spec(arch.spec(hf_model.config, hf_model), source=f"from {arch.name}")
    arch.check_claims(spec, where)  # what it reads it can write back
    device, dtype = device_dtype(hf_model)
    model = build(spec, device=device, dtype=dtype)
    ref = arch.prepare_from(hf_model.state_dict(), spec)
    rules = arch.rules(spec)
    handled = arch.check_from(hf_model, spec, ref)
    check_covered(ref, rules, where, handled=handled)
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    load_exact(model, zoo_state(ref, rules, shapes, where), where)
    return model.train(hf_model.training)


def to_hf(zoo_model: nn.Module, architecture: str | None = None, **config: Any) -> nn.Module:
    """The HF model computing what ``zoo_model`` computes (see :func:`hf_config` for ``config``)."""
    import transformers

    spec = zoo_model.spec
    arch = arch_for_spec(spec, architecture)
    where = f"zoo -> {arch.name}"
    device, dtype = device_dtype(zoo_model)
    hf_model = getattr(transformers, arch.name)(hf_config(spec, arch.name, **config), **arch.init_kwargs(spec)).to(device=device, dtype=dtype)
    arch.made(hf_model, spec)
    state = arch.prepare_to(zoo_model.state_dict(), spec)
    shapes = {name: t.shape for name, t in hf_model.state_dict().items()}
    rules = arch.rules(spec)
    check_used(state, rules, where)
    out = reference_state(state, rules, shapes, where)
    out.update(arch.extra_to(state, spec, shapes))
    load_exact(hf_model, out, where)
    return hf_model.train(zoo_model.training)
