"""The four model families; importing this package registers their builders."""

from zoo.models.decoder import DecoderLM
from zoo.models.encoder import Encoder
from zoo.models.encoder_decoder import EncoderDecoder
from zoo.models.family import Family
from zoo.models.patches import PatchBatch
from zoo.models.vit import VisionTransformer

__all__ = ["DecoderLM", "Encoder", "EncoderDecoder", "Family", "PatchBatch", "VisionTransformer"]
