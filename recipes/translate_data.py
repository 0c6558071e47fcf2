"""The translation recipe's data: its ``data`` config, the pairs it trains and scores on (the
embedded corpus with each valid/test pair's domain, or a folder of parallel files), the shared
source-target BPE, the corpus report, and word dropout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typing import Literal

from pydantic import Field, PositiveInt, field_validator

from zoo.atomic import atomic_path, atomic_write_text
from zoo.data import bpe
from zoo.data import corpus as C
from zoo.data import translation as T
from zoo.train import Config, Dist

__all__ = ["TranslationDataConfig", "load_splits", "word_dropout", "shared_bpe", "describe_corpus"]


class TranslationDataConfig(Config):
    """Where the translation recipe's pairs come from (its ``data``), and how they are tokenized."""

    path: Path | None = Field(None, description="folder with train/valid/test.{src,tgt} or *.tsv; null: the embedded corpus")
    corpus: str = Field("both", description=(
        "without data.path, the embedded EN-DE domains to use: ding (Ding dictionary sentences), messages (software "
        "messages from German gettext catalogs), stories (game dialogue and narrative), both (ding+messages), all, "
        "or domains joined by '+'; training uses their union, valid and test are scored per domain"))
    catalogs: Path | None = Field(None, description="folder of the German catalogs (default: where tools/install-data puts them)")
    src_lang: str = Field("en", description="the source language (its file suffix in data.path)")
    tgt_lang: str = Field("de", description="the target language")
    vocab_size: PositiveInt = Field(6000, description="shared source-target BPE vocabulary")
    min_frequency: PositiveInt = Field(2, description="BPE: merge only pairs seen at least this often")
    tokenizer: Path | None = Field(None, description="an existing tokenizer.json to use instead of training BPE")
    max_len: PositiveInt = Field(128, description="tokens per sentence (longer ones are truncated)")
    packing: Literal["documents", "pad"] = Field("documents", description=(
        "training batches: documents (pairs packed into rows of data.pack_len target tokens, each pair masked off "
        "the others in the encoder, the decoder and the cross-attention) or pad (token buckets of pairs of similar "
        "length, padded to the longest); docs/recipes/translate.md compares them"))
    pack_len: PositiveInt = Field(32, description=(
        "data.packing=documents: target tokens a packed row holds (its source row: this times the training pairs' "
        "source/target token ratio); a longer pair takes a row of its own"))
    oversample: dict[str, PositiveInt] = Field(default_factory=dict, description=(
        "embedded corpus: copies of a domain's training pairs in the union, e.g. {ding: 2}, to give a smaller "
        "domain more of the updates"))
    valid: PositiveInt = Field(500, description="embedded corpus: held-out validation pairs per domain")
    test: PositiveInt = Field(1000, description="embedded corpus: held-out test pairs per domain")
    split_seed: int = Field(1234, description="seeds the train/valid/test split (kept apart from run.seed)")
    train_limit: PositiveInt | None = Field(None, description="use only the first N training pairs")
    valid_limit: PositiveInt | None = Field(None, description="use only the first N validation pairs (per domain)")
    test_limit: PositiveInt | None = Field(None, description="use only the first N test pairs (per domain)")

    @field_validator("corpus")
    @classmethod
    def _known_domains(cls, v: str) -> str:
        C.parse_corpus(v)  # raises with the choices
        return v


def load_splits(cfg: TranslationDataConfig) -> tuple[dict[str, T.Pairs], dict[str, list[str]], C.Corpus | None]:
    """train / valid / test pairs as the config says (test may be empty for user data), the domain
    of each valid and test pair, and the embedded corpus by domain (None for user data)."""
    if cfg.path is None:
        if {cfg.src_lang, cfg.tgt_lang} != {"en", "de"}:
            raise T.DataError(f"the embedded corpus is English-German; got data.src_lang={cfg.src_lang} "
                              f"data.tgt_lang={cfg.tgt_lang} (use en/de or de/en, or your own data.path)")
        corpus = C.build_corpus(cfg.corpus, direction=f"{cfg.src_lang}-{cfg.tgt_lang}", valid=cfg.valid, test=cfg.test,
                                seed=cfg.split_seed, catalogs=cfg.catalogs)
        limits = {"valid": cfg.valid_limit, "test": cfg.test_limit}
        try:
            splits, labels = {"train": corpus.union("train", cfg.oversample)}, {}
        except T.DataError as e:
            raise T.DataError(f"data.oversample: {e} (data.corpus={cfg.corpus})") from None
        for name in ("valid", "test"):
            splits[name], labels[name] = T.Pairs(), []
            for domain, parts in corpus.splits.items():
                p = parts[name]
                n = min(len(p), limits[name] or len(p))
                splits[name].src += p.src[:n]
                splits[name].tgt += p.tgt[:n]
                labels[name] += [domain] * n
    else:
        splits = T.read_folder(cfg.path, cfg.src_lang, cfg.tgt_lang)
        for name, limit in (("valid", cfg.valid_limit), ("test", cfg.test_limit)):
            if limit is not None:
                p = splits[name]
                splits[name] = T.Pairs(p.src[:limit], p.tgt[:limit], p.dropped)
        labels = {name: ["data"] * len(splits[name]) for name in ("valid", "test")}
        corpus = None
    if cfg.train_limit is not None:
        p = splits["train"]
        splits["train"] = T.Pairs(p.src[: cfg.train_limit], p.tgt[: cfg.train_limit], p.dropped)
    return splits, labels, corpus


def word_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``x`` with each real token (not padding, <s> or </s>) replaced by <unk> with probability ``p``;
    draws from the global CPU generator, so a resumed run draws the same masks."""
    if p <= 0:
        return x
    drop = (torch.rand(x.shape) < p) & (x > T.UNK_ID)
    return x.masked_fill(drop, T.UNK_ID)


def shared_bpe(data, splits: dict[str, T.Pairs], out_dir: Path, dist: Dist, *, resume: bool, corpus=None):
    """The shared source-target BPE: ``data.tokenizer`` if given, else ``out_dir/tokenizer.json`` when it
    was trained with these settings (or when resuming), else trained on the training pairs and saved
    there. ``data`` is the recipe's data config. Returns (tokenizer, "given" | "reused" | "trained")."""
    if data.tokenizer is not None:
        return bpe.load_bpe(data.tokenizer, specials=T.SPECIALS), "given"
    path, meta_path = out_dir / "tokenizer.json", out_dir / "tokenizer.settings.json"
    settings = {"vocab_size": data.vocab_size, "min_frequency": data.min_frequency, "path": str(data.path),
                "langs": [data.src_lang, data.tgt_lang], "train_limit": data.train_limit, "n_train": len(splits["train"]),
                "corpus": {d: st["sha256"] for d, st in corpus.stats.items()} if corpus is not None else None,
                "oversample": data.oversample}
    reuse = path.is_file() and (resume or (meta_path.is_file() and json.loads(meta_path.read_text()) == settings))
    if not reuse and dist.is_main:
        tok = bpe.train_bpe(splits["train"].src + splits["train"].tgt, data.vocab_size, specials=T.SPECIALS, unk=T.UNK,
                             min_frequency=data.min_frequency)
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tok.save(str(tmp))
        atomic_write_text(meta_path, json.dumps(settings))
    dist.barrier()
    return bpe.load_bpe(path, specials=T.SPECIALS), "reused" if reuse else "trained"


def describe_corpus(corpus: C.Corpus, dist: Dist, out: Path) -> None:
    """Log each domain's size, fingerprint and drops by reason, and the catalogs that could not be
    read; write the exact splits to ``out/data/{train,valid,test}.<domain>.tsv``."""
    for domain, st in corpus.stats.items():
        drops = ", ".join(f"{n:,} {why}" for why, n in sorted(st["dropped"].items(), key=lambda kv: -kv[1]))
        dist.print(f"corpus {domain}: {st['pairs']:,} pairs (train {st['train']:,}, valid {st['valid']:,}, test "
                   f"{st['test']:,}), sha256 {st['sha256'][:16]}; dropped: {drops or 'none'}")
    for path, why in corpus.unreadable:
        dist.print(f"corpus: skipped unreadable catalog {path}: {why}")
    if corpus.missing_packages:
        stories = set(corpus.missing_packages) & set(C.catalog_packages("stories"))
        dist.print(f"corpus: no catalogs of {len(corpus.missing_packages)} listed packages "
                   f"({' '.join(corpus.missing_packages)}); the corpus differs from the documented one; "
                   + C.catalog_hint("stories" if stories else "messages"))
    if dist.is_main:
        (out / "data").mkdir(parents=True, exist_ok=True)
        for domain, parts in corpus.splits.items():
            for name, pairs in parts.items():
                C.write_tsv(pairs, out / "data" / f"{name}.{domain}.tsv")
