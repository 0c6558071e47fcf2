"""zoo: a configurable Transformer architecture zoo.

>>> import zoo
>>> spec = zoo.load_spec("gpt2-small", overrides=["position.kind=rope"])
>>> model = zoo.build(spec)
>>> zoo.registry("position").names()
['alibi', 'learned', 'none', 'relative_bias', 'relative_bias2d', 'relative_embedding', 'rope', 'rope2d', 'rope2d_mixed', 'sincos2d', 'sinusoidal']
"""

from zoo._version import __version__
from zoo.registry import Registry, RegistryError, register, registry
from zoo.spec import SpecError, json_schema, load_spec, parse_spec, preset_names, to_yaml
from zoo.build import build, count_parameters
from zoo.io import load, load_weights, save
from zoo.generate import Generation, generate
from zoo.embed import embed


__all__ = [
    "build", "count_parameters", "embed", "generate", "Generation", "load_spec", "parse_spec", "preset_names", "to_yaml", "json_schema",
    "save", "load", "load_weights",
    "registry", "register", "Registry", "RegistryError", "SpecError", "__version__",
]
