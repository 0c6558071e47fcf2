"""Fine-tune an encoder to classify text (or pairs of texts): the GLUE-style path, from the weights a
user downloaded or pre-trained, or from scratch for comparison.

    python recipes/classify.py init=runs/mlm/model/model.safetensors    # the embedded default task
    python recipes/classify.py init=bert-base-uncased/ data.train=train.tsv data.valid=dev.tsv
    python recipes/classify.py model=bert-mini                           # the same task from random weights
    torchrun --nproc_per_node 8 recipes/classify.py init=... --config my.yaml

``init`` is a zoo file or an HF/timm model directory (converted on the fly); the encoder keeps its
weights and gains a pooled classifier (``[CLS]`` state, BERT's tanh pooler, dropout, linear), its MLM
head dropped; what was loaded, new and dropped is logged and written to results.json. Its own
tokenizer (``tokenizer.json`` beside the weights) encodes the examples with its template: ``[CLS] a
[SEP]`` or, for pairs, ``[CLS] a [SEP] b [SEP]`` with segment ids. Without ``init`` the ``model`` spec
starts from random weights with a BPE trained on the training texts (or ``data.tokenizer``).

Data (``data.train``/``data.valid``): TSV lines ``text<TAB>label`` or ``text<TAB>text<TAB>label``;
without them, the embedded default: WordNet glosses labelled with their part of speech (Debian's
wordnet-base). Reports validation accuracy against the majority class; exports the classifier with
its tokenizer and ``labels.json``. See docs/recipes/lm.md.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from pydantic import Field, PositiveFloat, PositiveInt

import zoo
from zoo.atomic import atomic_write_text
from zoo.data import text as T
from zoo.spec import SpecError
from zoo.train import (Config, OptimConfig, RunConfig, ScheduleConfig, TrainError, config_to_yaml, distributed, fit,
                       parse_args, resolve_precision, resolve_resume, seed_everything, tune_malloc)
from zoo.train.adapters import AdapterConfig, export_adapters, with_adapters
from zoo.train.pretrained import pretrained

from classify_data import (Classifying, ClassifyTask, Labelled, encode_labelled, majority, read_labelled,  # beside this script
                           recipe_template, split_labelled)
from text_data import get_tokenizer, own_tokenizer

DEFAULT_CONFIG = Path(__file__).with_name("classify.yaml")
SIDECARS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class DataConfig(Config):
    train: Path | None = Field(None, description="labelled TSV (text<TAB>label or text<TAB>text<TAB>label); null: "
                               "WordNet gloss -> part of speech")
    valid: Path | None = Field(None, description="labelled TSV; null: the WordNet valid split, or a share of data.train")
    valid_fraction: PositiveFloat | None = Field(None, lt=1.0, description="held out for validation when data.valid is "
                                                 "null; default 0.1 of data.train, 0.02 of WordNet (mlm.py's split)")
    max_valid: PositiveInt | None = Field(5000, description="at most this many validation examples")
    limit: PositiveInt | None = Field(None, description="use only N training examples (a seeded sample)")
    split_seed: int = Field(1234, description="seeds the train/valid split")
    wordnet_dir: Path = Field(Path("/usr/share/wordnet"), description="Debian's wordnet-base data.{noun,verb,adj,adv}")
    tokenizer: Path | None = Field(None, description="without init: an existing tokenizer.json (<pad> <eos> <cls> <mask> "
                                   "as ids 0-3) instead of training BPE; with init the model's own is used")
    vocab_size: PositiveInt = Field(8192, description="without init: the BPE vocabulary trained on the training texts")
    min_frequency: PositiveInt = Field(2, description="BPE: merge only pairs seen at least this often")
    max_len: PositiveInt = Field(64, description="tokens per example, special tokens included (longer ones are cut)")


class TrainConfig(Config):
    steps: PositiveInt = Field(300, description="optimizer steps")
    batch_size: PositiveInt = Field(64, description="examples per micro-batch per process")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="the classifier's dropout")


class ClassifyConfig(Config):
    init: Path | None = Field(None, description="start from these weights: a zoo file, or an HF/timm model directory "
                              "(converted on the fly); null: the model spec from random weights")
    model: str = Field("bert-mini", description="without init: an encoder preset or spec YAML")
    model_overrides: list[str] = Field([], description="key=value overrides of the model spec (with init: only those "
                                       "that keep the weights meaningful: dropout, windows, the classifier)")
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    finetune: AdapterConfig = AdapterConfig()
    optim: OptimConfig = OptimConfig(lr=5e-5, weight_decay=0.01)
    schedule: ScheduleConfig = ScheduleConfig(warmup=30)
    run: RunConfig = RunConfig(out_dir=Path("runs/classify"))


def load_data(cfg: ClassifyConfig) -> tuple[Labelled, Labelled, str]:
    """(train, valid, source) per ``cfg.data``."""
    d = cfg.data
    if d.train is not None:
        train = read_labelled(d.train)
        if d.valid is not None:
            valid = read_labelled(d.valid)
        else:
            train, valid = split_labelled(train, d.valid_fraction or 0.1, d.split_seed)
        source = str(d.train)
    else:
        texts = T.read_wordnet(d.wordnet_dir)
        tr, va = T.split_texts(texts, valid_fraction=d.valid_fraction or 0.02, seed=d.split_seed, max_valid=d.max_valid)
        train, valid, source = Labelled(tr.texts, tr.labels), Labelled(va.texts, va.labels), "WordNet gloss -> part of speech"
    if d.limit:  # a seeded sample: the files and WordNet's split keep their order (WordNet's parts of speech in turn)
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(d.split_seed + 1))[: d.limit].tolist()
        train = train.select(order)
    if d.max_valid:
        valid = valid.take(d.max_valid)
    return train, valid, source


def build_model(cfg: ClassifyConfig, names: list[str], train: Labelled, out: Path, dist, resume: bool):
    """(classifier model, tokenizer, pad id, init report or None); the classifier names the labels
    (what an HF export writes as ``id2label``)."""
    classifier = f"classifier={{num_labels: {len(names)}, dropout: {cfg.train.dropout}, labels: {json.dumps(names)}}}"
    if cfg.init is not None:
        start = pretrained(cfg.init, families=("encoder",), recipe="classify.py", work_dir=out / "init", dist=dist,
                           overrides=[*cfg.model_overrides, classifier, "head=none"], seed=cfg.run.seed)
        dist.print(start.describe())
        tok = own_tokenizer(start.folder, start.spec.vocab_size, where=f"init={cfg.init}")
        return start.model, tok.tokenizer, tok.pad_id if tok.pad_id is not None else 0, start, start.folder
    tok, how = get_tokenizer(cfg.data, train.texts + (train.seconds or []), out, dist, resume=resume)
    recipe_template(tok)
    dist.print(f"tokenizer: BPE {how}, {tok.get_vocab_size():,} tokens")
    segments = ["type_vocab_size=2"] if train.seconds is not None else []
    try:
        spec = zoo.load_spec(cfg.model, [*cfg.model_overrides, f"vocab_size={tok.get_vocab_size()}", *segments, classifier])
    except SpecError as e:
        raise TrainError(f"model: {e}") from None
    if spec.family != "encoder":
        raise TrainError(f"model {cfg.model!r} is a {spec.family}; classify.py fine-tunes an encoder")
    return zoo.build(spec, seed=cfg.run.seed), tok, T.SPECIALS.index(T.PAD), None, out


def train(cfg: ClassifyConfig, resume: str | None, dist) -> dict:
    t0 = time.perf_counter()
    cfg.run.precision = resolve_precision(cfg.run.precision, dist.device)
    out = Path(cfg.run.out_dir)
    ckpt_path = resolve_resume(resume, out)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    train_data, valid_data, source = load_data(cfg)
    names = sorted(set(train_data.labels))
    label_id = {n: i for i, n in enumerate(names)}
    seed_everything(cfg.run.seed)
    encoder, tok, pad_id, start, tok_dir = build_model(cfg, names, train_data, out, dist, ckpt_path is not None)
    spec = encoder.spec
    max_len = min(cfg.data.max_len, spec.max_seq_len)
    train_enc = encode_labelled(tok, train_data, label_id, max_len)
    valid_enc = encode_labelled(tok, valid_data, label_id, max_len)
    top, baseline = majority(train_data, valid_enc.labels, label_id)
    pairs = "pairs of texts" if train_data.seconds is not None else "texts"
    dist.print(f"data: {source}: {len(train_data):,} train / {len(valid_data):,} valid {pairs}, labels {names}; "
               f"majority-class baseline ({top}) accuracy {baseline:.2%}")
    encoder = with_adapters(encoder, cfg.finetune.lora, trainable=("classifier",), run=cfg.run, dist=dist)
    model = Classifying(encoder).to(dist.device)
    dist.print(f"model: {spec.name or 'encoder'}, {zoo.count_parameters(model) / 1e6:.2f}M parameters, "
               f"{dist.world_size} process(es) on {dist.device}, {cfg.run.precision}")

    task = ClassifyTask(dist, cfg.run.grad_accum, train_enc, valid_enc, batch_size=cfg.train.batch_size,
                        seed=cfg.run.seed, pad_id=pad_id, segments=spec.type_vocab_size > 1)
    with torch.no_grad():
        first = task.evaluate(model.eval())
    model.train()
    dist.print(f"valid accuracy before fine-tuning {first['accuracy']:.2%} (loss {first['loss']:.3f})")
    fitted = fit(model, task, optim=cfg.optim, schedule=cfg.schedule, run=cfg.run, dist=dist, total_steps=cfg.train.steps,
                 resume=ckpt_path, config=cfg.model_dump(mode="json"))
    model, best, secs = fitted.best, fitted.best_valid, fitted.train_seconds
    dist.print(f"valid accuracy {best['accuracy']:.2%} (loss {best['loss']:.3f}) vs majority class {baseline:.2%}; "
               f"training {secs / 60:.1f} min")
    results = {"accuracy": best["accuracy"], "loss": best["loss"], "start_accuracy": first["accuracy"],
               "start_loss": first["loss"], "majority_accuracy": baseline, "labels": names, "steps": fitted.step,
               "train_seconds": secs, "params": zoo.count_parameters(model),
               "init": None if start is None else start.report()}
    if dist.is_main:
        atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
        model_dir = out / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        base = None if cfg.init is None else str(cfg.init)
        zoo.save(export_adapters(model.encoder, model_dir, base=base), model_dir / "model.safetensors")
        if start is None:
            tok.save(str(model_dir / "tokenizer.json"))
        else:
            for name in SIDECARS:
                if (tok_dir / name).is_file():
                    shutil.copyfile(tok_dir / name, model_dir / name)
        atomic_write_text(model_dir / "labels.json", json.dumps(names) + "\n")
        atomic_write_text(model_dir / "config.yaml", config_to_yaml(cfg))
        dist.print(f"exported {model_dir}/model.safetensors, its tokenizer and labels.json; "
                   f"total {(time.perf_counter() - t0) / 60:.1f} min")
    return results


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(ClassifyConfig, argv, default=DEFAULT_CONFIG, description=__doc__)
    tune_malloc()
    try:
        with distributed(cfg.run.device) as dist:
            train(cfg, args.resume, dist)
    except (TrainError, T.DataError, SpecError) as e:
        print(f"classify.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
