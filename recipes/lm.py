"""Train a GPT-style causal language model on plain text, report validation perplexity against a
unigram baseline, sample from it, and export it with its tokenizer.

    python recipes/lm.py                                   # the embedded default: WordNet glosses, CPU, ~15 min
    python recipes/lm.py model=gpt2-small data.text=[corpus/] train.steps=20000 ...
    torchrun --nproc_per_node 8 recipes/lm.py --config my.yaml
    python recipes/lm.py --resume                          # continue exactly where the run stopped
    python recipes/lm.py init=my-llama/ data.text=[corpus/] # fine-tune a downloaded decoder with its own tokenizer
    zoo ablate recipes/ablations/lm-moe.yaml               # dense vs mixture of experts at equal active parameters

Data (``data.text``): plain-text files or folders of ``*.txt`` (one document a line); without it, the
glosses of WordNet (Debian's ``wordnet-base``). A byte-level BPE is trained on the training split
(or ``data.tokenizer`` is used); ``<eos>`` opens each document, and ``data.packing`` makes rows of
``train.block_len`` tokens: ``documents`` (default: documents one after another, each attending only
to itself with its positions from 0), ``concat`` (the same rows attending across documents) or
``pad`` (one document a row, padded). Any decoder spec works (``model``: a preset or a YAML file), a mixture
of experts too (``block.ffn.kind=moe``: the loop adds its router losses and logs its experts' load).
With ``init`` (a zoo file, or an HF directory converted on the fly) the run starts from those weights
and the model's own tokenizer (``tokenizer.json`` and the special tokens beside it): bos opens each
document and eos ends it; the valid perplexity before training is reported beside the one after.
The run writes ``results.json`` (parameters, valid perplexity) for ``zoo ablate``. See
docs/recipes/lm.md.
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
from zoo.data import bpe
from zoo.data import text as T
from zoo.spec import SpecError
from zoo.summary import active_parameters
from zoo.tokens import SIDECARS
from zoo.train import (
    Config,
    ListTask,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrainError,
    config_to_yaml,
    distributed,
    fit,
    parse_args,
    perplexity,
    resolve_precision,
    resolve_resume,
    seed_everything,
    tune_malloc,
)
from zoo.train.adapters import AdapterConfig, export_adapters, with_adapters
from zoo.train.pretrained import pretrained

from text_data import TextDataConfig, export_tokenizer, get_tokenizer, load_text, own_tokenizer  # beside this script

DEFAULT_CONFIG = Path(__file__).with_name("lm.yaml")
GPU_CONFIG = Path(__file__).with_name("lm.gpu.yaml")  # laid under the user's settings on CUDA


class TrainConfig(Config):
    steps: PositiveInt = Field(1000, description="optimizer steps")
    batch_size: PositiveInt = Field(32, description="blocks per micro-batch per process")
    block_len: PositiveInt = Field(128, description="tokens of context per block")
    minutes: PositiveFloat | None = Field(None, description="stop after this much wall-clock training (the schedule "
                                          "then follows the clock); null: train.steps alone")


class SampleConfig(Config):
    prompts: list[str] = Field(["a", "the act of", "a person who"], description="texts the model continues after training")
    max_new_tokens: PositiveInt = Field(40, description="tokens sampled after each prompt")
    temperature: PositiveFloat = Field(0.8, description="sampling temperature")
    top_p: float = Field(0.9, gt=0.0, le=1.0, description="nucleus sampling: the smallest set of tokens with this mass")
    seed: int = Field(0, description="seeds the sampling")


class LMConfig(Config):
    init: Path | None = Field(None, description="start from these weights: a zoo file, or an HF model directory "
                              "(converted on the fly), trained on with the model's own tokenizer (tokenizer.json "
                              "beside it); null: the model spec from random weights and a BPE trained on the data")
    model: str = Field("llama-tiny", description="without init: a decoder preset or spec YAML")
    model_overrides: list[str] = Field([], description="key=value overrides of the model spec (with init: only those "
                                       "that keep the weights meaningful: dropout, windows, max_seq_len)")
    data: TextDataConfig = TextDataConfig()
    train: TrainConfig = TrainConfig()
    sample: SampleConfig = SampleConfig()
    finetune: AdapterConfig = AdapterConfig()
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    run: RunConfig = RunConfig(out_dir=Path("runs/lm"))


def lm_loss(model, rows: T.Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy over ``rows`` (tokens [B, L+1], with their document masks or
    padding) and the number of targets: what ``F.cross_entropy(logits.float(), targets, reduction="sum")``
    gives, computed by the model's head without materialising the logits."""
    extra = {} if rows.documents is None else {"documents": rows.documents[:, :-1], "positions": rows.positions[:, :-1]}
    padding = None if rows.padding is None else rows.padding[:, :-1]
    targets = rows.tokens[:, 1:]
    if rows.padding is not None:
        targets = targets.masked_fill(~rows.padding[:, 1:], -100)
    # the head computes the loss chunk by chunk, never holding the [B, L, V] logits (zoo.kernels.loss)
    loss = model(rows.tokens[:, :-1], padding, **extra, targets=targets)
    return loss, torch.tensor(rows.targets)


def make_rows(cfg: LMConfig, docs: list[list[int]], opener: int, max_position: int | None, pad_id: int) -> T.Rows:
    """The documents as training rows, as ``data.packing`` says, each opened by ``opener``."""
    L = cfg.train.block_len
    if cfg.data.packing == "documents":
        return T.pack_documents(docs, L, eos_id=opener, max_position=max_position)
    if cfg.data.packing == "pad":
        return T.pad_documents(docs, L, eos_id=opener, pad_id=pad_id)
    return T.Rows(T.pack_blocks(docs, L, eos_id=opener))


class Tokens:
    """The run's tokenizer and its special ids: the model's own (``init``: bos opens each document,
    eos ends it) or the recipe's BPE (``<eos>`` between documents)."""

    def __init__(self, cfg: LMConfig, train_texts, out: Path, dist, resume: bool, start) -> None:
        if start is None:
            self.tok, self.how = get_tokenizer(cfg.data, train_texts, out, dist, resume=resume)
            self.eos_ids = (self.tok.token_to_id(T.EOS),)
            self.opener, self.closer, self.pad_id = self.eos_ids[0], None, T.SPECIALS.index(T.PAD)
            self.own = None
            return
        if cfg.data.tokenizer is not None:
            raise TrainError(f"data.tokenizer={cfg.data.tokenizer}: with init= the model's own tokenizer is used "
                             f"(tokenizer.json beside the weights); drop data.tokenizer")
        own = own_tokenizer(start.folder, start.spec.vocab_size, where=f"init={cfg.init}")
        if not own.eos_ids:
            raise TrainError(f"init={cfg.init}: its tokenizer names no eos token (generation_config.json eos_token_id, "
                             f"or tokenizer_config.json eos_token); documents need one to end")
        self.own, self.tok, self.how = own, own.tokenizer, f"the model's own ({own.path})"
        self.eos_ids = tuple(own.eos_ids)
        self.opener = own.bos_id if own.bos_id is not None else self.eos_ids[0]
        self.closer = self.eos_ids[0] if own.bos_id is not None and own.bos_id != self.eos_ids[0] else None
        self.pad_id = own.pad_id if own.pad_id is not None else self.eos_ids[0]

    def docs(self, texts) -> list[list[int]]:
        ids = bpe.encode(self.tok, texts)
        return ids if self.closer is None else [d + [self.closer] for d in ids]


class LMTask(ListTask):
    """Next-token prediction on blocks of ``train.block_len + 1`` tokens: each epoch a seeded
    permutation of the blocks, cut into full micro-batches."""

    name = "lm"
    panels = [("loss", ["train/loss", "valid/loss"]), ("valid perplexity", ["valid/ppl"]),
              ("tokens/s", ["train/tokens_per_s"])]

    def __init__(self, cfg: LMConfig, dist, train_rows: T.Rows, valid_rows: T.Rows) -> None:
        super().__init__(dist, cfg.run.grad_accum)
        self.cfg, self.train_rows, self.valid_blocks = cfg, train_rows, valid_rows
        self.valid_rows = list(range(len(valid_rows)))[dist.rank :: dist.world_size]

    def batches(self, epoch: int) -> list[torch.Tensor]:
        n, size = len(self.train_rows), self.cfg.train.batch_size
        g = torch.Generator().manual_seed(self.cfg.run.seed * 100_003 + epoch)
        return list(torch.randperm(n, generator=g)[: n // size * size].split(size))

    def loss(self, model, batch, step):
        loss, n = lm_loss(model, self.train_rows.take(batch).to(self.dist.device))
        return loss / n, {"tokens": float(n)}

    def evaluate(self, model) -> dict[str, float]:
        device, size = self.dist.device, self.cfg.train.batch_size
        total = torch.zeros(2, dtype=torch.float64, device=device)
        for i in range(0, len(self.valid_rows), size):
            loss, n = lm_loss(model, self.valid_blocks.take(self.valid_rows[i : i + size]).to(device))
            total += torch.stack([loss.double(), n.double().to(device)])
        self.dist.all_reduce(total)
        nll = float(total[0] / total[1])
        return {"loss": nll, "ppl": perplexity(nll)}


def train(cfg: LMConfig, resume: str | None, dist) -> dict:
    t_start = time.perf_counter()
    device = dist.device
    cfg.run.precision = resolve_precision(cfg.run.precision, device)
    out = Path(cfg.run.out_dir)
    ckpt_path = resolve_resume(resume, out)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)

    # text, tokenizer, blocks
    t0 = time.perf_counter()
    train_texts, valid_texts, source = load_text(cfg.data)
    seed_everything(cfg.run.seed)
    start = None
    if cfg.init is not None:
        start = pretrained(cfg.init, families=("decoder",), recipe="lm.py", overrides=cfg.model_overrides,
                           work_dir=out / "init", dist=dist, seed=cfg.run.seed)
        dist.print(start.describe())
    toks = Tokens(cfg, train_texts.texts, out, dist, ckpt_path is not None, start)
    tok, how, eos = toks.tok, toks.how, toks.eos_ids[0]
    L = cfg.train.block_len
    if start is None:
        spec = zoo.load_spec(cfg.model, [*cfg.model_overrides, f"vocab_size={tok.get_vocab_size()}"])
    else:
        spec = start.spec
    V = spec.vocab_size
    if spec.family != "decoder":
        raise TrainError(f"model {cfg.model!r} is a {spec.family}; a causal language model needs a decoder")
    if spec.max_seq_len < L:
        raise TrainError(f"model max_seq_len {spec.max_seq_len} < train.block_len {L}; lower block_len or override max_seq_len")
    rows = {}
    for name, texts in (("train", train_texts.texts), ("valid", valid_texts.texts)):
        try:
            rows[name] = make_rows(cfg, toks.docs(texts), toks.opener, spec.max_seq_len, toks.pad_id)
        except T.DataError as e:
            more = "data.valid_fraction or data.max_valid" if name == "valid" else "data.text"
            raise T.DataError(f"the {name} split: {e}; give it more text ({more}) or lower train.block_len") from None
    train_rows, valid_rows = rows["train"], rows["valid"]
    real = (lambda r: r.tokens[:, 1:] if r.padding is None else r.tokens[:, 1:][r.padding[:, 1:]])  # noqa: E731
    unigram = T.unigram_perplexity(real(train_rows), real(valid_rows), V)
    slots = train_rows.tokens[:, 1:].numel()
    packing = {"documents": "packed with document masks", "concat": "packed, attending across documents",
               "pad": "one document a row, padded"}[cfg.data.packing]
    dist.print(f"data: {source}: {len(train_texts):,} train / {len(valid_texts):,} valid texts; tokenizer {how}: {V:,} tokens; "
               f"{len(train_rows):,} train / {len(valid_rows):,} valid rows of {L} ({packing}): "
               f"{train_rows.targets:,} train tokens in {slots:,} slots ({100 * (1 - train_rows.targets / slots):.1f}% padding); "
               f"{time.perf_counter() - t0:.1f}s")
    if train_rows.split:
        cut = {"pad": "longer than a row were cut to it, the rest dropped",
               "documents": "ran past a row's end and go on in the next row, their positions continuing",
               "concat": "ran past a row's end and go on in the next row"}[cfg.data.packing]
        dist.print(f"data: {train_rows.split:,} training documents {cut}")
    dist.print(f"unigram baseline (add-one, fit on train): valid perplexity {unigram:.1f}")

    # model
    model = (zoo.build(spec, seed=cfg.run.seed) if start is None else start.model).to(device)
    model = with_adapters(model, cfg.finetune.lora, run=cfg.run, dist=dist)
    params, active = zoo.count_parameters(model), active_parameters(model)
    dist.print(f"model: {cfg.model if start is None else cfg.init} ({spec.name}), {params / 1e6:.2f}M parameters"
               + (f" ({active / 1e6:.2f}M active per token)" if active != params else "")
               + f", {dist.world_size} process(es) on {device}, {cfg.run.precision}")

    task = LMTask(cfg, dist, train_rows, valid_rows)
    first = None
    if start is not None and ckpt_path is None:  # where the pretrained weights start on this data
        with torch.no_grad():
            first = task.evaluate(model.eval())
        model.train()
        dist.print(f"valid perplexity before training {first['ppl']:.2f} (loss {first['loss']:.3f})")
    fitted = fit(model, task, optim=cfg.optim, schedule=cfg.schedule, run=cfg.run, dist=dist, total_steps=cfg.train.steps,
                 resume=ckpt_path, config=cfg.model_dump(mode="json"), minutes=cfg.train.minutes)
    model, valid, train_s = fitted.best, fitted.best_valid, fitted.train_seconds
    ppl = valid["ppl"]
    dist.print(f"valid perplexity {ppl:.2f} (loss {valid['loss']:.3f}) vs unigram {unigram:.1f}: "
               f"{versus_unigram(ppl, unigram)}; training {train_s / 60:.1f} min")

    # samples and export
    results = {"params": params, "active_params": active, "steps": fitted.step, "valid_ppl": ppl,
               "valid_loss": valid["loss"], "unigram_ppl": unigram, "train_seconds": train_s,
               "padding": round(1 - train_rows.targets / slots, 4),
               "start_valid_loss": None if first is None else first["loss"],
               "init": None if start is None else start.report()}
    if dist.is_main:
        atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
        model.eval()
        g = torch.Generator(device=device).manual_seed(cfg.sample.seed)
        for prompt in cfg.sample.prompts:
            ids = [toks.opener, *tok.encode(prompt, add_special_tokens=False).ids]  # as each document opens
            gen = zoo.generate(model, torch.tensor([ids], device=device), max_new_tokens=cfg.sample.max_new_tokens,
                               do_sample=True, top_p=cfg.sample.top_p, temperature=cfg.sample.temperature,
                               generator=g, eos_id=eos, stop_tokens=toks.eos_ids[1:])
            new = [t for t in gen.tokens[0].tolist() if t not in toks.eos_ids]
            print(f"  sample: {prompt}|{tok.decode(new)}", flush=True)
        model_dir = out / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        zoo.save(export_adapters(model, model_dir, base=None if cfg.init is None else str(cfg.init)),
                 model_dir / "model.safetensors")
        if start is None:  # <eos> opens each document: zoo generate starts prompts with it
            export_tokenizer(tok, model_dir, bos_token=T.EOS, eos_token=T.EOS, pad_token=T.PAD, add_bos=True)
        else:
            for name in SIDECARS:
                if (start.folder / name).is_file():
                    shutil.copyfile(start.folder / name, model_dir / name)
        atomic_write_text(model_dir / "config.yaml", config_to_yaml(cfg))
        print(f"exported {model_dir}/model.safetensors and tokenizer.json; total {(time.perf_counter() - t_start) / 60:.1f} min",
              flush=True)
    return results


def versus_unigram(ppl: float, unigram: float) -> str:
    """How the model's perplexity compares with the unigram model's, in words that stay true either way."""
    if ppl <= unigram:
        return f"{unigram / ppl:.1f}x lower"
    return f"{ppl / unigram:.1f}x higher: the model has not yet learned what word frequencies alone give"


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(LMConfig, argv, default=DEFAULT_CONFIG, gpu=GPU_CONFIG, description=__doc__)
    tune_malloc()
    try:
        with distributed(cfg.run.device) as dist:
            train(cfg, args.resume, dist)
    except (TrainError, T.DataError, SpecError) as e:
        print(f"lm.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
