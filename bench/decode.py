"""Decoding speed: ``zoo.generate`` with the dynamic KV cache, the static cache, and the static cache
with its step compiled, in one process, timed alternately (bench.common.compare), medians.

    python -m bench.decode [--device cuda] [--new-tokens 32] [--repeats 3] [--sides dynamic static ...] [--tiny]

Workloads: greedy with 1 and 8 prompts and beam 4 over 8 prompts, on llama-tiny (a small RoPE
decoder, 16-token prompts) and transformer-tiny-ding (the translation recipe's model, 24-token
sources). Random weights and no stop token, so every row decodes ``--new-tokens`` tokens; tokens/s
counts each sentence's tokens (not each beam's). The compiled side's compilation happens in the
warm-up, outside the timing; its cost is printed apart (``compile s``: the first call's time less
a timed one's). ``--tiny``: two-layer 32-wide models, to check the script.
"""

from __future__ import annotations

import argparse
import time

import torch

import zoo
from bench.common import Side, compare, machine, sync

SIDES = {"dynamic": {}, "static": {"cache": "static"}, "static+compiled": {"cache": "static", "compile": True}}
CASES = [("greedy", 1, 1), ("greedy", 8, 1), ("beam 4", 8, 4)]


TINY = ["d_model=32", "n_layers=2", "block.attention.n_heads=4", "block.ffn.hidden=48"]
LM_TINY = TINY + ["block.attention.n_kv_heads=2"]


def workloads(device: torch.device, new_tokens: int, tiny: bool = False):
    g = torch.Generator().manual_seed(0)
    lm = zoo.build("llama-tiny", LM_TINY if tiny else [], seed=0).eval().to(device)
    mt = zoo.build("transformer-tiny-ding", TINY if tiny else [], seed=0).eval().to(device)
    for model, name, length, extra in ((lm, "llama-tiny", 16, {}), (mt, "transformer-tiny-ding", 24, {"bos_id": 1})):
        for label, batch, beams in CASES:
            x = torch.randint(4, 1000, (batch, length), generator=g).to(device)
            kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_beams=beams, eos_id=None, **extra)
            yield name, label, batch, model, x, kw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES))
    ap.add_argument("--tiny", action="store_true", help="small models, to check the script")
    args = ap.parse_args(argv)
    for name in ("new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here")
    device = torch.device(args.device)
    chosen = {k: SIDES[k] for k in args.sides}
    print(machine())
    print(f"| model | decoding | batch | {' | '.join(f'{s} tok/s' for s in chosen)} | compile s |")
    print(f"|---|---|---|{'---|' * len(chosen)}---|")
    for name, label, batch, model, x, kw in workloads(device, args.new_tokens, args.tiny):
        first: dict[str, float] = {}

        def side(opts: dict, key: str) -> Side:
            def step():
                t0 = time.perf_counter()
                out = zoo.generate(model, x, **kw, **opts)
                sync(device)
                first.setdefault(key, time.perf_counter() - t0)
                return out
            return Side(key, step)

        sides = [side(opts, key) for key, opts in chosen.items()]
        medians, _ = compare(sides, warmup=1, repeats=args.repeats, device=str(device))
        rates = " | ".join(f"{batch * args.new_tokens / medians[k]:.0f}" for k in chosen)
        compiled = "static+compiled" in chosen
        compile_s = f"{first['static+compiled'] - medians['static+compiled']:.0f}" if compiled else "-"
        print(f"| {name} | {label} | {batch} | {rates} | {compile_s} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
