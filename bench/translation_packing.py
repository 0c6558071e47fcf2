"""Useful target tokens a second of the translation recipe's training step, token buckets padded
against sentence pairs packed into rows with document masks (``data.packing``), on the embedded
corpus's real lengths (or lengths saved with ``--save-lengths``, for a machine without the corpus).

    python -m bench.translation_packing                       # CPU, the recipe's default model and batches
    python -m bench.translation_packing --device cuda --max-tokens 1024 16384 --lengths lens.json

The batches of each setting are drawn as the recipe draws them and timed interleaved, a few steps of
each in turn, so a machine's speed swings fall on every setting alike; random tokens of the real
lengths (the speed does not depend on which tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo
from bench.common import machine, sync
from zoo.data import translation as T


def corpus_lengths(recipe_dir: Path) -> tuple[list[int], list[int]]:
    """Source and target token counts of the default run's training pairs (its data and BPE)."""
    sys.path.insert(0, str(recipe_dir))
    import yaml
    from translate import DEFAULT_CONFIG, TranslateConfig  # noqa: E402  (recipes/)
    from translate_data import load_splits

    from zoo.data import bpe

    cfg = TranslateConfig(**yaml.safe_load(DEFAULT_CONFIG.read_text()))
    splits, _, _ = load_splits(cfg.data)
    train = splits["train"]
    tok = bpe.train_bpe(train.src + train.tgt, cfg.data.vocab_size, specials=T.SPECIALS, unk=T.UNK,
                        min_frequency=cfg.data.min_frequency)
    return tuple([len(x) for x in bpe.encode(tok, side, eos=T.EOS, max_len=cfg.data.max_len)]
                 for side in (train.src, train.tgt))


def settings(src_lens, tgt_lens, max_tokens: int, pack_lens: list[int], seed: int = 1) -> dict[str, list]:
    """Each setting's epoch of batches, as the recipe makes them."""
    out = {"pad": T.token_batches(src_lens, tgt_lens, max_tokens=max_tokens, seed=seed)}
    for L in pack_lens:
        out[f"packed {L}"] = T.packed_batches(src_lens, tgt_lens, src_len=T.source_row_len(src_lens, tgt_lens, L),
                                              tgt_len=L, max_tokens=max_tokens, seed=seed)
    return out


def measure(src_lens, tgt_lens, *, max_tokens: int, pack_lens: list[int], device: str, precision: str,
            rounds: int, steps: int, model_name: str) -> dict[str, float]:
    """Useful target tokens/s of a training step (forward, backward, Adam) for each setting."""
    vocab = 5000
    g = torch.Generator().manual_seed(0)
    src = [torch.randint(4, vocab, (n - 1,), generator=g).tolist() + [T.EOS_ID] for n in src_lens]
    tgt = [torch.randint(4, vocab, (n - 1,), generator=g).tolist() + [T.EOS_ID] for n in tgt_lens]
    spec = zoo.load_spec(model_name, ["dropout.embedding=0.0", "dropout.residual=0.0", "dropout.attention=0.0",
                                      f"vocab_size={vocab}"])
    model = zoo.build(spec, seed=1).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    dev = torch.device(device)

    def step(batch, packed: bool) -> float:
        if packed:
            s, t_in, t_out, sd, td = (x.to(dev) for x in T.collate_packed(src, tgt, batch))
            docs = {"src_documents": sd, "tgt_documents": td}
        else:
            s, t_in, t_out = (x.to(dev) for x in T.collate(src, tgt, batch))
            docs = {}
        with torch.autocast(dev.type, torch.bfloat16, enabled=precision == "bf16"):
            logits = model(s, t_in, s != T.PAD_ID, t_in != T.PAD_ID, **docs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), t_out.flatten(), ignore_index=T.PAD_ID,
                               label_smoothing=0.1, reduction="sum")
        (loss / 1000).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float((t_out != T.PAD_ID).sum())

    made = settings(src_lens, tgt_lens, max_tokens, pack_lens)
    tokens, seconds = Counter(), Counter()
    for r in range(rounds + 1):  # round 0 warms up
        for name, batches in made.items():
            chunk = [batches[(r * steps + i) % len(batches)] for i in range(steps)]
            sync(dev)
            t0 = time.perf_counter()
            n = sum(step(b, name != "pad") for b in chunk)
            sync(dev)
            if r:
                tokens[name] += n
                seconds[name] += time.perf_counter() - t0
    return {name: tokens[name] / seconds[name] for name in made}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default=None, help="fp32 or bf16 (default: the recipe's auto)")
    p.add_argument("--max-tokens", type=int, nargs="+", default=[1024])
    p.add_argument("--pack-len", type=int, nargs="+", default=[32, 64])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=15, help="steps of a setting in each round")
    p.add_argument("--model", default="transformer-tiny-ding")
    p.add_argument("--lengths", type=Path, help="a JSON file of [source lengths, target lengths]")
    p.add_argument("--save-lengths", type=Path, help="write the corpus's lengths there and stop")
    p.add_argument("--out", type=Path, help="write the results as JSON there")
    args = p.parse_args(argv)
    from zoo.train import resolve_precision, tune_malloc

    tune_malloc()
    if args.lengths:
        src_lens, tgt_lens = json.loads(args.lengths.read_text())
    else:
        src_lens, tgt_lens = corpus_lengths(Path(__file__).resolve().parents[1] / "recipes")
    if args.save_lengths:
        args.save_lengths.write_text(json.dumps([src_lens, tgt_lens]))
        return 0
    precision = args.precision or resolve_precision("auto", torch.device(args.device))
    results = {"machine": machine(), "device": args.device, "precision": precision, "model": args.model, "rows": []}
    if args.device.startswith("cuda"):
        results["gpu"] = torch.cuda.get_device_name()
    for mt in args.max_tokens:
        speeds = measure(src_lens, tgt_lens, max_tokens=mt, pack_lens=args.pack_len, device=args.device,
                         precision=precision, rounds=args.rounds, steps=args.steps, model_name=args.model)
        for name, v in speeds.items():
            row = {"max_tokens": mt, "setting": name, "target_tokens_per_s": round(v, 1),
                   "ratio": round(v / speeds["pad"], 3)}
            results["rows"].append(row)
            print(f"max_tokens {mt:>6}  {name:<10} {v:>10,.0f} target tokens/s  {row['ratio']:.2f}x pad", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
