"""A sentence-transformers directory: where its transformer is, and how it embeds.

    read_sentence_transformers(src) -> SentenceModel | None

sentence-transformers saves a model as modules applied in turn, listed in ``modules.json``
(``[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}, ...]``):
the transformer (an HF directory: at the top, ``path: ""``, or in a folder such as ``0_Transformer``,
with ``sentence_bert_config.json`` giving ``max_seq_length`` and ``do_lower_case``), a ``Pooling``
module (its folder's ``config.json`` switches one ``pooling_mode_*`` on), and optionally ``Normalize``.
zoo embeds that way (:mod:`zoo.embed`): mean, cls or max pooling, then normalising or not. A
directory with other modules (a ``Dense`` projection, another pooling mode, several at once) is
refused by name: what ``zoo embed`` computed would then differ from the model's embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from zoo.embed import Settings
from zoo.interop.common import ConversionError

__all__ = ["MODULES", "SentenceModel", "read_sentence_transformers"]

MODULES = "modules.json"
_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}


@dataclass(frozen=True)
class SentenceModel:
    transformer: Path  # the HF directory of its transformer
    settings: Settings


def _json(path: Path, what: str) -> object:
    if not path.is_file():
        raise ConversionError(f"{path.parent}: {what} needs {path.name}, which is not there")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None


def _pooling(folder: Path) -> str:
    config = _json(folder / "config.json", "the Pooling module")
    if not isinstance(config, dict):
        raise ConversionError(f"{folder / 'config.json'}: not a JSON object")
    on = sorted(key for key, value in config.items() if key.startswith("pooling_mode_") and value is True)
    if len(on) != 1 or on[0] not in _MODES:
        raise ConversionError(f"{folder / 'config.json'}: pooling modes {', '.join(on) or 'none'} are not supported; zoo "
                              f"embeds with one of {', '.join(_MODES)}")
    return _MODES[on[0]]


def read_sentence_transformers(src: Path) -> SentenceModel | None:
    """The transformer folder and embedding settings of the sentence-transformers directory ``src``,
    or None where ``src`` has no ``modules.json``."""
    if not (src / MODULES).is_file():
        return None
    modules = _json(src / MODULES, "a sentence-transformers model")
    if not isinstance(modules, list) or not all(isinstance(m, dict) and "type" in m for m in modules):
        raise ConversionError(f"{src / MODULES}: not a list of modules with a type each")
    kinds = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        other = next((f"{m.get('path') or m['type']} ({m['type']})" for m, k in zip(modules, kinds)
                      if k not in ("Transformer", "Pooling", "Normalize")), " -> ".join(kinds))
        raise ConversionError(f"{src / MODULES}: the modules {other} are not supported; zoo embeds with Transformer -> "
                              f"Pooling [-> Normalize] (remove {MODULES} to convert the transformer alone)")
    transformer = src / str(modules[0].get("path") or "")
    pooling = _pooling(src / str(modules[1].get("path") or ""))
    bert = transformer / "sentence_bert_config.json"
    config = _json(bert, "the Transformer module") if bert.is_file() else {}
    if not isinstance(config, dict):
        raise ConversionError(f"{bert}: not a JSON object")
    try:
        settings = Settings(pooling=pooling, normalize=len(kinds) == 3, max_tokens=config.get("max_seq_length"),
                            lowercase=bool(config.get("do_lower_case", False)))
    except ValueError as e:
        raise ConversionError(f"{bert}: {e}") from None
    return SentenceModel(transformer, settings)
