"""Train a GPT-style causal language model on plain text, report validation perplexity against a
unigram baseline, sample from it, and export it with its tokenizer.

    python recipes/lm.py                                   # the embedded default: WordNet glosses, CPU, ~10 min
    python recipes/lm.py model=gpt2-small data.text=[corpus/] train.steps=20000 ...
    torchrun --nproc_per_node 8 recipes/lm.py --config my.yaml
    python recipes/lm.py --resume                          # continue exactly where the run stopped
    zoo ablate recipes/ablations/lm-moe.yaml               # dense vs mixture of experts at equal active parameters

Data (``data.text``): plain-text files or folders of ``*.txt`` (one document a line); without it, the
glosses of WordNet (Debian's ``wordnet-base``). A byte-level BPE is trained on the training split
(or ``data.tokenizer`` is used); ``<eos>`` opens each document, and ``data.packing`` makes rows of
``train.block_len`` tokens: ``documents`` (default: documents one after another, each attending only
to itself with its positions from 0), ``concat`` (the same rows attending across documents) or
``pad`` (one document a row, padded). Any decoder spec works (``model``: a preset or a YAML file), a mixture
of experts too (``block.ffn.kind=moe``: the loop adds its router losses and logs its experts' load).
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

from text_data import TextDataConfig, get_tokenizer, load_text  # beside this script: shared with mlm.py

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
    model: str = Field("llama-tiny", description="a decoder preset or spec YAML")
    model_overrides: list[str] = Field([], description="key=value overrides of the model spec")
    data: TextDataConfig = TextDataConfig()
    train: TrainConfig = TrainConfig()
    sample: SampleConfig = SampleConfig()
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


def make_rows(cfg: LMConfig, docs: list[list[int]], eos: int, max_position: int | None) -> T.Rows:
    """The documents as training rows, as ``data.packing`` says."""
    L = cfg.train.block_len
    if cfg.data.packing == "documents":
        return T.pack_documents(docs, L, eos_id=eos, max_position=max_position)
    if cfg.data.packing == "pad":
        return T.pad_documents(docs, L, eos_id=eos, pad_id=T.SPECIALS.index(T.PAD))
    return T.Rows(T.pack_blocks(docs, L, eos_id=eos))


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
    tok, how = get_tokenizer(cfg.data, train_texts.texts, out, dist, resume=ckpt_path is not None)
    V, eos = tok.get_vocab_size(), tok.token_to_id(T.EOS)
    L = cfg.train.block_len
    spec = zoo.load_spec(cfg.model, [*cfg.model_overrides, f"vocab_size={V}"])
    if spec.family != "decoder":
        raise TrainError(f"model {cfg.model!r} is a {spec.family}; a causal language model needs a decoder")
    if spec.max_seq_len < L:
        raise TrainError(f"model max_seq_len {spec.max_seq_len} < train.block_len {L}; lower block_len or override max_seq_len")
    train_rows = make_rows(cfg, bpe.encode(tok, train_texts.texts), eos, spec.max_seq_len)
    valid_rows = make_rows(cfg, bpe.encode(tok, valid_texts.texts), eos, spec.max_seq_len)
    real = (lambda r: r.tokens[:, 1:] if r.padding is None else r.tokens[:, 1:][r.padding[:, 1:]])  # noqa: E731
    unigram = T.unigram_perplexity(real(train_rows), real(valid_rows), V)
    slots = train_rows.tokens[:, 1:].numel()
    packing = {"documents": "packed with document masks", "concat": "packed, attending across documents",
               "pad": "one document a row, padded"}[cfg.data.packing]
    dist.print(f"data: {source}: {len(train_texts):,} train / {len(valid_texts):,} valid texts; BPE {how}: {V:,} tokens; "
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
    seed_everything(cfg.run.seed)
    model = zoo.build(spec, seed=cfg.run.seed).to(device)
    params, active = zoo.count_parameters(model), active_parameters(model)
    dist.print(f"model: {cfg.model} ({spec.name}), {params / 1e6:.2f}M parameters"
               + (f" ({active / 1e6:.2f}M active per token)" if active != params else "")
               + f", {dist.world_size} process(es) on {device}, {cfg.run.precision}")

    task = LMTask(cfg, dist, train_rows, valid_rows)
    fitted = fit(model, task, optim=cfg.optim, schedule=cfg.schedule, run=cfg.run, dist=dist, total_steps=cfg.train.steps,
                 resume=ckpt_path, config=cfg.model_dump(mode="json"), minutes=cfg.train.minutes)
    model, valid, train_s = fitted.best, fitted.best_valid, fitted.train_seconds
    ppl = valid["ppl"]
    dist.print(f"valid perplexity {ppl:.2f} (loss {valid['loss']:.3f}) vs unigram {unigram:.1f}: "
               f"{versus_unigram(ppl, unigram)}; training {train_s / 60:.1f} min")

    # samples and export
    results = {"params": params, "active_params": active, "steps": fitted.step, "valid_ppl": ppl,
               "valid_loss": valid["loss"], "unigram_ppl": unigram, "train_seconds": train_s,
               "padding": round(1 - train_rows.targets / slots, 4)}
    if dist.is_main:
        atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
        model.eval()
        g = torch.Generator(device=device).manual_seed(cfg.sample.seed)
        for prompt in cfg.sample.prompts:
            ids = [eos, *tok.encode(prompt, add_special_tokens=False).ids]  # <eos> opens a document
            gen = zoo.generate(model, torch.tensor([ids], device=device), max_new_tokens=cfg.sample.max_new_tokens,
                               do_sample=True, top_p=cfg.sample.top_p, temperature=cfg.sample.temperature,
                               generator=g, eos_id=eos)
            new = [t for t in gen.tokens[0].tolist() if t != eos]
            print(f"  sample: {prompt}|{tok.decode(new)}", flush=True)
        model_dir = out / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        zoo.save(model, model_dir / "model.safetensors")
        shutil.copyfile(cfg.data.tokenizer or out / "tokenizer.json", model_dir / "tokenizer.json")
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
