"""Two-way converters between zoo's ViT and timm's vision models, exact in both directions.

    from_timm(timm_model) -> zoo model        to_timm(zoo_model, architecture=None) -> timm model
    timm_spec(timm_model) -> zoo spec         timm_architecture(spec) -> the class to_timm writes

Each timm class is an :class:`~zoo.interop.timm.base.Architecture` (:mod:`zoo.interop.timm.vit`,
:mod:`zoo.interop.timm.eva`, :mod:`zoo.interop.timm.beit`, :mod:`zoo.interop.timm.naflex`) in the
registry ``ARCHS`` (:mod:`zoo.interop.timm.convert`), keyed by the timm class's name. ``from_timm`` converts a model of any of them; ``to_timm`` writes the first
class whose claims (:mod:`zoo.interop.claims`) and checks express the spec, or the one
``architecture`` names, and when none does, the error lists each class's reason. timm keeps few
options as attributes, so the spec is read from the modules themselves; any module zoo has no
counterpart for is refused by name. timm is imported only when a converter runs.

The classes, in the order ``to_timm`` tries them (``ARCHITECTURES``):

"""

from zoo.interop.common import name_list
from zoo.interop.timm.convert import ARCHITECTURES, ARCHS, arch_for_spec, from_timm, timm_architecture, timm_kwargs, timm_spec, to_timm
from zoo.interop.timm.vit import CLAIMS

if __doc__:  # None under python -OO
    __doc__ += name_list(ARCHITECTURES) + "\n"
__all__ = ["ARCHITECTURES", "ARCHS", "CLAIMS", "arch_for_spec", "from_timm", "timm_architecture", "timm_kwargs", "timm_spec",
           "to_timm"]
