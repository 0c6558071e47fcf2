"""Training memory per process, measured against ``zoo summary --shard``'s plan (zoo.summary.training_memory).

    python -m bench --only memory            # GPT-2 small, sequence 1024, 2 processes: ddp / fsdp x checkpointing

Each configuration runs under ``torchrun`` (gloo on CPU, NCCL on GPU) for a few AdamW steps through
zoo's own pieces (zoo.train.apply_fsdp, set_activation_checkpointing, build_optimizer, DDP through Dist.wrap).
Measured is each process's peak: on a GPU ``torch.cuda.max_memory_allocated``; on a CPU the peak
resident set size less the process's size just before the model was built, with glibc's mmap
threshold fixed at 64 KiB (every block from 64 KiB up is its own mapping and goes back to the system
when freed, so the peak follows the live tensors; the default threshold rises as blocks are freed
and the heap then keeps them).
Dropout is off: the plan assumes fused attention, and attention dropout on a CPU takes zoo's own
kernel, which keeps the T x T weights (docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from zoo.cli import positive_int

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("ddp", False), ("ddp", True), ("fsdp", False), ("fsdp", True)]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(args: argparse.Namespace) -> None:
    """One process of a torchrun job: train a few steps, write this rank's peak to ``args.out``."""
    import zoo
    import zoo.train as T

    torch.set_num_threads(1)
    before = _rss()
    with T.distributed(args.device) as dist:
        spec = zoo.load_spec(args.preset, args.set)
        torch.manual_seed(0)
        model = zoo.build(spec).to(dist.device)
        if args.checkpointing:
            T.set_activation_checkpointing(model)
        if args.strategy == "fsdp" and dist.enabled:
            T.apply_fsdp(model, dist, precision=args.precision)
            train_model = model
        else:
            train_model = dist.wrap(model)
        opt = T.build_optimizer(model, T.OptimConfig(lr=1e-4))
        tokens = torch.randint(0, spec.vocab_size, (args.batch, args.seq + 1), device=dist.device)
        if dist.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        def step_loss() -> torch.Tensor:  # the logits die with this frame, as in a Task's loss
            with T.autocast(dist.device, args.precision):
                logits = train_model(tokens[:, :-1])
                return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())

        for _ in range(args.steps):
            loss = step_loss()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if dist.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        peaks = dist.gather_object(peak)
        if dist.is_main:
            Path(args.out).write_text(json.dumps({"peaks": peaks, "loss": float(loss)}))


def measure(preset: str, *, strategy: str, checkpointing: bool, processes: int = 2, seq: int = 1024, batch: int = 1,
            steps: int = 3, precision: str = "fp32", overrides: tuple[str, ...] = (), device: str = "auto") -> dict:
    """Run one configuration under torchrun; its per-process peaks and the plan's estimate."""
    from zoo.spec import load_spec
    from zoo.summary import training_memory

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peak.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "bench.memory", "--worker", "--preset", preset, "--strategy", strategy, "--seq", str(seq),
               "--batch", str(batch), "--steps", str(steps), "--precision", precision, "--device", device,
               "--out", str(out), *(["--checkpointing"] if checkpointing else []),
               *[a for o in overrides for a in ("--set", o)]]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
        env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=65536"  # blocks of 64 KiB and more go back when freed
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"memory run {strategy} checkpointing={checkpointing} failed:\n{done.stderr[-3000:]}")
        got = json.loads(out.read_text())
    plan = training_memory(load_spec(preset, list(overrides)), processes=processes, strategy=strategy,
                           checkpointing=checkpointing, batch=batch, seq=seq, precision=precision)
    return {"strategy": strategy, "checkpointing": checkpointing, "processes": processes, "seq": seq, "batch": batch,
            "precision": precision, "measured": max(got["peaks"]), "peaks": got["peaks"], "plan": plan.to_dict()}


NO_DROPOUT = ("dropout.embedding=0", "dropout.residual=0", "dropout.attention=0", "dropout.ffn=0")


def run_all(preset: str = "gpt2-small", *, tiny: bool = False, **kw) -> list[dict]:
    kw.setdefault("overrides", NO_DROPOUT)
    if tiny:
        kw = {**kw, "seq": 32, "steps": 2, "overrides": kw["overrides"] + ("d_model=32", "n_layers=2",
                                                                         "block.attention.n_heads=2", "vocab_size=256",
                                                                         "max_seq_len=64")}
    rows = []
    for strategy, ckpt in CONFIGS:
        row = measure(preset, strategy=strategy, checkpointing=ckpt, **kw)
        print(f"memory {preset} {strategy}{' +checkpointing' if ckpt else ''}: measured {row['measured'] / 2**30:.2f} GiB, "
              f"plan {row['plan']['total'] / 2**30:.2f} GiB per process", flush=True)
        rows.append(row)
    return rows


def markdown(rows: list[dict], preset: str, env: dict) -> str:
    gib = 2**30
    r0 = rows[0]
    lines = [f"## Training memory per process: {preset}, {r0['processes']} processes, sequence {r0['seq']}, "
             f"batch {r0['batch']}, {r0['precision']}, dropout 0", "",
             f"Measured {env['date']} on {env['cpu']} (torch {env['torch']}): the peak of each process "
             "(the larger of the two) against `zoo summary --shard` (zoo.summary.training_memory). "
             "Made with `python -m bench --only memory`.", "",
             "| strategy | activation checkpointing | measured | plan | plan / measured | plan: params + grads + optimizer | plan: activations |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        p = r["plan"]
        state = p["parameters"] + p["gradients"] + p["optimizer"]
        lines.append(f"| {r['strategy']} | {'yes' if r['checkpointing'] else 'no'} | {r['measured'] / gib:.2f} GiB | "
                     f"{p['total'] / gib:.2f} GiB | {p['total'] / max(r['measured'], 1):.2f} | {state / gib:.2f} GiB | "
                     f"{p['activations'] / gib:.2f} GiB |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--seq", type=positive_int, default=1024)
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="peak.json")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
    else:
        print(json.dumps(run_all(args.preset), indent=1))


if __name__ == "__main__":
    main()
