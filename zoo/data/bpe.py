"""Byte-pair encoding (Sennrich et al. 2016) with the ``tokenizers`` library, for every text recipe:
train, load, encode, decode. The caller's special tokens take ids 0, 1, 2, ... in their order.

    tok = train_bpe(texts, 8192, specials=["<pad>", "<eos>", "<cls>", "<mask>"])               # byte-level
    tok = train_bpe(texts, 6000, specials=["<pad>", "<s>", "</s>", "<unk>"], unk="<unk>")    # word pieces
    ids = encode(tok, texts, eos="</s>", max_len=128)
    tok = load_bpe("tokenizer.json", specials=[...])     # refuses a file with other special ids

Two styles, chosen by ``unk``. Without one, byte-level BPE (GPT-2's): every text encodes and decoding
restores it exactly. With one, SentencePiece-style word boundaries (``▁``) after NFKC normalisation,
a character the training text never showed becoming ``unk``: the smaller vocabulary a shared
source-target BPE for translation wants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from zoo.data.common import DataError

__all__ = ["train_bpe", "load_bpe", "encode", "decode"]


def train_bpe(texts: Iterable[str], vocab_size: int, *, specials: Sequence[str], unk: str | None = None,
              min_frequency: int = 2):
    """A BPE tokenizer trained on ``texts`` whose ids ``0 .. len(specials) - 1`` are ``specials``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if unk is not None and unk not in specials:
        raise ValueError(f"unk {unk!r} must be one of the special tokens {list(specials)}")
    alphabet: list[str] = []
    if unk is None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()  # every byte has a token: nothing is unknown
    else:
        tok = Tokenizer(models.BPE(unk_token=unk))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(specials),
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_bpe(path: str | Path, *, specials: Sequence[str]):
    """A ``tokenizer.json`` that holds ``specials`` as ids ``0 ..`` (as :func:`train_bpe` makes them)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise DataError(f"no tokenizer at {path}")
    tok = Tokenizer.from_file(str(path))
    ids = [tok.token_to_id(s) for s in specials]
    if ids != list(range(len(specials))):
        raise DataError(f"{path}: the tokenizer must hold {' '.join(specials)} as ids 0-{len(specials) - 1} (found ids "
                        f"{ids}); train one with zoo.data.bpe.train_bpe")
    return tok


def encode(tokenizer, texts: Sequence[str], *, eos: str | None = None, max_len: int | None = None,
           batch: int = 10000) -> list[list[int]]:
    """Token ids of each text (no special tokens), followed by the token ``eos`` where given, and cut
    to ``max_len`` tokens (``eos`` kept)."""
    end = [] if eos is None else [tokenizer.token_to_id(eos)]
    keep = None if max_len is None else max_len - len(end)
    out: list[list[int]] = []
    for i in range(0, len(texts), batch):
        for enc in tokenizer.encode_batch(list(texts[i : i + batch]), add_special_tokens=False):
            out.append(enc.ids[:keep] + end)
    return out


def decode(tokenizer, ids: Iterable[Sequence[int]], *, eos: str) -> list[str]:
    """Text of each id sequence, up to its first ``eos``, skipping special tokens."""
    end = tokenizer.token_to_id(eos)
    rows = []
    for seq in ids:
        seq = list(seq)
        rows.append(seq[: seq.index(end)] if end in seq else seq)
    return tokenizer.decode_batch(rows, skip_special_tokens=True)
