"""``zoo kernels``: the CPU kernel choices this machine measured (:mod:`zoo.kernels.cpu.choose`), and
a way to make them before a run.

A process of a distributed run times nothing (its ranks would disturb each other's timings and could
choose apart): it takes the machine's cached choices, else the defaults. ``zoo kernels --measure SPEC
--batch B --seq T`` runs one training step of the model on random inputs in this one process, so
every shape class the run will meet is measured and cached first.
"""

from __future__ import annotations

import argparse
import json

import torch

from zoo.kernels.cpu import choose

__all__ = ["add_parser", "run"]


def add_parser(sub, positive_int) -> argparse.ArgumentParser:
    text = "the CPU kernels this machine chose by measurement: list them, measure a model's first, or clear them"
    p = sub.add_parser("kernels", help=text, description=text + (
        ". Each fp32 linear, each attention up to 1,024 keys and each windowed or packed mask (blocked or dense) "
        "picks the faster kernel the first time its shape class is seen, and the machine remembers it "
        "(ZOO_KERNEL_CACHE: a file, or off). --measure SPEC makes a run's choices in advance: the processes of a "
        "torchrun time nothing and use what is cached."))
    p.add_argument("--measure", metavar="SPEC", default=None,
                   help="run one training step of SPEC (a preset, a YAML file or a .safetensors file) on random inputs")
    p.add_argument("--explain", metavar="SPEC", default=None,
                   help="print the kernel policy and where each field comes from, then run one step of SPEC and list "
                        "the kernel each call took")
    p.add_argument("--nproc", type=positive_int, default=None, metavar="N",
                   help="measure with the threads each of torchrun's N processes gets (OMP_NUM_THREADS, else 1 for N > 1), "
                        "so its ranks read these choices")
    p.add_argument("--threads", type=positive_int, default=None, metavar="T",
                   help="measure with T threads (a run's run.threads); overrides --nproc")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of SPEC (repeatable)")
    p.add_argument("--batch", type=positive_int, default=8, metavar="B", help="rows per step (default 8)")
    p.add_argument("--seq", type=positive_int, default=None, metavar="T",
                   help="tokens per row (default: max_seq_len, at most 512; a ViT's is its image)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="autocast of the step (default fp32)")
    p.add_argument("--infer", action="store_true", help="an inference pass instead of a training step")
    p.add_argument("--clear", action="store_true", help="delete this machine's cache file first")
    p.add_argument("--json", action="store_true", help="print the choices as JSON")
    return p


def _first_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    return next(v for v in values if isinstance(v, torch.Tensor))


def measure(spec, *, batch: int, seq: int | None, precision: str, infer: bool) -> int:
    """One step of ``spec``'s model in this process (choices made as they come); the new choices' count."""
    from zoo.build import build
    from zoo.train.optim import autocast

    before = set(choose.choices())
    model = build(spec, seed=0).train(not infer)
    seq = seq or min(getattr(spec, "max_seq_len", 512), 512)  # a ViT has none: its image sets its tokens
    inputs = model.example_inputs(batch, seq, torch.Generator().manual_seed(0))
    with torch.inference_mode(infer), autocast(torch.device("cpu"), precision):
        out = _first_tensor(model(*inputs))
    if not infer:
        out.float().mean().backward()
    return len(set(choose.choices()) - before)


def rank_threads(nproc: int | None, threads: int | None) -> int | None:
    """The intra-op threads a process of the run will have: ``threads`` (``run.threads``), else what
    torchrun gives each of ``nproc`` processes (``OMP_NUM_THREADS``, else 1 where it starts several),
    else None (this process's own)."""
    import os

    if threads:
        return threads
    if nproc is None:
        return None
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else (1 if nproc > 1 else None)


def explain(spec, name: str, console, *, batch: int, seq: int | None, precision: str, infer: bool) -> None:
    """The policy with each field's source, then one step of ``spec`` with the kernel of each call."""
    from collections import Counter

    from rich.table import Table

    from zoo.kernels import policy

    table = Table(title="kernel policy (zoo.kernels.use, ZOO_* variables, run.attention)")
    for column in ("field", "value", "from", "choices"):
        table.add_column(column)
    now, origin = policy.policy(), policy.sources()
    for field, allowed in policy.FIELDS.items():
        value = getattr(now, field)
        if field == "cache":
            value = value or str(choose.cache_path())
        table.add_row(field, value, origin[field], ", ".join(allowed) if allowed else "a file, or off")
    console.print(table)
    with policy.explaining() as seen:
        measure(spec, batch=batch, seq=seq, precision=precision, infer=infer)
    calls = Counter(seen.calls)
    table = Table(title=f"the kernels of one {'forward pass' if infer else 'training step (forward)'} of {name} "
                        f"(batch {batch}, {precision}, {choose.machine()})")
    for column in ("op", "inputs", "kernel", "calls"):
        table.add_column(column)
    for (op, shapes, kernel), n in sorted(calls.items()):
        table.add_row(op, shapes, kernel, str(n))
    console.print(table)


def run(args, console, load_spec) -> None:
    threads = rank_threads(args.nproc, args.threads)
    if threads:
        torch.set_num_threads(threads)  # the machine key names the thread count: a rank's, not this shell's
    if args.explain:
        spec = load_spec(args.explain, args.overrides)
        explain(spec, args.explain, console, batch=args.batch, seq=args.seq, precision=args.precision, infer=args.infer)
        return
    path = choose.cache_path()
    if path is None and (args.measure or args.clear):
        raise ValueError("ZOO_KERNEL_CACHE=off: choices would not be kept; unset it (or give a file) to measure or clear")
    if args.clear and path is not None and path.exists():
        path.unlink()
        choose.forget()
        console.print(f"deleted {path}")
    if args.measure:
        spec = load_spec(args.measure, args.overrides)
        new = measure(spec, batch=args.batch, seq=args.seq, precision=args.precision, infer=args.infer)
        console.print(f"measured {new} new shape class(es) in a {'forward pass' if args.infer else 'training step'} "
                      f"of {args.measure} (batch {args.batch}, {args.precision}, {torch.get_num_threads()} threads); "
                      f"kept in {path}")
    made = choose.choices()
    if args.json:
        print(json.dumps({"machine": choose.machine(), "cache": str(path) if path else None, "choices": made},
                         indent=1, sort_keys=True))
        return
    from rich.table import Table

    table = Table(title=f"{choose.machine()}\n{path or 'ZOO_KERNEL_CACHE=off: this process only'}")
    for column in ("op", "shape class", "pick", "ms per candidate (best of 3)"):
        table.add_column(column)
    for key in sorted(made):
        op, _, cls = key.partition("/")
        seconds = made[key].get("seconds") or {}
        times = ", ".join(f"{name} {1e3 * s:.2f}" for name, s in seconds.items()) or "-"
        table.add_row(op, cls, made[key]["pick"], times)
    console.print(table if made else "no kernel choices measured on this machine yet")
