"""Converters between zoo models and their reference implementations, exact in both directions.

    zoo.interop.timm   from_timm(timm_model) / to_timm(zoo_model)   timm's vision models
    zoo.interop.hf     from_hf(hf_model) / to_hf(zoo_model)         HF transformers' models and their backbones
    zoo.interop.files  convert(src, dst, ...)                       files on disk (the `zoo convert` command)

Each converter builds the zoo spec from the reference's configuration (and the configuration from
the spec), then maps tensors by name. What the target cannot express raises
:class:`ConversionError` (a ValueError) naming the option: a converted model computes what the
original computes, never an approximation. timm and transformers are imported when a converter runs.

The reference classes, from the converters' registries (:mod:`zoo.interop.catalog`;
docs/interop.md's table says what each takes):

"""

from zoo.interop.catalog import listing
from zoo.interop.common import ConversionError
from zoo.interop.files import convert
from zoo.interop.hf import from_hf, hf_config, hf_spec, to_hf
from zoo.interop.timm import from_timm, timm_spec, to_timm

if __doc__:  # None under python -OO
    __doc__ += listing() + "\n"
__all__ = ["ConversionError", "convert", "from_hf", "to_hf", "hf_spec", "hf_config", "from_timm", "to_timm", "timm_spec"]
