"""Run the benchmarks: zoo side by side with timm, HF transformers and torch.nn, as ratios.

    python -m bench                       # everything (tens of minutes on a 2-core CPU)
    python -m bench --only vit gpt2       # some workloads: bench/results/vit-gpt2-<time>.json, the page untouched
    python -m bench --only moe            # HF Mixtral (each experts implementation) vs zoo's moe decoder
    python -m bench --only loss           # chunked linear + cross-entropy vs the logits written out (time, memory)
    python -m bench --only lora           # a LoRA training step vs full fine-tuning (time, memory; bench/lora.py)
    python -m bench --only deepseek       # MLA vs GQA decoding (cache bytes), a DeepSeek MoE layer vs HF's
    python -m bench --tiny                # every script at toy sizes (seconds; used by the tests)
    python -m bench --device cuda         # the GPU rows at GPU sizes (--size gpu), eager and compiled, bf16
    python -m bench --compile             # CPU rows with torch.compile'd sides too (both zoo's and the peer's)
    python -m bench --from-json bench/results/<time>.json   # rewrite docs/benchmarks.md from a run
                                                            # (a convert-memory-<time>.json: its section too)
    python -m bench --only translation-quality   # zoo's translation recipe vs HF Marian, same data and
                                                 # budget (not in the default set: ~35 minutes)
    python -m bench --only memory                # training memory per process against zoo's plan
    python -m bench --only convert-memory        # peak memory of zoo convert / checkpoint size (~10 GB of disk)

Writes bench/results/<time>.json, and (unless --tiny) docs/benchmarks.md with docs/benchmarks.png.
A run of some workloads (--only) writes bench/results/<names>-<time>.json and leaves the page alone
(unless --out): a section of bench/NOTES.md shows it with <!-- generated: bench-table JSON -->, and
`python docs/make_docs.py` (or any full run) renders it.
Sides are timed alternately in this one process after warm-up; medians over --repeats.
--size gpu (the default with --device cuda; bench/sized.py) builds GPT-2 small 16 x 1024, a
Llama-3.2-1B-shaped decoder 8 x 2048, BERT-base 32 x 512, ViT-B/16 at 256 images, Transformer base at
~25k tokens a side, a Mixtral-shaped MoE and decoding, each side eager and compiled and alone on the
GPU in turn (peak memory per side), with MFU by 6N + 12LTd against the run's bf16 matmul peak.
On Linux the process re-executes itself once with glibc's malloc tuned (see bench/common.MALLOC)
so that no side pays page faults for returning memory to the OS every step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from bench import deepseek, dropout, lora, loss, masks, moe, sized, sized_rows
from bench import workloads as W
from bench.common import MALLOC, Row, machine, matmul_peak
from zoo.cli import positive_int
from zoo.train.optim import bf16_is_fast

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ["peak", "vit", "gpt2", "mistral", "moe", "bert", "transformer", "generate", "compile", "window", "packing",
             "dropout", "loss", "llama", "lora", "deepseek"]
DEFAULT = [w for w in WORKLOADS if w not in ("llama", "lora", "deepseek")]  # llama: a 1B model; both asked for by name (llama: or at --size gpu)
GPU_DEFAULT = ["peak", *sized.WORKLOADS]  # --size gpu without --only
QUALITY = "translation-quality"  # run only when named: it trains two models for the full budget
QUALITY_MD = ROOT / "bench" / "QUALITY.md"
MEMORY = "memory"  # run only when named: torchrun jobs of GPT-2 small at sequence 1024
MEMORY_MD = ROOT / "bench" / "MEMORY.md"
CONVERT_MEMORY = "convert-memory"  # run only when named: writes and converts multi-GB checkpoints
CONVERT_MEMORY_MD = ROOT / "bench" / "CONVERT_MEMORY.md"


def _rows(name: str, precisions: list[str], timing: dict, tiny: bool, plan: sized.Plan | None = None) -> list[Row]:
    """The rows of workload ``name``; with a ``plan`` (--size gpu, --compile, or the llama rows), the
    sized rows of bench/sized_rows.py where the workload has them."""
    out: list[Row] = []
    if plan is not None and name in sized.WORKLOADS:
        for p in precisions if name != "generate" else precisions[:1]:
            out += sized_rows.rows(name, p, plan)
        return out
    for p in precisions:
        if name == "vit":
            for model in (["vit_tiny_patch16_224"] if tiny else ["vit_small_patch16_224", "vit_tiny_patch16_224"]):
                out.append(W.vit(model, p, "train", timing, tiny))
                out.append(W.vit(model, p, "infer", timing, tiny))
        elif name == "gpt2":
            out.append(W.gpt2(p, timing, tiny=tiny))
            out.append(W.gpt2(p, timing, layers=6, width=384, heads=6, tiny=tiny))
        elif name == "mistral":
            out.append(W.mistral(p, timing, tiny=tiny))
        elif name == "moe":
            out.extend(moe.rows(p, timing, tiny))
        elif name == "bert":
            out.append(W.bert(p, timing, tiny))
        elif name == "transformer":
            out.append(W.transformer_base(p, timing, tiny))
        elif name == "generate" and p == precisions[0]:
            out.append(W.greedy(p, timing, batch=1, tiny=tiny))
            out.append(W.greedy(p, timing, batch=8, tiny=tiny))
            out.append(W.beam(p, timing, batch=8, tiny=tiny))
        elif name == "compile" and p == precisions[-1]:
            out.append(W.compiled(p, timing, tiny))
        elif name == "window":
            out.append(masks.window(p, timing, tiny))
            out.append(masks.window(p, timing, tiny, alibi=True))
        elif name == "packing":
            out.append(masks.packing(p, timing, tiny))
        elif name == "dropout":
            out.extend(dropout.rows(p, timing, tiny))
        elif name == "loss":
            out.extend(loss.rows(p, timing, tiny))
        elif name == "lora":
            out.extend(lora.rows(p, timing, tiny))
        elif name == "deepseek":
            out.extend(deepseek.rows(p, timing, tiny))
    return out


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.0f}%" if pct else (f"{x:,.1f}" if x < 1000 else f"{x:,.0f}")


def _peaks_text(peaks: dict[str, float]) -> str:
    return ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in peaks.items())


def markdown(rows: list[Row], peaks: dict[str, float], env: dict) -> str:
    """The run's table: a row a workload and peer; sized rows (bench/sized.py) in a table of their own,
    a line a side, with peak memory."""
    sized_rows_ = [r for r in rows if "size" in r.extra]
    rows = [r for r in rows if "size" not in r.extra]
    lines = [
        "| workload | precision | zoo | peer | ratio (zoo / peer) | zoo MFU | peer MFU | spread |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        peak = peaks.get(r.precision)
        for peer in [s for s in r.seconds if not s.startswith("zoo")] or [s for s in r.seconds if s != "zoo compiled"]:
            zoo_side = "zoo compiled" if "zoo compiled" in r.seconds else "zoo"
            spread = max(r.spread[zoo_side], r.spread[peer])
            lines.append(
                f"| {r.workload} | {r.precision} | {_fmt(r.throughput(zoo_side))} {r.unit}/s | "
                f"{peer}: {_fmt(r.throughput(peer))} | **{r.ratio(zoo_side, peer):.2f}x** | "
                f"{_fmt(r.mfu(zoo_side, peak), True)} | {_fmt(r.mfu(peer, peak), True)} | {100 * spread:.0f}% |"
            )
    where = f"{env['gpu']} (host: {env['cpu']}" if sized_rows_ and env.get("gpu") else f"{env['cpu']} ("
    head = [
        f"Measured {env['date']} on {where}{env['threads']} threads, torch {env['torch']}, "
        f"malloc `{env['malloc']}`, 1-min load average before the run {env.get('loadavg_1min', '?')}).",
        "",
        f"Peak matmul: {_peaks_text(peaks)} "
        "(MFU is measured FLOPs per step / step time / this peak).",
        "",
    ]
    extra = [f"- {r.workload}: compile took {r.extra['compile_seconds']} s" for r in rows if "compile_seconds" in r.extra]
    extra += [f"- {r.workload} [{r.precision}]: peak memory of a step over its inputs "
              + ", ".join(f"{side} {mb:,} MB" for side, mb in r.extra["peak_mb"].items()) + "; saved for backward "
              + ", ".join(f"{side} {mb:,} MB" for side, mb in r.extra["saved_mb"].items()) for r in rows if "peak_mb" in r.extra]
    extra += [f"- {r.workload} [{r.precision}]: KV cache bytes per token "
              + ", ".join(f"{side} {n:,}" for side, n in r.extra["kv_cache_bytes_per_token"].items()) + "; parameters "
              + ", ".join(f"{side} {n:,}" for side, n in r.extra["parameters"].items())
              for r in rows if "kv_cache_bytes_per_token" in r.extra]
    if not rows:
        lines = []
    text = "\n".join(head + lines + ([""] + extra if extra else [])) + "\n"
    if sized_rows_:
        text = text.rstrip("\n") + "\n\n" + sized.markdown(sized_rows_, peaks)
    return text


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ratios = [], []
    for r in rows:
        if "size" in r.extra:
            for side, peer, x in sized.ratios(r):
                labels.append(f"{r.workload} [{r.precision}] {side} vs {peer}")
                ratios.append(x)
            continue
        zoo_side = "zoo compiled" if "zoo compiled" in r.seconds else "zoo"
        for peer in [s for s in r.seconds if s != zoo_side]:
            labels.append(f"{r.workload} [{r.precision}] vs {peer}")
            ratios.append(r.ratio(zoo_side, peer))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(labels) + 1.2))
    colors = ["tab:green" if x >= 1 else "tab:red" for x in ratios]
    ax.barh(range(len(labels)), ratios, color=colors)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("zoo throughput / peer throughput (same run)")
    for i, x in enumerate(ratios):
        ax.text(x, i, f" {x:.2f}x", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_docs(rows: list[Row], peaks: dict[str, float], env: dict, out_md: Path) -> None:
    """The markdown page (table, plot link, bench/NOTES.md) at ``out_md`` and its plot beside it."""
    notes = ROOT / "bench" / "NOTES.md"
    body = ["# Benchmarks", "", "zoo side by side with its peers, the same architecture (the same weights "
            "where a converter exists), timed alternately in one process; ratios > 1 mean zoo is faster. "
            "Made with `python -m bench`.", "", markdown(rows, peaks, env), "![zoo / peer throughput](benchmarks.png)", ""]
    for extra in (QUALITY_MD, MEMORY_MD, CONVERT_MEMORY_MD):
        if extra.exists():
            body.append(extra.read_text())
    if notes.exists():
        body.append(notes.read_text())
    out_md.write_text(_render_generated("\n".join(body)))
    plot(rows, out_md.with_suffix(".png"))


def _render_generated(text: str) -> str:
    """The page with its generated regions (numbers from bench/results) rendered: docs/make_docs.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "docs" / "make_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render(text)


def usable_precisions(requested: list[str], tiny: bool, device: str = "cpu") -> list[str]:
    """The requested precisions, less bf16 on a CPU without native bf16 matmuls: an AVX2-only CPU runs
    them in a scalar fallback (~1 GFLOP/s), so the bf16 rows would take hours and measure no one's real
    setting. ``--tiny`` keeps bf16, since it only checks that the scripts run."""
    out = list(requested)
    if "bf16" in out and not tiny and not bf16_is_fast(device):
        out.remove("bf16")
        print(f"bf16 skipped: this {device} has no native bf16 matmul (a CPU needs AVX-512 BF16 or AMX)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=WORKLOADS + [QUALITY, MEMORY, CONVERT_MEMORY], default=None,
                        help=f"workloads to run (default: all but llama, {QUALITY}, {MEMORY} and {CONVERT_MEMORY}; at --size "
                             f"gpu: {' '.join(GPU_DEFAULT)})")
    parser.add_argument("--minutes", type=float, default=None,
                        help=f"{QUALITY}: the training budget of each side (default: the recipe's train.minutes)")
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=None,
                        help="default: bf16 at --size gpu, else fp32 and bf16")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=positive_int, default=os.cpu_count())
    parser.add_argument("--tiny", action="store_true", help="toy sizes: checks the scripts, measures nothing "
                        "(the same as --size toy)")
    parser.add_argument("--device", default="cpu", help="where the workloads run: cpu (default) or cuda (GPU rows)")
    parser.add_argument("--size", choices=sized.SIZES, default=None,
                        help="toy (seconds, the tests'), cpu (the CPU rows), gpu (batches that fill one 80 GB GPU: "
                             "bench/sized.py); default: gpu with --device cuda, else cpu")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="add torch.compile'd sides (zoo's and the peer's) to the sized rows; default: on at "
                             "--size gpu, off otherwise")
    parser.add_argument("--compile-scope", choices=sized.SCOPES, default="blocks",
                        help="blocks: compile each repeated layer in place (one compilation serves every layer); "
                             "model: the whole model, as a recipe's run.compile does")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend (aot_eager: graphs without code generation, a quick check)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="sized rows: start no side after this many seconds of the run (the rest are listed "
                             "as skipped)")
    parser.add_argument("--step-seconds", type=float, default=None, metavar="SECONDS",
                        help="sized rows: time each side's steps for at most this long (at least two steps); "
                             "default 4 at --size gpu")
    parser.add_argument("--out", type=Path, default=None, help="markdown table (default: docs/benchmarks.md unless --tiny)")
    parser.add_argument("--json", type=Path, default=None, help="results JSON (default: bench/results/<time>.json)")
    parser.add_argument("--from-json", type=Path, default=None, metavar="JSON",
                        help="measure nothing: write the markdown table, notes and plot of an earlier run's JSON")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error(f"--warmup: must be at least 0, got {args.warmup}")
    for name in ("budget", "step_seconds"):
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')}: must be above 0, got {getattr(args, name)}")
    if args.tiny and args.size not in (None, "toy"):
        parser.error(f"--tiny is --size toy; it contradicts --size {args.size}")
    cuda = args.device.partition(":")[0] == "cuda"
    args.size = "toy" if args.tiny else args.size or ("gpu" if cuda else "cpu")
    args.tiny = args.size == "toy"
    if args.precision is None:
        args.precision = ["bf16"] if args.size == "gpu" else ["fp32", "bf16"]
    if args.compile is None:
        args.compile = args.size == "gpu"
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text())
        if args.from_json.name.startswith(f"{CONVERT_MEMORY}-"):  # a conversion-memory run: its section, then the page
            from bench import convert_memory

            CONVERT_MEMORY_MD.write_text(convert_memory.markdown(data["rows"], data["machine"]))
            _rebuild_docs(args)
            return 0
        rows = [Row(**r) for r in data["rows"]]
        write_docs(rows, data["peaks"], data["machine"], args.out or ROOT / "docs" / "benchmarks.md")
        return 0

    if sys.platform.startswith("linux") and os.environ.get("GLIBC_TUNABLES") != MALLOC and not args.tiny:
        os.environ["GLIBC_TUNABLES"] = MALLOC
        os.execv(sys.executable, [sys.executable, "-m", "bench", *(argv if argv is not None else sys.argv[1:])])

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    if torch.device(args.device).type != "cpu":
        torch.set_default_device(args.device)  # every workload builds and draws there (bench.common.here)
    env = machine()
    env["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.only and QUALITY in args.only:
        return translation_quality_main(args, env)
    if args.only and MEMORY in args.only:
        return memory_main(args, env)
    if args.only and CONVERT_MEMORY in args.only:
        return convert_memory_main(args, env)
    timing = dict(warmup=1 if args.tiny else args.warmup, repeats=2 if args.tiny else args.repeats)
    chosen = args.only or (GPU_DEFAULT if args.size == "gpu" else DEFAULT)
    precisions = usable_precisions(args.precision, args.tiny, args.device)
    plan = None
    if args.size == "gpu" or args.compile or "llama" in chosen:
        gpu = args.size == "gpu"
        plan = sized.Plan(size=args.size, compile=args.compile, scope=args.compile_scope, backend=args.compile_backend,
                          warmup=0 if args.tiny else 2 if gpu else args.warmup,
                          repeats=2 if args.tiny else 10 if gpu else args.repeats,
                          cap=args.step_seconds or (4.0 if gpu else float("inf")),
                          deadline=None if args.budget is None else time.monotonic() + args.budget)
        if args.size == "gpu":
            for name in chosen:
                if name not in sized.WORKLOADS and name != "peak":
                    print(f"{name}: no GPU size; its rows run at their CPU size", flush=True)
    peaks: dict[str, float] = {}
    if "peak" in chosen or not args.tiny:
        n = 256 if args.tiny else 8192 if args.size == "gpu" else 4096
        peaks = {"fp32": matmul_peak(torch.float32, n)}
        if "bf16" in precisions or args.tiny:
            peaks["bf16"] = matmul_peak(torch.bfloat16, n)
        print(f"peak matmul: {_peaks_text(peaks)}", flush=True)
    rows: list[Row] = []
    partial = "-".join(n for n in chosen if n != "peak") + "-" if args.only else ""
    # at --size gpu (or with a --budget) the eager sides of every row first, then the compiled ones (their
    # compilation is most of the run's time): a budget that runs out leaves every row its eager comparison
    two = plan is not None and plan.compile and (args.size == "gpu" or args.budget is not None)
    passes = ["eager", "compiled"] if two else [None]
    merged: dict[tuple[str, str], Row] = {}
    for pass_ in passes:
        if plan is not None:
            plan.only = pass_
        for name in chosen:
            sized_here = args.size == "gpu" or args.compile or name == "llama"
            if name == "peak" or (pass_ == "compiled" and not (sized_here and name in sized.WORKLOADS)):
                continue
            for row in _rows(name, precisions, timing, args.tiny, plan if sized_here else None):
                if "size" in row.extra:
                    key = (row.workload, row.precision)
                    if key in merged:
                        sized.merge(merged[key], row)
                        row = merged[key]
                    else:
                        merged[key] = row
                        rows.append(row)
                    print(sized.describe(row, peaks.get(row.precision)), flush=True)
                    # the JSON so far: a run stopped from outside keeps the rows it finished
                    _write_json(args, env, partial, {"machine": env, "peaks": peaks, "rows": [r.__dict__ for r in rows]})
                    continue
                rows.append(row)
                ratios = ", ".join(f"{row.ratio('zoo' if 'zoo' in row.seconds else 'zoo compiled', s):.2f}x vs {s}"
                                   for s in row.seconds if not s.startswith("zoo"))
                zoo_side = "zoo" if "zoo" in row.seconds else "zoo compiled"
                print(f"{row.workload} [{row.precision}]: zoo {row.throughput(zoo_side):,.1f} {row.unit}/s"
                      f"{', ' + ratios if ratios else ''}", flush=True)
    table = markdown(rows, peaks, env)
    if plan is not None and plan.skipped:
        print(f"past the --budget of {args.budget:g} s, not run: {'; '.join(plan.skipped)}", flush=True)
    # a run of some workloads (--only) is results/<names>-<time>.json, which a page section shows
    # (bench/NOTES.md: <!-- generated: bench-table ... -->); only a full run replaces the page's table
    _write_json(args, env, partial, {"machine": env, "peaks": peaks, "rows": [r.__dict__ for r in rows]})
    out_md = args.out or (None if args.tiny or partial else ROOT / "docs" / "benchmarks.md")
    if out_md is not None:
        write_docs(rows, peaks, env, out_md)
    print(table)
    return 0


def memory_main(args, env: dict) -> int:
    """Peak training memory per process against zoo's plan (bench/memory.py); writes bench/MEMORY.md
    and rebuilds docs/benchmarks.md with the newest speed run (unless --tiny)."""
    from bench import memory

    rows = memory.run_all("gpt2-small", tiny=args.tiny)
    _write_json(args, env, "memory-", {"machine": env, "rows": rows})
    md = memory.markdown(rows, "gpt2-small", env)
    print(md)
    if args.tiny or args.out:  # a check, or a table of its own (tools/gpu-check): the docs keep theirs
        if args.out:
            args.out.write_text(md)
        return 0
    MEMORY_MD.write_text(md)
    _rebuild_docs(args)
    return 0


def convert_memory_main(args, env: dict) -> int:
    """Peak memory of ``zoo convert`` against the checkpoint's size (bench/convert_memory.py); writes
    bench/CONVERT_MEMORY.md and rebuilds docs/benchmarks.md with the newest speed run (unless --tiny)."""
    from bench import convert_memory

    rows = convert_memory.run_all(tiny=args.tiny)
    _write_json(args, env, f"{CONVERT_MEMORY}-", {"machine": env, "rows": rows})
    md = convert_memory.markdown(rows, env)
    print(md)
    if args.tiny or args.out:
        if args.out:
            args.out.write_text(md)
        return 0
    CONVERT_MEMORY_MD.write_text(md)
    _rebuild_docs(args)
    return 0


def _stamp(env: dict) -> str:
    return env["date"].replace(" ", "_").replace(":", "")


def _write_json(args, env: dict, prefix: str, data: dict) -> None:
    """A run's results at ``--json``, or bench/results/[tiny-]<prefix><time>.json."""
    out_json = args.json or ROOT / "bench" / "results" / (("tiny-" if args.tiny else "") + f"{prefix}{_stamp(env)}.json")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(data, indent=1))


def _rebuild_docs(args) -> None:
    speed = sorted(p for p in (ROOT / "bench" / "results").glob("2*.json"))
    if speed:
        data = json.loads(speed[-1].read_text())
        write_docs([Row(**r) for r in data["rows"]], data["peaks"], data["machine"], args.out or ROOT / "docs" / "benchmarks.md")


def translation_quality_main(args, env: dict) -> int:
    """zoo's translation recipe against HF Marian (bench/quality.py); writes bench/QUALITY.md and
    rebuilds docs/benchmarks.md with the newest speed run (unless --tiny)."""
    from bench import quality

    out = (args.json.parent if args.json else ROOT / "runs") / f"{QUALITY}-{_stamp(env)}"
    tiny = ["data.valid=10", "data.test=10", "data.train_limit=300", "train.steps=6", "run.eval_every=3",
            "run.checkpoint_every=3", "train.average_last=2", "data.vocab_size=300", "decode.max_len_b=5",
            "decode.eval_sentences=4", "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2,block.ffn.hidden=64]"]
    report = quality.translation_quality(minutes=0.2 if args.tiny else args.minutes, out_dir=out,
                                         peer_lrs=(1e-3,) if args.tiny else (5e-4, 1e-3),
                                         zoo_overrides=tiny if args.tiny else [])
    report["machine"] = env
    _write_json(args, env, f"{QUALITY}-", report)
    md = "## Translation quality: zoo's recipe against HF Marian\n\n" + quality.markdown(report, env)
    print(md)
    if args.tiny:
        if args.out:
            args.out.write_text(md)
        return 0
    QUALITY_MD.write_text(md)
    _rebuild_docs(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
