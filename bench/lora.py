"""LoRA against full fine-tuning: one training step of the same decoder, AdamW (zoo's
``build_optimizer``) on what trains. The model is llama-small's shape (12 layers of 768, GQA 12/4,
SwiGLU 2048, a 32k vocabulary, 125M parameters) on a batch of 4 x 256 tokens; ``--tiny`` a toy one.
LoRA: rank 16, alpha 32, on q, k, v, o and the FFN (``--rank``, ``--targets``).

Per side: the step's time (in a bench run's row the sides alternated, medians, as every row; in the
table each side's median in its own process), the parameters that train, the bytes of their
gradients and of the optimizer's state (AdamW: two moments per trained element and a step count per
tensor), and the peak memory of training: of two steps (the first creates the optimizer's state,
the second runs with it held) over what the process held before the model was built, so the model,
batch, gradients, optimizer state and activations: on CUDA ``torch.cuda.max_memory_allocated``, on a
CPU the peak resident set (VmHWM, reset after building the model) in a fresh process per side
(``python -m bench.lora --side SIDE ...``), as bench/loss.py measures memory (Python's tracemalloc
does not see torch's allocations).

    python -m bench.lora                       # the table: both sides, fp32 (and bf16 on a CPU that runs it)
    python -m bench.lora --tiny --repeats 1    # toy sizes, seconds (tests/test_bench.py)
    python -m bench --only lora                # the alternating time row, in a bench run's JSON
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import zoo
import zoo.train as T
from bench.common import Row, Side, compare, here, sync
from zoo.finetune import LoraSpec, apply_lora
from zoo.train.optim import bf16_is_fast

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("lora", "full")
NAMES = {"lora": "zoo", "full": "full fine-tuning"}  # a row's sides: zoo's LoRA step against the full one
MODEL = ("llama-small", [], 4, 256)  # preset, overrides, batch, tokens per row
TINY = ("llama-small", ["d_model=64", "n_layers=2", "block.attention.n_heads=4", "block.attention.n_kv_heads=2",
                        "block.ffn.hidden=96", "vocab_size=211"], 2, 16)
TARGETS = ("q", "k", "v", "o", "ffn")


def setup(side: str, precision: str, *, tiny: bool = False, rank: int = 16, targets=TARGETS):
    """(model, optimizer, step, tokens): one side's model on :func:`bench.common.here`, LoRA-adapted
    for ``lora``, and its training step."""
    preset, overrides, batch, length = TINY if tiny else MODEL
    model = zoo.build(zoo.load_spec(preset, overrides), seed=0, device=here()).train()
    if side == "lora":
        apply_lora(model, LoraSpec(rank=rank, alpha=2.0 * rank, targets=tuple(targets)))
    elif side != "full":
        raise ValueError(f"side: lora or full, not {side!r}")
    optimizer = T.build_optimizer(model, T.OptimConfig(lr=1e-4, weight_decay=0.0))
    tokens = torch.randint(0, model.spec.vocab_size, (batch, length), generator=torch.Generator().manual_seed(0)).to(here())

    def step() -> None:
        with T.autocast(here(), precision):
            loss = model(tokens, targets=tokens, reduction="mean")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, optimizer, step, tokens


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))


def _status(key: str) -> int:
    """A /proc/self/status size (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _reset_peak() -> None:
    """Start the peak resident set (VmHWM) afresh from the current one (Linux: clear_refs 5), so that
    the peak is the step's, not the model building's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _held(cuda: bool) -> int:
    return torch.cuda.memory_allocated() if cuda else _status("VmRSS")


def measure_here(side: str, precision: str, *, tiny: bool = False, repeats: int = 0, rank: int = 16,
                 targets=TARGETS) -> dict:
    """One side in this process: the peak memory of two training steps over what the process held
    before the model was built (bytes: the model, batch, gradients, optimizer state and activations;
    on a CPU best measured in a fresh process), the trained parameters, gradient and optimizer-state
    bytes, and the median seconds of ``repeats`` steps after those two."""
    cuda = here().type == "cuda"
    gc.collect()
    if cuda:
        sync()
    start = _held(cuda)
    model, optimizer, step, _ = setup(side, precision, tiny=tiny, rank=rank, targets=targets)
    trained = [p for p in model.parameters() if p.requires_grad]
    gc.collect()
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats()
    else:
        _reset_peak()  # the steps' peak, not the model building's
    for _ in range(2):  # the first creates the optimizer's state, the second runs with it held
        step()
    sync()
    peak = (torch.cuda.max_memory_allocated() if cuda else _status("VmHWM")) - start
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        seconds.append(time.perf_counter() - t0)
    return {"side": side, "trainable": sum(p.numel() for p in trained),
            "params": sum(p.numel() for p in model.parameters()),
            "grad_bytes": sum(p.numel() * p.element_size() for p in trained), "optimizer_bytes": _state_bytes(optimizer),
            "peak": peak, "seconds": statistics.median(seconds) if seconds else None}


def measure(side: str, precision: str, *, tiny: bool = False, repeats: int = 0, rank: int = 16,
            targets=TARGETS) -> dict:
    """:func:`measure_here` in a fresh process on a CPU (the peak resident set is the process's);
    in this one on CUDA, whose allocator counts its own peak."""
    if here().type == "cuda":
        out = measure_here(side, precision, tiny=tiny, repeats=repeats, rank=rank, targets=targets)
        gc.collect()
        torch.cuda.empty_cache()
        return out
    env = {k: x for k, x in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "bench.lora", "--side", side, "--precision", precision, "--repeats", str(repeats),
            "--rank", str(rank), "--threads", str(torch.get_num_threads()), "--targets", *targets]
    out = subprocess.run(argv + (["--tiny"] if tiny else []), env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rows(precision: str, timing: dict, tiny: bool = False) -> list[Row]:
    """The bench row: LoRA's step (side ``zoo``) against full fine-tuning's, alternated, with each
    side's memory from :func:`measure` in ``extra``."""
    preset, _, batch, length = TINY if tiny else MODEL
    steps = {side: setup(side, precision, tiny=tiny)[2] for side in SIDES}
    row = Row(workload=f"LoRA r16 (q,k,v,o,ffn) vs full fine-tuning: {preset}{' (toy)' if tiny else ''} train "
                       f"{batch}x{length}", precision=precision, unit="tokens", work=float(batch * length))
    row.seconds, row.spread = compare([Side(NAMES[s], steps[s]) for s in SIDES], **timing)
    del steps
    gc.collect()
    memory = {s: measure(s, precision, tiny=tiny) for s in SIDES}
    for key in ("trainable", "grad_bytes", "optimizer_bytes", "peak"):
        row.extra[key] = {NAMES[s]: m[key] for s, m in memory.items()}
    return [row]


def table(precisions=("fp32",), *, tiny: bool = False, repeats: int = 3, rank: int = 16, targets=TARGETS) -> str:
    """Each side and precision measured by :func:`measure` (one process each on a CPU, one after the
    other): a markdown table."""
    mib = 2 ** 20
    lines = ["| precision | side | step (s) | trained parameters | gradients (MiB) | optimizer state (MiB) | "
             "peak of training (MiB) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for p in precisions:
        for s in SIDES:
            m = measure(s, p, tiny=tiny, repeats=repeats, rank=rank, targets=targets)
            secs = "–" if m["seconds"] is None else f"{m['seconds']:.3f}"
            lines.append(f"| {p} | {'LoRA' if s == 'lora' else 'full'} | {secs} | {m['trainable']:,} of {m['params']:,} | "
                         f"{m['grad_bytes'] / mib:,.1f} | {m['optimizer_bytes'] / mib:,.1f} | {m['peak'] / mib:,.0f} |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a toy model and batch: the script runs in seconds")
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=None,
                        help="default: fp32, and bf16 where matmuls run it natively")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per side after the measured first one")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, in the fresh process measure() starts
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 0 or args.rank < 1:
        parser.error("--repeats must be >= 0 and --rank >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.side:
        print(json.dumps(measure_here(args.side, args.precision[0] if args.precision else "fp32", tiny=args.tiny,
                                      repeats=args.repeats, rank=args.rank, targets=args.targets)))
        return 0
    precisions = args.precision or ["fp32"] + (["bf16"] if bf16_is_fast(here()) else [])
    print(table(precisions, tiny=args.tiny, repeats=args.repeats, rank=args.rank, targets=args.targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
