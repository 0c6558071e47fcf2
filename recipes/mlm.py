"""Pre-train a BERT-style encoder with masked language modelling, report masked-token accuracy
against a most-frequent-token baseline, then fine-tune its classification head on labelled text.

    python recipes/mlm.py                                    # the embedded default: WordNet glosses, CPU, ~7 min
    python recipes/mlm.py finetune.train=train.tsv finetune.valid=valid.tsv   # your labelled text<TAB>label
    python recipes/mlm.py finetune.enabled=false data.text=[corpus/]          # pre-training only
    torchrun --nproc_per_node 8 recipes/mlm.py --config my.yaml
    python recipes/mlm.py --resume                           # continue exactly where the run stopped

Each example is one text (a gloss, a line) as ``<cls> text <eos>``, padded per batch with a padding
mask. Masking follows BERT: 15% of the tokens are selected; of those 80% become ``<mask>``, 10% a
random token, 10% stay. Fine-tuning's default task is WordNet's own labels: gloss -> part of speech
(noun, verb, adj, adv), on the same train/valid split. See docs/recipes/lm.md.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt

import zoo
from zoo.atomic import atomic_write_text
from zoo.data import bpe
from zoo.data import text as T
from zoo.spec import SpecError
from zoo.tokens import SIDECARS
from zoo.train import (
    Config,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrainError,
    config_to_yaml,
    distributed,
    fit,
    parse_args,
    resolve_precision,
    resolve_resume,
    seed_everything,
    tune_malloc,
)
from zoo.finetune.spec import LoraSpec
from zoo.train.adapters import export_adapters, with_adapters
from zoo.train.pretrained import pretrained

# beside this script
from classify_data import (Classifying, ClassifyTask, Labelled, encode_labelled, majority, read_labelled,
                           recipe_template, split_labelled)
from text_data import (LengthBatched, TextDataConfig, eval_batches, export_tokenizer, get_tokenizer, load_text,
                       own_tokenizer)

DEFAULT_CONFIG = Path(__file__).with_name("mlm.yaml")
GPU_CONFIG = Path(__file__).with_name("mlm.gpu.yaml")  # laid under the user's settings on CUDA
PAD_ID, EOS_ID, CLS_ID, MASK_ID = (T.SPECIALS.index(s) for s in (T.PAD, T.EOS, T.CLS, T.MASK))
SPECIAL_TOKENS = {"pad_token": T.PAD, "cls_token": T.CLS, "sep_token": T.EOS, "eos_token": T.EOS, "mask_token": T.MASK}


class TrainConfig(Config):
    steps: PositiveInt = Field(1000, description="pre-training optimizer steps")
    batch_size: PositiveInt = Field(128, description="texts per micro-batch per process")
    max_len: PositiveInt = Field(64, description="tokens per example, <cls> and <eos> included (longer texts are cut)")
    mask_prob: float = Field(0.15, gt=0.0, lt=1.0, description="share of tokens selected for prediction")


class FinetuneConfig(Config):
    enabled: bool = Field(True, description="fine-tune a classifier after pre-training")
    train: Path | None = Field(None, description="labelled TSV (text<TAB>label); null: WordNet gloss -> part of speech")
    valid: Path | None = Field(None, description="labelled TSV; null: the WordNet valid split, or a share of finetune.train")
    valid_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="held out of finetune.train when finetune.valid is null")
    train_limit: PositiveInt | None = Field(None, description="use only N training examples")
    steps: PositiveInt = Field(300, description="fine-tuning optimizer steps")
    batch_size: PositiveInt = Field(64, description="labelled texts per step")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="the classifier's dropout")
    lora: LoraSpec | None = Field(None, description="fine-tune low-rank adapters and the classifier instead of every "
                                  "weight: {rank, alpha, dropout, targets: [q, k, v, o, ffn]} (zoo.finetune.LoraSpec); "
                                  "the adapters are saved alone beside the merged export")
    eval_every: PositiveInt | None = Field(None, description="steps between evaluations; default: once an epoch")
    checkpoint_every: PositiveInt | None = Field(None, description="steps between checkpoints; default: once an epoch")
    optim: OptimConfig = OptimConfig(lr=3e-4, weight_decay=0.01)
    schedule: ScheduleConfig = ScheduleConfig(warmup=30)


class MLMConfig(Config):
    init: Path | None = Field(None, description="start from these weights: a zoo file, or an HF model directory "
                              "(converted on the fly), trained on with the model's own tokenizer (its template and "
                              "mask token); null: the model spec from random weights and a BPE trained on the data")
    model: str = Field("bert-mini", description="without init: an encoder preset or spec YAML")
    model_overrides: list[str] = Field([], description="key=value overrides of the model spec (with init: only those "
                                       "that keep the weights meaningful: dropout, windows, the head)")
    data: TextDataConfig = TextDataConfig()
    train: TrainConfig = TrainConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    run: RunConfig = RunConfig(out_dir=Path("runs/mlm"))


class Vocab:
    """The tokenizer and the ids masking needs: the recipe's BPE (``<pad> <eos> <cls> <mask>`` as ids
    0-3; examples ``<cls> text <eos>``) or, with ``own`` (a ``zoo.tokens.ModelTokenizer``), the
    model's tokenizer: its template (``[CLS] text [SEP]``), pad and mask tokens, and its special
    tokens never masked; random replacements drawn from its whole vocabulary, as HF's collator does."""

    def __init__(self, tok, own=None, where: str = "") -> None:
        self.tok, self.own, self.size = tok, own, tok.get_vocab_size()
        if own is None:
            self.pad, self.mask, self.special, self.first_regular = PAD_ID, MASK_ID, list(range(len(T.SPECIALS))), len(T.SPECIALS)
            return
        name = own.special_tokens.get("mask_token")
        if name is None:  # older folders name it nowhere but in tokenizer.json's special tokens (bert-base-uncased)
            name = next((t.content for t in tok.get_added_tokens_decoder().values()
                         if t.special and t.content in ("[MASK]", "<mask>")), None)
        self.mask = tok.token_to_id(name) if name else None
        if self.mask is None:
            raise TrainError(f"{where}: its tokenizer names no mask token (tokenizer_config.json mask_token, or a "
                             f"special [MASK] / <mask> in tokenizer.json); masked language modelling needs one")
        self.pad = own.pad_id if own.pad_id is not None else 0
        self.special = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
        self.first_regular = 0

    def examples(self, texts, max_len: int) -> list[list[int]]:
        """Each text as one example of at most ``max_len`` tokens, special tokens included."""
        if self.own is None:
            return [[CLS_ID, *ids[: max_len - 2], EOS_ID] for ids in bpe.encode(self.tok, texts)]
        self.tok.enable_truncation(max_len)
        try:
            return [e.ids for e in self.tok.encode_batch(list(texts))]
        finally:
            self.tok.no_truncation()


def pack(cfg: MLMConfig, rows: list[list[int]]) -> tuple[list[list[int]], list[list[int]] | None]:
    """The examples as ``data.packing`` says: packed into rows of ``train.max_len`` (with their
    example ids for document masks, or None to attend across them), or one a row."""
    if cfg.data.packing == "pad":
        return rows, None
    packed, ids = T.pack_examples(rows, cfg.train.max_len)
    return packed, ids if cfg.data.packing == "documents" else None


def mlm_batch(rows, mask_prob: float, vocab: Vocab, generator: torch.Generator, docs=None):
    """(inputs, padding mask, labels, document ids or None) of ``rows``, BERT-masked (per document)."""
    tokens, pad_mask = T.pad_batch(rows, pad_id=vocab.pad)
    documents = None if docs is None else T.pad_batch(docs, pad_id=-1)[0]
    maskable = pad_mask & ~torch.isin(tokens, torch.tensor(vocab.special))
    inputs, labels = T.mask_tokens(tokens, maskable, mask_id=vocab.mask, vocab_size=vocab.size, prob=mask_prob,
                                   first_regular=vocab.first_regular, generator=generator, documents=documents)
    return inputs, pad_mask, labels, documents


# --------------------------------------------------------------------------------------- pre-train
def pretrain(cfg: MLMConfig, resume: str | None, dist, out: Path):
    device = dist.device
    cfg.run.precision = resolve_precision(cfg.run.precision, device)
    ckpt_path = resolve_resume(resume, out)
    t0 = time.perf_counter()
    train_texts, valid_texts, source = load_text(cfg.data)
    seed_everything(cfg.run.seed)
    start = None
    if cfg.init is not None:
        if cfg.data.tokenizer is not None:
            raise TrainError(f"data.tokenizer={cfg.data.tokenizer}: with init= the model's own tokenizer is used "
                             f"(tokenizer.json beside the weights); drop data.tokenizer")
        start = pretrained(cfg.init, families=("encoder",), recipe="mlm.py", overrides=cfg.model_overrides,
                           work_dir=out / "init", dist=dist, seed=cfg.run.seed)
        dist.print(start.describe())
        own = own_tokenizer(start.folder, start.spec.vocab_size, where=f"init={cfg.init}")
        vocab, how = Vocab(own.tokenizer, own, where=f"init={cfg.init}"), f"the model's own ({own.path})"
    else:
        tok, how = get_tokenizer(cfg.data, train_texts.texts, out, dist, resume=ckpt_path is not None)
        vocab, how = Vocab(tok), f"BPE {how}"
    tok, V = vocab.tok, vocab.size
    texts = vocab.examples(train_texts.texts, cfg.train.max_len)
    train_rows, train_docs = pack(cfg, texts)
    valid_rows, valid_docs = pack(cfg, vocab.examples(valid_texts.texts, cfg.train.max_len))
    n_tok = sum(map(len, train_rows))
    how_rows = {"documents": "packed with document masks", "concat": "packed, attending across texts",
                "pad": "one text a row"}[cfg.data.packing]
    dist.print(f"data: {source}: {len(texts):,} train / {len(valid_texts):,} valid texts ({n_tok:,} train tokens) in "
               f"{len(train_rows):,} rows ({how_rows}); tokenizer {how}: {V:,} tokens; {time.perf_counter() - t0:.1f}s")

    # fixed validation masks: every evaluation scores the same positions
    g = torch.Generator().manual_seed(4321)
    valid = [mlm_batch([valid_rows[i] for i in b], cfg.train.mask_prob, vocab, g,
                       None if valid_docs is None else [valid_docs[i] for i in b])
             for b in eval_batches(valid_rows, cfg.train.batch_size, 0, 1)]
    special = set(vocab.special)
    counts = torch.bincount(torch.tensor([t for r in train_rows for t in r if t not in special]), minlength=V)
    top = int(counts.argmax())
    targets = torch.cat([lab[lab != -100] for _, _, lab, _ in valid])
    baseline = float((targets == top).double().mean())
    dist.print(f"most-frequent-token baseline ({tok.id_to_token(top)!r}): masked-token accuracy {baseline:.2%} "
               f"on {targets.numel():,} masked valid tokens")
    mine = valid[dist.rank :: dist.world_size]

    spec = zoo.load_spec(cfg.model, [*cfg.model_overrides, f"vocab_size={V}"]) if start is None else start.spec
    if spec.family != "encoder":
        raise TrainError(f"model {cfg.model!r} is a {spec.family}; masked language modelling needs an encoder")
    if spec.max_seq_len < cfg.train.max_len:
        raise TrainError(f"model max_seq_len {spec.max_seq_len} < train.max_len {cfg.train.max_len}")
    model = (zoo.build(spec, seed=cfg.run.seed) if start is None else start.model).to(device)
    dist.print(f"model: {cfg.model if start is None else cfg.init} ({spec.name}), {zoo.count_parameters(model) / 1e6:.2f}M parameters, "
               f"{dist.world_size} process(es) on {device}, {cfg.run.precision}")

    task = MLMTask(cfg, dist, train_rows, mine, vocab, train_docs)
    fitted = fit(model, task, optim=cfg.optim, schedule=cfg.schedule, run=cfg.run, dist=dist, total_steps=cfg.train.steps,
                 resume=ckpt_path, config=cfg.model_dump(mode="json"))
    model, last, train_s = fitted.best, fitted.best_valid, fitted.train_seconds
    acc = last["accuracy"]
    dist.print(f"valid masked-token accuracy {acc:.2%} (loss {last['loss']:.3f}) vs most-frequent-token "
               f"{baseline:.2%}; pre-training {train_s / 60:.1f} min")
    if dist.is_main:
        model_dir = out / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        zoo.save(model, model_dir / "model.safetensors")
        export_vocab(vocab, model_dir, start)
        atomic_write_text(model_dir / "config.yaml", config_to_yaml(cfg))
        dist.print(f"exported {model_dir}/model.safetensors and tokenizer.json")
    results = {"mlm_accuracy": acc, "mlm_loss": last["loss"], "baseline_accuracy": baseline, "pretrain_seconds": train_s,
               "init": None if start is None else start.report()}
    return model, (vocab, start), (train_texts, valid_texts), results


def export_vocab(vocab: Vocab, model_dir: Path, start) -> None:
    """The tokenizer beside an exported model: the model's own files, or the recipe's BPE with the
    template ``<cls> a <eos> [b <eos>]`` (how classify.py init= encodes) and its special tokens named."""
    if start is not None:
        for name in SIDECARS:
            if (start.folder / name).is_file():
                shutil.copyfile(start.folder / name, model_dir / name)
        return
    recipe_template(vocab.tok)
    export_tokenizer(vocab.tok, model_dir, **SPECIAL_TOKENS)


# --------------------------------------------------------------------------------------- fine-tune
def finetune_data(cfg: MLMConfig, splits) -> tuple[Labelled, Labelled, str] | None:
    ft = cfg.finetune
    if ft.train is not None:
        train = read_labelled(ft.train)
        if ft.valid is not None:
            valid = read_labelled(ft.valid)
        else:
            train, valid = split_labelled(train, ft.valid_fraction, cfg.data.split_seed)
        return train, valid, str(ft.train)
    if cfg.data.text:
        return None
    train, valid = splits  # the WordNet split, labelled with each gloss's part of speech
    return Labelled(train.texts, train.labels), Labelled(valid.texts, valid.labels), "WordNet gloss -> part of speech"


def finetune(cfg: MLMConfig, resume: str | None, dist, out: Path, encoder, tokens, splits) -> dict:
    ft = cfg.finetune
    device = dist.device
    data = finetune_data(cfg, splits)
    if data is None:
        dist.print("fine-tuning skipped: data.text has no labels; give finetune.train=FILE.tsv (text<TAB>label)")
        return {}
    train, valid, source = data
    if ft.train_limit:
        train = train.take(ft.train_limit)
    names = sorted(set(train.labels))
    label_id = {n: i for i, n in enumerate(names)}
    vocab, start = tokens
    tok = vocab.tok
    if vocab.own is None:
        recipe_template(tok)  # <cls> text <eos>, pairs <cls> a <eos> b <eos>; a model's own has its template
    train_enc = encode_labelled(tok, train, label_id, cfg.train.max_len)
    valid_enc = encode_labelled(tok, valid, label_id, cfg.train.max_len)
    majority_label, baseline = majority(train, valid_enc.labels, label_id)
    dist.print(f"fine-tuning data: {source}: {len(train):,} train / {len(valid):,} valid, labels {names}; "
               f"majority-class baseline ({majority_label}) accuracy {baseline:.2%}")

    ft_dir = out / "finetune"
    segments = train.seconds is not None and encoder.spec.type_vocab_size < 2
    spec = zoo.load_spec(encoder.spec.model_dump(mode="json"),
                         [f"classifier={{num_labels: {len(names)}, dropout: {ft.dropout}}}",
                          *(["type_vocab_size=2"] if segments else [])])
    seed_everything(cfg.run.seed + 1)
    model = zoo.build(spec, seed=cfg.run.seed + 1).to(device)
    missing, unexpected = model.load_state_dict(encoder.state_dict(), strict=False)
    if unexpected or any(not k.startswith(("classifier.", "type_emb.")) for k in missing):
        raise TrainError(f"pre-trained weights do not fit the classifier model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model = Classifying(with_adapters(model, ft.lora, trainable=("classifier",), run=cfg.run, dist=dist))
    ckpt_path = resolve_resume(resume, ft_dir, required=False)

    task = ClassifyTask(dist, cfg.run.grad_accum, train_enc, valid_enc, batch_size=ft.batch_size, seed=cfg.run.seed + 1,
                        pad_id=vocab.pad, segments=spec.type_vocab_size > 1)
    run = cfg.run.model_copy(update={"out_dir": ft_dir, "eval_every": ft.eval_every, "checkpoint_every": ft.checkpoint_every})
    fitted = fit(model, task, optim=ft.optim, schedule=ft.schedule, run=run, dist=dist, total_steps=ft.steps,
                 resume=ckpt_path, config=cfg.model_dump(mode="json"))
    model, last, secs = fitted.best, fitted.best_valid, fitted.train_seconds
    acc = last["accuracy"]
    dist.print(f"fine-tuned valid accuracy {acc:.2%} vs majority class {baseline:.2%}; fine-tuning {secs / 60:.1f} min")
    if dist.is_main:
        model_dir = ft_dir / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        zoo.save(export_adapters(model.encoder, model_dir, base=str(out / "model" / "model.safetensors")),
                 model_dir / "model.safetensors")
        export_vocab(vocab, model_dir, start)
        atomic_write_text(model_dir / "labels.json", json.dumps(names) + "\n")
        dist.print(f"exported {model_dir}/model.safetensors, tokenizer.json and labels.json")
    return {"finetune_accuracy": acc, "majority_accuracy": baseline, "finetune_seconds": secs}


class MLMTask(LengthBatched):
    """BERT's masked-token prediction; the masks of a step depend on (seed, rank, step) alone."""

    name = "mlm"
    panels = [("loss", ["train/loss", "valid/loss"]), ("masked-token accuracy", ["valid/accuracy"]),
              ("tokens/s", ["train/tokens_per_s"])]

    def __init__(self, cfg: MLMConfig, dist, rows, valid_batches, vocab: Vocab, docs=None) -> None:
        super().__init__(dist, cfg.run.grad_accum, rows, cfg.train.batch_size, cfg.run.seed)
        self.cfg, self.valid, self.vocab, self.docs = cfg, valid_batches, vocab, docs
        self._gen: tuple[int, torch.Generator] | None = None

    def loss(self, model, batch, step):
        if self._gen is None or self._gen[0] != step:
            seed = (self.cfg.run.seed * 1_000_003 + step) * 1009 + self.dist.rank
            self._gen = (step, torch.Generator().manual_seed(seed))
        docs = None if self.docs is None else [self.docs[i] for i in batch]
        inputs, pad_mask, labels, documents = (None if x is None else x.to(self.dist.device) for x in mlm_batch(
            [self.rows[i] for i in batch], self.cfg.train.mask_prob, self.vocab, self._gen[1], docs))
        # the masked tokens' mean cross-entropy, from the head without the [B, T, V] logits (zoo.kernels.loss)
        loss = model(inputs, pad_mask, documents=documents, targets=labels, reduction="mean")
        masked = float((labels != -100).sum())
        return loss, {"tokens": float(pad_mask.sum()), "masked_loss": float(loss.detach()) * masked, "masked": masked}

    def train_values(self, sums: dict[str, float], seconds: float) -> dict[str, float]:
        """A micro-batch's gradient is its masked tokens' mean loss (each micro-batch weighs the same);
        the logged loss is the mean over every masked token of the window on all processes."""
        return {"loss": sums["masked_loss"] / max(sums["masked"], 1.0), "tokens_per_s": sums["tokens"] / max(seconds, 1e-9)}

    def evaluate(self, model) -> dict[str, float]:
        device = self.dist.device
        total = torch.zeros(3, dtype=torch.float64, device=device)
        for inputs, pad_mask, labels, documents in self.valid:
            inputs, pad_mask, labels = inputs.to(device), pad_mask.to(device), labels.to(device)
            logits = model(inputs, pad_mask, documents=None if documents is None else documents.to(device)).float()
            sel = labels != -100
            loss = F.cross_entropy(logits[sel], labels[sel], reduction="sum")
            correct = (logits[sel].argmax(-1) == labels[sel]).sum()
            total += torch.stack([loss.double(), correct.double(), sel.sum().double()])
        self.dist.all_reduce(total)
        return {"loss": float(total[0] / total[2]), "accuracy": float(total[1] / total[2])}


def train(cfg: MLMConfig, resume: str | None, dist) -> dict:
    t0 = time.perf_counter()
    out = Path(cfg.run.out_dir)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    model, tokens, splits, results = pretrain(cfg, resume, dist, out)
    if cfg.finetune.enabled:
        results.update(finetune(cfg, resume, dist, out, model, tokens, splits))
    dist.print(f"total {(time.perf_counter() - t0) / 60:.1f} min")
    return results


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(MLMConfig, argv, default=DEFAULT_CONFIG, gpu=GPU_CONFIG, description=__doc__)
    tune_malloc()
    try:
        with distributed(cfg.run.device) as dist:
            train(cfg, args.resume, dist)
    except (TrainError, T.DataError, SpecError) as e:
        print(f"mlm.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
