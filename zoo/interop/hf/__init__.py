"""Two-way converters between zoo and HF transformers, exact in both directions.

    from_hf(hf_model, architecture=None) -> zoo model   to_hf(zoo_model, architecture=None, **config) -> HF model
    hf_spec(config)   -> zoo spec           hf_config(spec, architecture=None, **config) -> HF config

Each reference class is an :class:`~zoo.interop.hf.base.Architecture` in the registry ``ARCHS``
(:mod:`zoo.interop.hf.convert`), keyed by the transformers class's name, with the spec fields it
claims (:mod:`zoo.interop.claims`). The classes with an LM head come first; then each one's
backbone without its head (HF's ``*Model``: :class:`~zoo.interop.hf.base.Headless`), which
converts to and from a zoo model with ``head: none`` (BERT-like backbones with their pooler:
``pooler: true``). A spec converts by default to the first class that claims its family and head
kind and expresses it; when none does, the error lists each class's reason. Every rotary one
carries RoPE scaling (``rope_parameters`` <-> ``position.scaling``, :mod:`zoo.interop.hf.rope`).
docs/interop.md's table says what each class takes. A multimodal class's text model
(``TEXT_MODELS``: Llama4ForConditionalGeneration's Llama4ForCausalLM) converts when ``from_hf``'s
``architecture`` names it, never by itself (the vision tower would be lost).

The spec is read from the reference's config (and the config written from the spec); tensors are
then mapped by name (:mod:`zoo.interop.common`). Tying is read from the model itself, because HF
decides it from several config fields. Anything the target cannot express raises
:class:`ConversionError` naming the option. transformers is imported only when a converter runs.

The classes, in the order a spec tries them (``ARCHS``):

"""

from zoo.interop.common import name_list
from zoo.interop.hf.convert import ARCHS, TEXT_MODELS, by_model_type, from_hf, hf_config, hf_spec, to_hf
from zoo.interop.hf.marian import permute_model_dim

if __doc__:  # None under python -OO
    __doc__ += name_list(ARCHS) + "\n"
__all__ = ["ARCHS", "TEXT_MODELS", "by_model_type", "from_hf", "hf_config", "hf_spec", "permute_model_dim", "to_hf"]
