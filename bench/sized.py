"""Rows at a size: zoo against its anchor (HF transformers, timm) on the same architecture, each side
eager and compiled, with throughput, MFU and peak memory per side.

Sizes (``python -m bench --size``): ``gpu`` is what fills one 80 GB GPU (GPT-2 small 16 x 1024,
a Llama-3.2-1B-shaped decoder 8 x 2048, BERT-base MLM 32 x 512, ViT-B/16 at 256 images, the
paper's Transformer base at ~25k tokens a side, a Mixtral-shaped MoE scaled to one GPU, greedy and
beam decoding); ``cpu`` the CPU rows' sizes; ``toy`` seconds on a CPU (the tests').

Both sides are built from one zoo spec (``zoo.interop.hf.hf_config`` / ``to_timm`` make the peer), with
random weights. On CUDA the sides run one after another, each alone on the GPU (the others' models
are freed first), so ``torch.cuda.max_memory_allocated`` is that side's peak and a 1B model's two
copies need not fit at once; on a CPU they alternate as in :func:`bench.common.compare`.

MFU: FLOPs per step by the usual count, tokens x (6N + 12 L T d) for a training step (N the weights
in matmuls, the tied output projection included and embedding tables not; L layers, T the sequence,
d the width) and tokens x (2N + 4 L T d) for a forward pass; encoder-decoders count each side's
tokens against its own stack (and the decoder's cross-attention over the source); MoE counts the
active weights (top-k experts). Divided by step time and the bf16 matmul peak measured in the run.

Compiled sides use ``torch.compile`` per repeated block by default (``--compile-scope blocks``: each
transformer layer compiled in place, one compilation serving every layer of the same shape, so the
GPU run fits its time budget); ``--compile-scope model`` compiles the whole model, as a recipe's
``run.compile`` does.
"""

from __future__ import annotations

import gc
import inspect
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

import zoo
import zoo.train as T
from bench.common import Row, here, sync

SIZES = ("toy", "cpu", "gpu")
SCOPES = ("blocks", "model")
WORKLOADS = ("gpt2", "llama", "bert", "vit", "transformer", "moe", "generate")


@dataclass
class Plan:
    """How a run measures: its size, compiled sides or not, timing per side, a deadline for the run."""

    size: str = "toy"
    compile: bool = False
    scope: str = "blocks"
    backend: str = "inductor"
    warmup: int = 1  # steps after the first (which compiles) before timing
    repeats: int = 2  # timed steps per side, at most
    cap: float = 4.0  # seconds of timed steps per side (at least two are timed)
    deadline: float | None = None  # time.monotonic() after which no side starts
    one_at_a_time: bool | None = None  # sides built and timed in turn (None: on CUDA), else alternately
    only: str | None = None  # "eager" or "compiled": measure those sides alone (a run's two passes)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size {self.size!r}: use one of {', '.join(SIZES)}")
        if self.scope not in SCOPES:
            raise ValueError(f"compile scope {self.scope!r}: use one of {', '.join(SCOPES)}")

    def late(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


# ------------------------------------------------------------------------------------- measuring
Build = Callable[[], Callable[[], object]]  # builds a side's model on the device, returns its step


def _cuda() -> bool:
    return here().type == "cuda"


def _free() -> None:
    gc.collect()
    if _cuda():
        torch.cuda.empty_cache()


def _time_side(step: Callable[[], object], plan: Plan) -> tuple[float, list[float]]:
    """(seconds of the first step, which compiles; timed steps after ``plan.warmup`` more)."""
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(plan.warmup):
        step()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max(2, plan.repeats) and (len(times) < 2 or time.perf_counter() - start < plan.cap):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return first, times


def measure(row: Row, sides: dict[str, Build], plan: Plan) -> Row:
    """Fill ``row`` with each side's median step seconds, spread, first-step seconds and (CUDA) peak
    memory; a side that runs out of memory or past the deadline is recorded, not fatal."""
    if plan.only is not None:  # "compiled": the sides whose name says so (zoo static+compiled too)
        sides = {k: v for k, v in sides.items() if k.endswith("compiled") == (plan.only == "compiled")}
    firsts, memory, failed = {}, {}, {}
    times: dict[str, list[float]] = {}
    cuda = _cuda()
    if plan.one_at_a_time or (plan.one_at_a_time is None and cuda):  # one side at a time, alone on the GPU
        for name, build in sides.items():
            if plan.late():
                failed[name] = "skipped: past the run's deadline"
                plan.skipped.append(f"{row.workload}: {name}")
                continue
            _free()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            try:
                firsts[name], times[name] = _time_side(build(), plan)
                if cuda:
                    memory[name] = torch.cuda.max_memory_allocated()
            except torch.cuda.OutOfMemoryError:
                failed[name] = "out of memory"
            except Exception as e:  # noqa: BLE001 - on the GPU a side that fails is reported, the run goes on
                if not cuda:
                    raise
                failed[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            if failed.get(name):
                print(f"{row.workload}: {name}: {failed[name]}", flush=True)
            torch._dynamo.reset()  # its caches keep the side's compiled graphs (and their tensors) alive
            _free()
    elif sides and plan.late():
        for name in sides:
            failed[name] = "skipped: past the run's deadline"
            plan.skipped.append(f"{row.workload}: {name}")
    elif sides:  # all built, warmed, then timed alternately
        steps = {name: build() for name, build in sides.items()}
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            firsts[name] = time.perf_counter() - t0
            for _ in range(plan.warmup):
                step()
            times[name] = []
        order = list(steps)
        for r in range(max(2, plan.repeats)):
            for name in order[r % len(order):] + order[: r % len(order)]:
                t0 = time.perf_counter()
                steps[name]()
                times[name].append(time.perf_counter() - t0)
        del steps
        torch._dynamo.reset()  # the next row's layers start with dynamo's per-code caches empty
        _free()
    for name, ts in times.items():
        med = statistics.median(ts)
        row.seconds[name] = med
        row.spread[name] = (max(ts) - min(ts)) / med
    row.extra.update({"size": plan.size, "first_step_seconds": {k: round(v, 2) for k, v in firsts.items()},
                      "steps_timed": {k: len(v) for k, v in times.items()}})
    if memory:
        row.extra["memory"] = memory
    if failed:
        row.extra["failed"] = failed
    if plan.compile:
        row.extra["compile_scope"] = plan.scope
    return row


# -------------------------------------------------------------------------------------- compiling
def merge(row: Row, more: Row) -> Row:
    """``more``'s sides (the same workload, another pass) into ``row``."""
    row.seconds.update(more.seconds)
    row.spread.update(more.spread)
    for key, value in more.extra.items():
        if isinstance(value, dict):
            row.extra[key] = {**row.extra.get(key, {}), **value}
        else:
            row.extra.setdefault(key, value)
    return row


def _repeated(model: nn.Module) -> list[nn.Module]:
    """The layers of ``model``'s stacks: children of a ModuleList or Sequential that holds two or more
    modules of one class, each with weights (transformer blocks; not position tables)."""
    out = []
    for m in model.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2:
            kids = list(m)
            if len({type(k) for k in kids}) == 1 and all(any(True for _ in k.parameters()) for k in kids):
                out += kids
    return out


def compiled(model: nn.Module, plan: Plan) -> nn.Module:
    """``model`` compiled as ``plan`` says: each repeated block in place, or the whole model."""
    if plan.scope == "blocks":
        blocks = _repeated(model)
        if blocks:
            # a block that specialises on its own attributes (HF's layer_idx) compiles once a layer: let every
            # layer have its graph instead of falling back to eager past dynamo's default limit of 8
            limit = max(torch._dynamo.config.recompile_limit, 2 * len(blocks))
            torch._dynamo.config.recompile_limit = limit
            torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                                   8 * limit)
            for b in blocks:
                b.compile(backend=plan.backend)
            return model
    return torch.compile(model, backend=plan.backend)


def variants(name: str, make: Callable[[bool], Callable[[], object]], plan: Plan) -> dict[str, Build]:
    """``name`` eager, and ``name compiled`` when the plan compiles."""
    out = {name: lambda: make(False)}
    if plan.compile:
        out[f"{name} compiled"] = lambda: make(True)
    return out


# ---------------------------------------------------------------------------------------- counting
def flop_weights(model: nn.Module, tied: bool, prefix: str = "") -> int:
    """Weights that take part in matmuls: all (each once) less the token, type and position tables, plus
    the output projection when it is the tied token embedding (under ``prefix`` only, when given)."""
    seen, total, tables = set(), 0, 0
    for name, p in model.named_parameters():
        if name.startswith(prefix) and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    for name, m in model.named_modules():
        if not name.startswith(prefix):
            continue
        if isinstance(m, nn.Embedding) or type(m).__name__.endswith("Position"):  # token, type, position tables
            for p in m.parameters(recurse=False):
                if id(p) in seen:
                    tables += p.numel()
                    seen.discard(id(p))
    head = 0
    if tied:
        emb = next(m for m in model.modules() if isinstance(m, nn.Embedding))
        head = emb.weight.numel()
    return total - tables + head


def train_flops(tokens: int, n: int, layers: int, seq: int, width: int) -> float:
    """tokens x (6N + 12 L T d): a training step's FLOPs (forward, and backward at twice its cost)."""
    return tokens * (6 * n + 12 * layers * seq * width)


def forward_flops(tokens: int, n: int, layers: int, seq: int, width: int) -> float:
    """tokens x (2N + 4 L T d): a forward pass."""
    return tokens * (2 * n + 4 * layers * seq * width)


def moe_active(model: nn.Module, spec) -> int:
    """Weights in matmuls a token uses in a mixture-of-experts model: the experts' share top_k / n."""
    ffn = spec.block.ffn
    experts = sum(p.numel() for n, p in model.named_parameters() if ".ffn.w_" in n)
    return flop_weights(model, spec.head.tied) - experts + experts * ffn.top_k // ffn.n_experts


# ------------------------------------------------------------------------------------------- steps
def _optimizer(model: nn.Module, zoo_side: bool) -> torch.optim.Optimizer:
    """AdamW, fused where torch has the kernel: zoo's own (decay on matrices only), torch's for the peer."""
    if zoo_side:
        return T.build_optimizer(model, T.OptimConfig(name="adamw", lr=1e-4, weight_decay=0.05))
    try:
        return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)


def train_step(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor], precision: str, zoo_side: bool,
               compile_it: bool, plan: Plan) -> Callable[[], None]:
    model.train()
    opt = _optimizer(model, zoo_side)
    run = compiled(model, plan) if compile_it else model

    def step() -> None:
        with T.autocast(here(), precision):
            loss = loss_fn(run)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def infer_step(model: nn.Module, fn: Callable[[nn.Module], object], precision: str, compile_it: bool,
               plan: Plan) -> Callable[[], None]:
    model.eval()
    run = compiled(model, plan) if compile_it else model

    def step() -> None:
        with torch.inference_mode(), T.autocast(here(), precision):
            fn(run)

    return step


def ints(high: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed), device="cpu").to(here())


def generate_hooks() -> dict[str, object]:
    """What ``zoo.generate`` accepts of a static-cache, compiled decoding path (``cache="static"``,
    ``compile=True``), by its signature: empty until zoo.generate has them, then the bench adds a
    ``zoo static+compiled`` side to the decoding rows."""
    params = inspect.signature(zoo.generate).parameters
    hooks: dict[str, object] = {}
    if "cache" in params:
        hooks["cache"] = "static"
    if "compile" in params:
        hooks["compile"] = True
    return hooks


# ------------------------------------------------------------------------------------------ tables
def peer_of(row: Row, side: str) -> str | None:
    """The side a zoo side is compared with: the peer eager for zoo eager, compiled for compiled."""
    if not side.startswith("zoo"):
        return None
    sides = [*row.seconds, *row.extra.get("failed", {})]
    peers = [s for s in sides if not s.startswith("zoo") and not s.endswith(" compiled")]
    if not peers:
        return None
    want = f"{peers[0]} compiled" if side == "zoo compiled" else peers[0]
    return want if want in row.seconds else None


def ratios(row: Row) -> list[tuple[str, str, float]]:
    """(zoo side, peer side, zoo's throughput / the peer's) for each pair both measured."""
    out = []
    for side in row.seconds:
        peer = peer_of(row, side)
        if peer is not None:
            out.append((side, peer, row.seconds[peer] / row.seconds[side]))
    return out


def _num(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def describe(row: Row, peak: float | None) -> str:
    """One console line: each side's throughput, MFU and memory, and the ratios."""
    parts = []
    for side, s in row.seconds.items():
        mfu = row.mfu(side, peak)
        mem = row.extra.get("memory", {}).get(side)
        parts.append(f"{side} {_num(row.work / s)} {row.unit}/s" + (f" MFU {100 * mfu:.0f}%" if mfu else "")
                     + (f" {mem / 2**30:.1f} GiB" if mem else ""))
    parts += [f"{side} {why}" for side, why in row.extra.get("failed", {}).items()]
    ratio = ", ".join(f"{z} / {p} {r:.2f}x" for z, p, r in ratios(row))
    return f"{row.workload} [{row.precision}]: " + "; ".join(parts) + (f" ({ratio})" if ratio else "")


def markdown(rows: list[Row], peaks: dict[str, float]) -> str:
    """The sized rows' table: one line per side, zoo's lines with their ratio to the peer in the same
    mode (eager / compiled); MFU against the run's matmul peak of the row's precision."""
    lines = ["| workload | precision | side | throughput | zoo / peer | MFU | peak memory | first step | spread |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ratio = {z: f"**{x:.2f}x** vs {p}" for z, p, x in ratios(r)}
        memory, first = r.extra.get("memory", {}), r.extra.get("first_step_seconds", {})
        for side, s in r.seconds.items():
            mfu = r.mfu(side, peaks.get(r.precision))
            lines.append(f"| {r.workload} | {r.precision} | {side} | {_num(r.work / s)} {r.unit}/s | {ratio.get(side, '')} | "
                         f"{'–' if mfu is None else f'{100 * mfu:.0f}%'} | "
                         f"{f'{memory[side] / 2**30:.1f} GiB' if side in memory else '–'} | "
                         f"{first.get(side, 0):.1f} s | {100 * r.spread[side]:.0f}% |")
        for side, why in r.extra.get("failed", {}).items():
            lines.append(f"| {r.workload} | {r.precision} | {side} | {why} | | | | | |")
    scopes = {r.extra["compile_scope"] for r in rows if "compile_scope" in r.extra}
    notes = ["", "MFU: tokens x (6N + 12 L T d) per training step, tokens x (2N + 4 L T d) per forward pass "
             "(N: weights in matmuls, MoE: the active ones), over step time and the matmul peak. First step: "
             "the seconds of the first call, compilation included."]
    if scopes:
        notes.append(f"Compiled sides: torch.compile of {' and '.join(sorted(scopes))} "
                     "(blocks: each repeated layer compiled in place; model: the whole model).")
    return "\n".join(lines + notes) + "\n"
