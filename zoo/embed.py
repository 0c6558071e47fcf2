"""Sentence embeddings: a model's token hidden states pooled into one vector per sequence.

    zoo.embed(model, tokens, padding_mask=None, *, pooling="mean", normalize=False) -> [B, D]

``pooling`` is one of

    mean   the mean of the real tokens' hidden states (padding left out): sentence-transformers' default
    cls    the first token's hidden state (not BERT's pooler, a trained layer on it: ``model.pool``)
    max    each feature's largest value over the real tokens
    pooler the model's own pooled output, ``model.pool``: BERT's pooler, or a text tower's pool and
           projection (CLIP's end-of-text token through text_projection, SigLIP's last token through its
           head: HF's ``text_embeds`` / ``pooler_output``)

and ``normalize`` divides each vector by its L2 norm, so that a dot product is the cosine similarity.
``padding_mask`` ([B, T], True = real token) says which tokens are real; a row must have one. The
model is an encoder (its hidden states after the last block, whatever its head) or a decoder with
``head: none``; any other is refused by name (``Family.hidden_states_refused``).

A zoo file may carry how its model embeds, in its metadata (``zoo.embedding``: JSON with
``pooling``, ``normalize``, ``max_tokens``, ``lowercase``): ``zoo convert`` writes it from a
sentence-transformers directory (:mod:`zoo.interop.sentence`) and ``zoo embed`` takes it as its
defaults (:func:`stored_settings`). :func:`embed_texts` embeds texts with the model's ``tokenizer.json``
(the ``tokenizers`` library), as sentence-transformers does: lowercased first where its settings say
so, cut at ``max_tokens`` (else the model's ``max_seq_len``) as the tokenizer truncates, padded per batch.

Shapes: B batch, T tokens, D model width, N texts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.models.family import Family
from zoo.tokens import read_tokenizer, tokenizer_path

__all__ = ["KEY_EMBEDDING", "POOLINGS", "Settings", "embed", "embed_texts", "has_tokens", "load_tokenizer",
           "stored_settings"]

POOLINGS = ("mean", "cls", "max", "pooler")
KEY_EMBEDDING = "zoo.embedding"  # the zoo file's metadata key of its Settings (JSON)


def _refused(model: nn.Module) -> str | None:
    if not isinstance(model, Family):
        return f"a {type(model).__name__} is not a zoo model (build it with zoo.build or zoo.load)"
    return model.hidden_states_refused()


def embed(model: nn.Module, tokens: Tensor, padding_mask: Tensor | None = None, *, pooling: str = "mean",
          normalize: bool = False) -> Tensor:
    """One vector [B, D] per row of ``tokens`` [B, T] (see the module's docstring)."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling: {pooling!r} is not one of {', '.join(POOLINGS)}")
    refused = _refused(model)
    if refused:
        raise ValueError(f"embed: {refused}")
    if padding_mask is not None and padding_mask.shape == tokens.shape:
        empty = (~padding_mask.bool()).all(dim=1).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"padding_mask: row {empty[0]} has no real token to pool; leave empty texts out")
    if pooling == "pooler":
        if not callable(getattr(model, "pool", None)):
            raise ValueError(f"pooling: pooler: a {model.spec.family} model has no pooled output; use mean, cls or max")
        out = model.pool(tokens, padding_mask)  # (B, D) or (B, projection.dim)
        return F.normalize(out, p=2, dim=-1) if normalize else out
    h = model.hidden_states(tokens, padding_mask)  # (B, T, D)
    real = (torch.ones_like(tokens, dtype=torch.bool) if padding_mask is None else padding_mask.bool()).unsqueeze(-1)
    if pooling == "cls":
        out = h[:, 0]
    elif pooling == "mean":
        out = (h * real).sum(dim=1) / real.sum(dim=1).to(h.dtype)  # (B, D)
    else:
        out = h.masked_fill(~real, float("-inf")).amax(dim=1)
    return F.normalize(out, p=2, dim=-1) if normalize else out


# ------------------------------------------------------------------------------ settings in a zoo file
@dataclass(frozen=True)
class Settings:
    """How a model embeds texts: ``pooling``, ``normalize``, the tokens kept (``max_tokens``: the
    first ones; None: the model's ``max_seq_len``), and ``lowercase`` (texts lowercased before
    tokenizing, sentence-transformers' ``do_lower_case``)."""

    pooling: str = "mean"
    normalize: bool = False
    max_tokens: int | None = None
    lowercase: bool = False

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling: {self.pooling!r} is not one of {', '.join(POOLINGS)}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens: {self.max_tokens!r} is not a whole number of at least 1")

    def describe(self) -> str:
        return (f"{self.pooling} pooling" + (", normalized" if self.normalize else "")
                + (f", at most {self.max_tokens} tokens" if self.max_tokens else "") + (", lowercased" if self.lowercase else ""))

    def metadata(self) -> dict[str, str]:
        """The zoo file metadata holding these settings (``zoo.save(..., metadata=...)``)."""
        return {KEY_EMBEDDING: json.dumps(asdict(self), separators=(",", ":"))}


def stored_settings(metadata: Mapping[str, str], where: str = "the file") -> Settings | None:
    """The settings a zoo file's metadata holds (``zoo.io.read_header(path).metadata``), or None."""
    if KEY_EMBEDDING not in metadata:
        return None
    try:
        data = json.loads(metadata[KEY_EMBEDDING])
        return Settings(**data)
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: unreadable {KEY_EMBEDDING} in its metadata ({e})") from None


# ------------------------------------------------------------------------------------------- texts
def load_tokenizer(model_path: str | Path, tokenizer: str | Path | None = None) -> Any:
    """The ``tokenizers.Tokenizer`` of the model file ``model_path``: ``tokenizer`` if given, else
    ``tokenizer.json`` beside the model file (where ``zoo convert`` and the recipes put it); the
    special tokens and settings beside it: :class:`zoo.tokens.ModelTokenizer`."""
    return read_tokenizer(tokenizer_path(model_path, tokenizer))


def has_tokens(tokenizer: Any, text: str) -> bool:
    """Whether ``text`` tokenizes to anything: an empty text does not, nor one of spaces with a
    tokenizer that adds no special tokens (nothing to pool)."""
    return bool(text) and (bool(text.strip()) or bool(tokenizer.encode(text).ids))


def embed_texts(model: nn.Module, tokenizer: Any, texts: Sequence[str], settings: Settings = Settings(), *,
                batch_size: int = 32) -> Tensor:
    """[N, D] embeddings of ``texts`` (none empty), ``batch_size`` texts at a time, in eval mode and
    without gradients (the model's mode is restored)."""
    spec = model.spec
    limit = min(settings.max_tokens or spec.max_seq_len, spec.max_seq_len)
    tokenizer.no_padding()
    tokenizer.enable_truncation(limit)
    device = next(model.parameters()).device
    was_training, out = model.training, []
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                batch = [t.lower() if settings.lowercase else t for t in texts[start:start + batch_size]]
                ids = [e.ids for e in tokenizer.encode_batch(batch)]
                empty = [i for i, row in enumerate(ids) if not row]
                if empty:
                    raise ValueError(f"texts[{start + empty[0]}] {batch[empty[0]]!r}: the tokenizer gives no token to "
                                     f"embed; leave such texts out (zoo.embed.has_tokens finds them)")
                width = max(len(row) for row in ids)
                tokens = torch.zeros(len(ids), width, dtype=torch.long)
                mask = torch.zeros(len(ids), width, dtype=torch.bool)
                for i, row in enumerate(ids):
                    tokens[i, :len(row)], mask[i, :len(row)] = torch.tensor(row, dtype=torch.long), True
                if tokens.numel() and int(tokens.max()) >= spec.vocab_size:
                    raise ValueError(f"the tokenizer gives id {int(tokens.max())}, beyond the model's vocab_size "
                                     f"({spec.vocab_size}): is it this model's tokenizer?")
                vectors = embed(model, tokens.to(device), mask.to(device), pooling=settings.pooling,
                                normalize=settings.normalize)
                out.append(vectors.float().cpu())
    finally:
        model.train(was_training)
    width = spec.projection.dim if settings.pooling == "pooler" and getattr(spec, "projection", None) else spec.d_model
    return torch.cat(out) if out else torch.zeros(0, width)
