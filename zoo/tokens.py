"""A model's own tokenizer: its ``tokenizer.json`` with the special tokens and prompt settings that the
files beside it give, as an HF model folder holds them.

    tok = ModelTokenizer.beside("llama/model.safetensors")   # the files next to a zoo file
    tok = ModelTokenizer.from_dir("my-llama-hf")              # an HF model folder
    tok.check_vocab(model.spec.vocab_size)                   # refuses another model's tokenizer
    ids = tok.encode("the act of")                           # starts with bos where the model's prompts do
    text = tok.render_chat([{"role": "user", "content": "hi"}])   # the chat template, as HF renders it
    ids = tok.encode(text, add_special_tokens=False)        # what HF's apply_chat_template tokenizes
    tok.decode(new_ids)                                      # special tokens left out

The files (:data:`SIDECARS`, which ``zoo convert`` copies beside a zoo file and back into an HF folder):

    tokenizer.json            the ``tokenizers`` tokenizer (required)
    tokenizer_config.json     the special tokens as strings (``bos_token``, ``eos_token``, ``pad_token``),
                              ``add_bos_token``, ``chat_template``
    special_tokens_map.json   the special tokens as strings (older folders)
    generation_config.json    ``bos_token_id``, ``eos_token_id`` (one id or a list), ``pad_token_id``,
                              ``decoder_start_token_id``
    chat_template.jinja       the chat template (newer folders keep it out of tokenizer_config.json)

and ``config.json`` where there is one. Each special id comes from the first of these that gives it:
``generation_config.json``, ``config.json``, ``tokenizer_config.json``'s token string looked up in the
vocabulary, ``special_tokens_map.json``'s. A prompt starts with bos where the tokenizer's own
post-processor puts it there (``encode("a")`` starts with bos), as HF's tokenizer encodes it; a
tokenizer without a post-processor takes ``add_bos_token`` from ``tokenizer_config.json``.

Nothing here imports torch; ``tokenizers`` and (for chat templates) ``jinja2`` are imported when used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SIDECARS", "TOKENIZER", "ModelTokenizer", "TokenizerError", "read_tokenizer", "tokenizer_path"]

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
SIDECARS = (TOKENIZER, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, GENERATION_CONFIG, CHAT_TEMPLATE)
TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")  # HF's


class TokenizerError(ValueError):
    """A tokenizer or a file beside it that cannot be used; the message names the file and the fix."""


def tokenizer_path(model_path: str | Path, tokenizer: str | Path | None = None) -> Path:
    """The ``tokenizer.json`` of the model file ``model_path``: ``tokenizer`` if given (a file, or a
    folder holding one), else the one beside the model file; refused by name where there is none."""
    if tokenizer is not None:
        path = Path(tokenizer)
        path = path / TOKENIZER if path.is_dir() else path
        if not path.is_file():
            raise TokenizerError(f"--tokenizer {path}: no such file")
        return path
    path = Path(model_path).parent / TOKENIZER
    if not path.is_file():
        raise TokenizerError(f"no tokenizer for {model_path}: {path} does not exist; put the model's {TOKENIZER} next "
                             f"to the model file, or name one with --tokenizer PATH")
    return path


def read_tokenizer(path: str | Path) -> Any:
    """The ``tokenizers.Tokenizer`` in the file ``path``."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library's own parse errors
        raise TokenizerError(f"{path}: not a tokenizers tokenizer.json ({str(e).splitlines()[0]})") from None


def _json(path: Path) -> dict:
    """A JSON object file, or {} where there is no file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: not valid JSON ({e}); fix or delete the file") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: not a JSON object; fix or delete the file")
    return data


def _token_string(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any, where: str) -> tuple[int, ...] | None:
    """Token ids as a config file gives them (one id, a list, or null)."""
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise TokenizerError(f"{where}: {value!r} is not a token id (a whole number >= 0) or a list of them")
    return tuple(values) or None


def _chat_template(folder: Path, config: dict) -> str | None:
    """``chat_template.jinja``, else tokenizer_config.json's ``chat_template`` (a string, or named
    templates of which the one named ``default``)."""
    if (folder / CHAT_TEMPLATE).is_file():
        return (folder / CHAT_TEMPLATE).read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


@dataclass(frozen=True)
class ModelTokenizer:
    """``tokenizer`` (a ``tokenizers.Tokenizer``) and the model's special ids: ``bos_id``, ``eos_ids``
    (every token that ends a text), ``pad_id``, ``decoder_start_id`` (the first target token of an
    encoder-decoder); ``add_bos``: whether a prompt starts with bos; ``chat_template`` (Jinja, as HF's);
    ``special_tokens``: the special tokens as strings by HF's names (``bos_token``, ``eos_token``, ...),
    which chat templates read; ``path``: the tokenizer.json read, for messages."""

    tokenizer: Any
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    decoder_start_id: int | None = None
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = None

    # ------------------------------------------------------------------------------- reading
    @classmethod
    def beside(cls, model_path: str | Path, tokenizer: str | Path | None = None) -> ModelTokenizer:
        """The tokenizer of the zoo file ``model_path``: the files beside it (see the module's
        docstring); ``tokenizer``: another tokenizer.json to use with them, or a folder holding one
        with its own files."""
        if tokenizer is not None and Path(tokenizer).is_dir():
            return cls.from_dir(tokenizer)
        return cls.read(Path(model_path).parent, tokenizer_path(model_path, tokenizer))

    @classmethod
    def from_dir(cls, folder: str | Path) -> ModelTokenizer:
        """The tokenizer of an HF model folder (``tokenizer.json`` and the files beside it)."""
        folder = Path(folder)
        path = folder / TOKENIZER
        if not path.is_file():
            raise TokenizerError(f"{folder}: no {TOKENIZER} (the model's tokenizer, as HF's fast tokenizers save it); "
                                 f"a folder with only a slow tokenizer (tokenizer.model) needs converting first")
        return cls.read(folder, path)

    @classmethod
    def read(cls, folder: str | Path, path: str | Path) -> ModelTokenizer:
        """The tokenizer.json ``path`` with the special ids and settings of the files in ``folder``."""
        folder, path = Path(folder), Path(path)
        tok = read_tokenizer(path)
        generation = _json(folder / GENERATION_CONFIG)
        config = _json(folder / "config.json")
        tok_config = _json(folder / TOKENIZER_CONFIG)
        tok_map = _json(folder / SPECIAL_TOKENS_MAP)
        strings = {name: s for name in TOKEN_NAMES
                   if (s := _token_string(tok_config.get(name)) or _token_string(tok_map.get(name))) is not None}

        def ids(key: str, name: str | None) -> tuple[int, ...] | None:
            for file, data in ((GENERATION_CONFIG, generation), ("config.json", config)):
                found = _ids(data.get(key), f"{folder / file}: {key}")
                if found is not None:
                    return found
            for file, data in ((TOKENIZER_CONFIG, tok_config), (SPECIAL_TOKENS_MAP, tok_map)):
                text = _token_string(data.get(name)) if name else None
                if text is not None:
                    found = tok.token_to_id(text)
                    if found is None:
                        raise TokenizerError(f"{folder / file}: {name} {text!r} is not a token of {path}; "
                                             f"is it this tokenizer's file?")
                    return (found,)
            return None

        eos = ids("eos_token_id", "eos_token") or ()
        bos, pad = ids("bos_token_id", "bos_token"), ids("pad_token_id", "pad_token")
        start = ids("decoder_start_token_id", None)
        bos_id, pad_id = bos[0] if bos else None, pad[0] if pad else None
        for name, found in (("bos_token", bos_id), ("eos_token", eos[0] if eos else None), ("pad_token", pad_id)):
            if name not in strings and found is not None and tok.id_to_token(found) is not None:
                strings[name] = tok.id_to_token(found)
        if tok.post_processor is not None:
            add_bos = bos_id is not None and tok.encode("a").ids[:1] == [bos_id]
        else:
            add_bos = bos_id is not None and tok_config.get("add_bos_token") is True
        return cls(tok, bos_id=bos_id, eos_ids=eos, pad_id=pad_id, add_bos=add_bos,
                   chat_template=_chat_template(folder, tok_config), decoder_start_id=start[0] if start else None,
                   special_tokens=strings, path=path)

    # ---------------------------------------------------------------------------------- using
    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer can give, its added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def check_vocab(self, model_vocab_size: int) -> None:
        """Refuse a tokenizer that gives ids the model has no embedding row for (a model may have more
        rows than the tokenizer has tokens: HF models often pad theirs), and special ids beyond them."""
        where = self.path or "the tokenizer"
        if self.vocab_size > model_vocab_size:
            raise TokenizerError(f"{where} has {self.vocab_size} tokens, more than the model's {model_vocab_size} "
                                 f"embedding rows (vocab_size): it is another model's tokenizer; give this model's "
                                 f"own (--tokenizer PATH)")
        for name, value in (("bos", self.bos_id), ("pad", self.pad_id), ("decoder start", self.decoder_start_id),
                            *(("eos", i) for i in self.eos_ids)):
            if value is not None and value >= model_vocab_size:
                fix = f"are the files beside {self.path} this model's?" if self.path else "give this model's special ids"
                raise TokenizerError(f"the {name} token id {value} is beyond the model's {model_vocab_size} embedding "
                                     f"rows (vocab_size); {fix}")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``: with the tokenizer's special tokens and bos as :attr:`add_bos` says
        (a prompt), or without any (``add_special_tokens=False``: a rendered chat, which holds its own)."""
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.bos_id is not None:
            starts = ids[:1] == [self.bos_id]
            if self.add_bos and not starts:
                ids = [self.bos_id, *ids]
            elif not self.add_bos and starts:
                ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; special tokens left out unless ``skip_special_tokens=False``."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    **kwargs: Any) -> str:
        """The chat template rendered as HF's ``apply_chat_template(messages, tokenize=False, ...)``
        renders it: the messages, ``add_generation_prompt``, the special tokens' strings
        (``bos_token``, ``eos_token``, ...) and ``kwargs``, in a sandboxed Jinja environment."""
        if self.chat_template is None:
            folder = self.path.parent if self.path else "the tokenizer's folder"
            raise TokenizerError(f"no chat template beside {self.path or 'the tokenizer'} (no chat_template in "
                                 f"{folder}/{TOKENIZER_CONFIG}, no {CHAT_TEMPLATE}); prompt the model without --chat")
        return _render(self.chat_template, [dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                       **{**self.special_tokens, **kwargs})

    def save(self, folder: str | Path) -> list[Path]:
        """Write ``tokenizer.json``, ``tokenizer_config.json`` (the special tokens, ``add_bos_token``,
        the chat template) and ``generation_config.json`` (the special ids) into ``folder``, so that
        :meth:`beside` and HF's ``AutoTokenizer`` read this tokenizer back; the paths written."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tok = self.tokenizer
        if self.add_bos and self.bos_id is not None and tok.encode("a").ids[:1] != [self.bos_id]:
            from tokenizers import Tokenizer, processors  # HF reads bos from the post-processor alone

            bos = tok.id_to_token(self.bos_id)
            tok = Tokenizer.from_str(tok.to_str())
            tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1",
                                                               special_tokens=[(bos, self.bos_id)])
        tok.save(str(folder / TOKENIZER))
        tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", **dict(self.special_tokens),
                      "add_bos_token": self.add_bos}
        if self.chat_template is not None:
            tok_config["chat_template"] = self.chat_template
        eos = list(self.eos_ids) if len(self.eos_ids) > 1 else (self.eos_ids[0] if self.eos_ids else None)
        generation = {k: v for k, v in (("bos_token_id", self.bos_id), ("eos_token_id", eos), ("pad_token_id", self.pad_id),
                                        ("decoder_start_token_id", self.decoder_start_id)) if v is not None}
        written = [folder / TOKENIZER]
        for name, data in ((TOKENIZER_CONFIG, tok_config), (GENERATION_CONFIG, generation)):
            (folder / name).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            written.append(folder / name)
        return written


def _render(template: str, messages: list[dict], **context: Any) -> str:
    """Render a chat template in the environment HF's ``apply_chat_template`` gives it: sandboxed,
    ``trim_blocks`` and ``lstrip_blocks``, loop controls, ``raise_exception``, ``strftime_now``, and a
    ``tojson`` that leaves non-ASCII text and HTML characters as they are."""
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    try:
        return env.from_string(template).render(messages=messages, **{"tools": None, "documents": None, **context})
    except jinja2.exceptions.TemplateError as e:
        raise TokenizerError(f"the chat template: {e}") from None
