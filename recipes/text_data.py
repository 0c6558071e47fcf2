"""Text data for the recipes over plain text (recipes/lm.py, recipes/mlm.py): where the texts come
from, the train/valid split, the shared byte-level BPE, and batches of similar length."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Sequence

import torch
from pydantic import Field, PositiveFloat, PositiveInt

from zoo.data import bpe
from zoo.data import text as T
from zoo.train import Config, Dist, ListTask

__all__ = ["TextDataConfig", "load_text", "get_tokenizer", "own_tokenizer", "export_tokenizer", "LengthBatched", "eval_batches"]


class TextDataConfig(Config):
    """Where the text comes from and how it is tokenized (shared by recipes/lm.py and mlm.py)."""

    text: list[Path] | None = Field(None, description="plain-text files or folders of *.txt, one example a line; null: WordNet glosses")
    wordnet_dir: Path = Field(Path("/usr/share/wordnet"), description="Debian's wordnet-base data.{noun,verb,adj,adv}")
    tokenizer: Path | None = Field(None, description="an existing tokenizer.json (with <pad> <eos> <cls> <mask>) instead of training BPE")
    vocab_size: PositiveInt = Field(8192, description="byte-level BPE vocabulary trained on the training split")
    min_frequency: PositiveInt = Field(2, description="BPE: merge only pairs seen at least this often")
    valid_fraction: PositiveFloat = Field(0.02, lt=1.0, description="texts held out for validation")
    max_valid: PositiveInt | None = Field(5000, description="at most this many validation texts")
    split_seed: int = Field(1234, description="seeds the train/valid split (kept apart from run.seed)")
    limit: PositiveInt | None = Field(None, description="use only the first N texts (quick runs, tests)")
    packing: Literal["documents", "concat", "pad"] = Field(
        "documents", description="rows of texts: documents (packed one after another, each attending only to itself, "
        "positions from 0: document masks), concat (packed, attending across documents) or pad (one a row, padded)")


def load_text(cfg: TextDataConfig):
    """(train, valid, source description) per ``cfg``."""
    if cfg.text:
        data, source = T.read_text_files(cfg.text), ", ".join(map(str, cfg.text))
    else:
        data, source = T.read_wordnet(cfg.wordnet_dir), f"WordNet glosses ({cfg.wordnet_dir})"
    if cfg.limit:
        data = T.Texts(data.texts[: cfg.limit], data.labels[: cfg.limit])
    train, valid = T.split_texts(data, valid_fraction=cfg.valid_fraction, seed=cfg.split_seed, max_valid=cfg.max_valid)
    return train, valid, source


def get_tokenizer(cfg: TextDataConfig, train_texts: Sequence[str], out_dir: Path, dist: Dist, *, resume: bool):
    """The given tokenizer.json; on resume the run's own; else a byte-level BPE trained on the
    training texts by rank 0 and written to ``out_dir/tokenizer.json``. Returns (tokenizer, how)."""
    if cfg.tokenizer is not None:
        return bpe.load_bpe(cfg.tokenizer, specials=T.SPECIALS), f"from {cfg.tokenizer}"
    path = out_dir / "tokenizer.json"
    if resume and path.is_file():
        return bpe.load_bpe(path, specials=T.SPECIALS), f"from {path}"
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        tok = bpe.train_bpe(train_texts, cfg.vocab_size, specials=T.SPECIALS, min_frequency=cfg.min_frequency)
        tok.save(str(path))
    dist.barrier()
    return bpe.load_bpe(path, specials=T.SPECIALS), "trained on the training split"


def own_tokenizer(folder: Path, vocab_size: int, *, where: str):
    """The model's own tokenizer (``zoo.tokens.ModelTokenizer``: tokenizer.json and its special ids
    from the files in ``folder``), refused when its vocabulary is larger than the model's embedding."""
    from zoo.tokens import ModelTokenizer, TokenizerError
    from zoo.train import TrainError

    try:
        tok = ModelTokenizer.from_dir(folder)
        tok.check_vocab(vocab_size)
    except TokenizerError as e:
        raise TrainError(f"{where}: {e}") from None
    return tok


def export_tokenizer(tok, model_dir: Path, *, add_bos: bool = False, **special_tokens: str) -> None:
    """``tok`` in ``model_dir`` as a model's own tokenizer (``zoo.tokens.ModelTokenizer.save``:
    tokenizer.json, tokenizer_config.json naming its special tokens by HF's names, e.g.
    ``eos_token="<eos>"``, generation_config.json with their ids): what ``zoo generate``, ``init=``
    and HF's ``AutoTokenizer`` read beside an exported model."""
    from zoo.tokens import ModelTokenizer

    def ids(name: str) -> int | None:
        return tok.token_to_id(special_tokens[name]) if name in special_tokens else None

    eos = ids("eos_token")
    ModelTokenizer(tok, bos_id=ids("bos_token"), eos_ids=() if eos is None else (eos,), pad_id=ids("pad_token"),
                   add_bos=add_bos, special_tokens=special_tokens).save(model_dir)


class LengthBatched(ListTask):
    """Each epoch: a seeded shuffle of ``rows``, sorted by length within pools of 50 batches (little
    padding), the batch order shuffled again."""

    def __init__(self, dist, accum: int, rows: list[list[int]], batch_size: int, seed: int) -> None:
        super().__init__(dist, accum)
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.lengths = [len(r) for r in rows]

    def batches(self, epoch: int) -> list[list[int]]:
        size, lengths = self.batch_size, self.lengths
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(len(lengths), generator=g).tolist()
        order = order[: len(order) // size * size]
        pool = size * 50
        out = []
        for i in range(0, len(order), pool):
            chunk = sorted(order[i : i + pool], key=lambda j: lengths[j])
            out += [chunk[k : k + size] for k in range(0, len(chunk), size)]
        perm = torch.randperm(len(out), generator=g).tolist()
        return [out[p] for p in perm]


def eval_batches(rows, batch_size: int, rank: int, world: int):
    """This rank's share of ``rows`` in batches of similar length."""
    idx = sorted(range(len(rows)), key=lambda i: len(rows[i]))[rank::world]
    return [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]
