"""A language model's loss at GPT-2 small's head (D = 768, V = 50,257): zoo's chunked
:func:`zoo.kernels.linear_cross_entropy` against the logits written out, ``F.linear`` then
``logits.float()`` and ``F.cross_entropy`` (what recipes/lm.py computed before), forward + backward
of N hidden rows and the (tied) weight, in fp32 and under bf16 autocast. Both sides compute their
fp32 products where zoo's linear layers would (:func:`zoo.kernels.linear`: oneDNN or MKL, measured).

Time: alternating medians as every row. Memory: each side's peak in a fresh process of its own
(``python -m bench.loss SIDE N PRECISION D V THREADS REPEATS``), the growth of the peak resident set
(``resource.getrusage``) over what the inputs already held, across one step; glibc's default
malloc there, so that freed buffers leave the resident set as they do on a GPU's allocator. Saved:
the bytes autograd keeps between forward and backward (``torch.autograd.graph.saved_tensors_hooks``).

``python -m bench.loss --table [REPEATS]`` measures every size, precision and side that way, one
process each and one after another (time too, after the peak, with malloc tuned as the recipes
tune it): on a busy machine, where alternating rows take long, the quicker table.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import Row, Side, compare, here
from zoo import kernels
from zoo.kernels import linear_cross_entropy
from zoo.kernels.cpu import linear as cpu_linear
from zoo.kernels.loss import chunk_rows_for

Timing = dict
D, V = 768, 50_257
ROWS = (2048, 8192)
TINY = (32, 500, (64,))  # D, V, rows
SIDES = ("zoo", "logits + F.cross_entropy")
ROOT = Path(__file__).resolve().parents[1]


def inputs(n: int, d: int, v: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, device="cpu").to(here()).requires_grad_()
    w = torch.nn.Parameter((torch.randn(v, d, generator=g, device="cpu") * 0.02).to(here()))
    t = torch.randint(0, v, (n,), generator=g, device="cpu").to(here())
    return h, w, t


def loss_of(side: str, h, w, t, precision: str):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.autocast(h.device.type, dtype=dtype, enabled=precision == "bf16"):
        if side == "zoo":
            return linear_cross_entropy(h, w, t)
        return F.cross_entropy(kernels.linear(h, w).float(), t, reduction="sum")  # the head's product, as before


def step(side: str, h, w, t, precision: str):
    def run():
        h.grad = w.grad = None
        loss_of(side, h, w, t, precision).backward()
    return run


def saved_bytes(side: str, h, w, t, precision: str) -> int:
    """Bytes autograd keeps for the backward pass (each storage once)."""
    seen: dict[int, int] = {}

    def pack(x):
        seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = loss_of(side, h, w, t, precision)
    own = {h.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()}
    del loss
    return sum(b for p, b in seen.items() if p not in own)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure_here(side: str, n: int, precision: str, d: int, v: int, repeats: int) -> dict:
    """In this fresh process: the first step's peak memory growth over the inputs (glibc's default
    malloc), the bytes saved for backward, then, with malloc tuned as the recipes tune it, the
    median seconds of ``repeats`` steps after one more warm-up."""
    import statistics
    import time

    from zoo.train import tune_malloc

    h, w, t = inputs(n, d, v)
    w.grad = torch.zeros_like(w)  # the weight's gradient exists in a training step on both sides
    if precision == "fp32" and cpu_linear.onednn_available():  # the backend's choice (it may time both) made first
        cpu_linear.prefers_onednn(chunk_rows_for(v, n) if side == "zoo" else n, v, d, True)
    run = step(side, h, w, t, precision)
    base = _rss()
    run()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    saved = saved_bytes(side, h, w, t, precision)
    seconds = []
    if repeats:
        tune_malloc()
        run()
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t0)
    return {"peak": peak, "saved": saved, "seconds": statistics.median(seconds) if seconds else None}


def measure(side: str, n: int, precision: str, d: int = D, v: int = V, repeats: int = 0) -> dict:
    """:func:`_measure_here` in a fresh process with this process's threads."""
    env = {k: x for k, x in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "bench.loss", side, str(n), precision, str(d), str(v),
                          str(torch.get_num_threads()), str(repeats)],
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rows(precision: str, timing: Timing, tiny: bool = False) -> list[Row]:
    if here().type != "cpu":
        return []  # the peak is measured on CPU resident memory
    d, v, sizes = TINY if tiny else (D, V, ROWS)
    out = []
    for n in sizes:
        h, w, t = inputs(n, d, v)
        row = Row(workload=f"loss: {n} rows x {d} -> {v:,} vocabulary, fwd+bwd", precision=precision, unit="tokens",
                  work=float(n), flops=3 * 2 * n * d * v)
        row.seconds, row.spread = compare([Side(s, step(s, h, w, t, precision)) for s in SIDES], **timing)
        del h, w, t
        memory = {s: measure(s, n, precision, d, v) for s in SIDES}
        row.extra["peak_mb"] = {s: round(m["peak"] / 2**20) for s, m in memory.items()}
        row.extra["saved_mb"] = {s: round(m["saved"] / 2**20) for s, m in memory.items()}
        out.append(row)
    return out


def table(repeats: int = 2, sizes=ROWS, precisions=("fp32", "bf16")) -> str:
    """Every side, size and precision in a process of its own, sequentially: a markdown table of
    one step's time (median of ``repeats``), peak memory growth and bytes saved for backward."""
    lines = ["| rows | precision | side | step (s) | peak over inputs (MiB) | saved for backward (MiB) |",
             "| ---: | --- | --- | ---: | ---: | ---: |"]
    for n in sizes:
        for p in precisions:
            for s in SIDES:
                m = measure(s, n, p, repeats=repeats)
                secs = "–" if m["seconds"] is None else f"{m['seconds']:.2f}"
                lines.append(f"| {n:,} | {p} | {s} | {secs} | {m['peak'] / 2**20:,.0f} | "
                             f"{m['saved'] / 2**20:,.0f} |")
                print(lines[-1], flush=True)
    return "\n".join(lines)


USAGE = ("usage: python -m bench.loss --table [REPEATS]   (every side, size and precision, each in a process of "
         "its own; the rows of a bench run: python -m bench --only loss)")

if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:  # python -m bench.loss --table [REPEATS]: every configuration, one process each
        print(table(int(sys.argv[2]) if len(sys.argv) > 2 else 2))
    elif len(sys.argv) != 8 or sys.argv[1] not in SIDES:  # --help, or anything but a child's seven arguments
        print(USAGE, file=sys.stderr if len(sys.argv) > 1 and sys.argv[1] not in ("-h", "--help") else sys.stdout)
        raise SystemExit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    else:
        side, n, precision, d, v, threads, repeats = sys.argv[1:8]
        torch.set_num_threads(int(threads))
        print(json.dumps(_measure_here(side, int(n), precision, int(d), int(v), int(repeats))))
