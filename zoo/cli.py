"""The ``zoo`` command (also ``python -m zoo``).

    zoo                      every preset in a table (parameters, layers, width, components)
    zoo list                 registered components by kind, families, presets
    zoo show SPEC [--set k=v ...]      the resolved spec as YAML
    zoo summary SPEC [--set k=v ...] [--batch B] [--seq T] [--dtype D] [--json]
                     [--shard N] [--strategy ddp|fsdp] [--checkpointing]   (training memory per process)
                             parameters by part, FLOPs, activation memory, KV cache (meta device)
    zoo export SPEC -o FILE [--seed N] [--dtype D] [--set k=v ...]
                             a freshly initialised model as safetensors, with its spec
    zoo inspect FILE [--json]          a safetensors file's spec, tensors, dtypes, size, without building
    zoo schema               JSON Schema of spec files
    zoo average CKPT... -o FILE [--spec SPEC] [--dtype D]
                             the element-wise mean of several checkpoints' weights (training
                             checkpoints or zoo safetensors files), written with its spec
    zoo convert SRC -o DST [--to hf|timm] [--architecture CLASS] [--timm-model NAME] [--dtype D]
                [--max-shard-size SIZE] [--skip-mtp]
                             a zoo file to an HF / timm directory, or an HF / timm model to a zoo file
                             (tensor by tensor; sharded above SIZE, default 5GB)
    zoo embed MODEL [--tokenizer PATH] [--pooling mean|cls|max|pooler] [--[no-]normalize] [--similarity]
                             sentence embeddings of stdin's lines, one vector a line (numbers
                             separated by spaces), or their cosine similarity matrix
    zoo generate MODEL [PROMPT] [--max-new-tokens N] [--sample | --beams K] [--stop STR ...] [--chat] [--echo]
                             text in, text out: the model's continuation of PROMPT (or of each line of
                             stdin), with its own tokenizer; written as it comes
    zoo ablate GRID [-o OUT] [--jobs N] [--only ROW ...]
                             run an ablation grid (rows of overrides over one recipe); table + plot
    zoo kernels [--measure SPEC [--set k=v ...] [--batch B] [--seq T] [--precision P] [--infer]]
                [--clear] [--json]
                             the CPU kernels this machine chose by timing (oneDNN or MKL linears, zoo's
                             or SDPA's attention); --measure makes a run's choices before a torchrun

SPEC is a preset name, a YAML file, or a .safetensors file written by zoo (its stored spec).
Every failure prints one line, ``zoo: error: ...``, and exits with status 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
from rich.console import Console

from zoo import cli_generate, cli_kernels
from zoo.build import build, count_parameters
from zoo.cli_tables import human_bytes, inspect_lines, layer_lines, memory_table, presets_table, summary_table
from zoo.finetune.spec import ADAPTERS
from zoo.io import LoadError, SaveError, one_line, read_header, read_spec, save
from zoo.registry import REGISTRIES, RegistryError
from zoo.shards import DEFAULT_MAX_SHARD_SIZE
from zoo.spec import SpecError, json_schema, load_spec, preset_names, to_yaml

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class UsageError(Exception):
    """A command line argparse refuses; carries its message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + error
        raise UsageError(f"{message} (see '{self.prog} --help')")


def positive_int(text: str) -> int:
    """argparse ``type=`` of a count (processes, tokens, jobs, beams): a whole number, at least 1;
    argparse names the option in the error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _spec(source: str, overrides: list[str]):
    if source.endswith((".safetensors", ".safetensors.index.json")):
        return load_spec(read_spec(source), overrides)
    return load_spec(source, overrides)


def _list(console: Console) -> None:
    for part, reg in [*REGISTRIES.items(), ("adapter", ADAPTERS)]:  # adapters: zoo.finetune's, for built models
        console.print(f"[bold]{part}[/]: {', '.join(reg.names())}")
    console.print(f"[bold]presets[/]: {', '.join(preset_names())}")


def _summary(args, console: Console) -> None:
    from zoo.summary import summarize

    spec = _spec(args.spec, args.overrides)
    s = summarize(spec, batch=args.batch, seq=args.seq, dtype=DTYPES[args.dtype])
    plan = None
    if args.shard is not None or args.strategy is not None or args.checkpointing:
        from zoo.summary import training_memory

        if args.dtype not in ("fp32", "bf16"):
            raise ValueError(f"--dtype {args.dtype}: training memory is planned for fp32 or bf16 (mixed precision) runs")
        plan = training_memory(spec, processes=1 if args.shard is None else args.shard, strategy=args.strategy or "ddp",
                               checkpointing=args.checkpointing, batch=args.batch, seq=args.seq, precision=args.dtype)
    if args.json:
        out = s.to_dict() | ({"training_memory": plan.to_dict()} if plan is not None else {})
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        console.print(summary_table(s, spec))
        if plan is not None:
            console.print(memory_table(plan))


def _export(args) -> None:
    spec = _spec(args.spec, args.overrides)
    if not Path(args.output).parent.is_dir():  # before building: a big model takes a while
        raise SaveError(f"cannot write {args.output!r}: no directory {str(Path(args.output).parent)!r}")
    model = build(spec, seed=args.seed)
    path = save(model, args.output, dtype=DTYPES[args.dtype])
    size = read_header(path).size  # every shard of a sharded file
    print(f"wrote {path}: {spec.name or spec.family}, {count_parameters(model):,} parameters, "
          f"{args.dtype}, seed {args.seed}, {size:,} bytes ({human_bytes(size)})")


def _inspect(args) -> None:
    header = read_header(args.file)
    if args.json:
        info = {
            "file": str(header.path), "size": header.size, "metadata": {k: v for k, v in header.metadata.items() if k != "zoo.spec"},
            "tensors": len(header.tensors), "dtypes": header.dtypes(), "parameters": header.n_elements, "tied": header.tied,
            "spec": read_spec(header.path).model_dump(mode="json")
            if "zoo.spec" in header.metadata and "zoo.shard" not in header.metadata else None,
        }
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(inspect_lines(header)) + "\n")


def _convert(args) -> None:
    import logging

    from zoo.interop.files import convert

    for name in ("transformers", "timm", "huggingface_hub"):  # their progress bars and notices are not ours
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    done = convert(args.src, args.output, to=args.to, dtype=DTYPES[args.dtype] if args.dtype else None,
                   architecture=args.architecture, timm_model=args.timm_model,
                   max_shard_size=None if args.max_shard_size.lower() == "none" else args.max_shard_size,
                   skip_mtp=args.skip_mtp)
    what = {"zoo": "zoo file", "hf": "HF directory", "timm": "timm directory"}[done.kind]
    print(f"wrote {done.path}: {what}, {done.reference}, {done.parameters:,} parameters"
          + (f", {args.dtype}" if args.dtype else ""))
    if done.ignored:
        shown = ", ".join(done.ignored[:4]) + (f" (+{len(done.ignored) - 4} more)" if len(done.ignored) > 4 else "")
        print(f"left out {len(done.ignored)} tensors {done.reference} does not read: {shown}")
    for note in done.notes:
        print(note)


def _convert_parser(sub) -> argparse.ArgumentParser:
    text = "convert a zoo file to an HF or timm directory, or an HF or timm model to a zoo file (exact; offline)"
    p = sub.add_parser("convert", help=text, description=text + (
        ". SRC is a zoo .safetensors file, an HF model directory (config.json + weights, as save_pretrained writes), "
        "a timm directory (config.json + model.safetensors), or a timm .safetensors checkpoint with --timm-model."))
    p.add_argument("src", metavar="SRC", help="a zoo .safetensors file, an HF or timm model directory, or a timm checkpoint")
    p.add_argument("-o", "--output", required=True, metavar="DST",
                   help="a new directory (from a zoo file) or the .safetensors file to write (to zoo)")
    p.add_argument("--to", choices=("hf", "timm"), default=None,
                   help="target of a zoo file (default: timm for a ViT, hf otherwise)")
    from zoo.interop.catalog import LIBRARIES

    classes = "; ".join(f"{library}: {', '.join(archs)}" for library, (_, archs) in LIBRARIES.items())
    p.add_argument("--architecture", default=None, metavar="CLASS",
                   help=f"the reference class a zoo file converts to: {classes} (a timm class means --to timm; "
                        "default: the target's first class, in this order, whose options express the spec; "
                        "docs/interop.md lists what each takes); of an HF directory holding a multimodal model "
                        "(Llama4ForConditionalGeneration), its text model's class (Llama4ForCausalLM) reads that alone")
    p.add_argument("--timm-model", default=None, metavar="NAME",
                   help="the timm model a bare timm .safetensors checkpoint holds, e.g. vit_tiny_patch16_224")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="dtype of the written tensors (default: as read)")
    p.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE, metavar="SIZE",
                   help="above this size the written zoo file or HF checkpoint is split into shards and an index "
                        f"(bytes, or 5GB, 500MB, 2GiB; none: never; default {DEFAULT_MAX_SHARD_SIZE})")
    p.add_argument("--skip-mtp", action="store_true",
                   help="convert an HF checkpoint without its multi-token-prediction module (DeepSeek-V3's layer past "
                        "the last, Qwen3-Next's mtp.*), which neither HF's class nor zoo holds; without it such a "
                        "checkpoint is refused")
    return p


def _embed_parser(sub) -> argparse.ArgumentParser:
    from zoo.embed import POOLINGS

    text = "sentence embeddings of the lines on stdin, from a zoo encoder or a decoder with head: none"
    p = sub.add_parser("embed", help=text, description=text + (
        ". Writes one vector a line, its numbers separated by spaces (an empty line gives an empty line); with "
        "--similarity, the cosine similarities of the non-empty lines instead, one row a line. Pooling, "
        "normalisation, truncation and lowercasing are what the file records (zoo convert records a "
        "sentence-transformers model's), else mean pooling, no normalising, the model's max_seq_len."))
    p.add_argument("model", metavar="MODEL", help="a zoo .safetensors file")
    p.add_argument("--tokenizer", default=None, metavar="PATH", help="the model's tokenizer.json (default: tokenizer.json "
                   "next to MODEL, where zoo convert copies it)")
    p.add_argument("--pooling", choices=POOLINGS, default=None, help="over the tokens' hidden states (default: the file's, else mean)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="divide each vector by its length (default: the file's, else no)")
    p.add_argument("--similarity", action="store_true", help="print the cosine similarity matrix instead of the vectors")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="lines embedded at once (default 32)")
    return p


def _embed(args) -> None:
    from dataclasses import replace

    from zoo.data.common import stdin_lines
    from zoo.embed import Settings, embed_texts, has_tokens, load_tokenizer, stored_settings
    from zoo.io import load

    header = read_header(args.model)
    refused = build(read_spec(header.path), device="meta").hidden_states_refused()
    if refused:
        raise ValueError(f"{args.model}: {refused}")
    settings = stored_settings(header.metadata, args.model) or Settings()
    settings = replace(settings, **{k: v for k, v in (("pooling", args.pooling), ("normalize", args.normalize)) if v is not None})
    tokenizer = load_tokenizer(header.path, args.tokenizer)
    model = load(header.path)

    def row(vector) -> str:
        return " ".join(f"{x:.9g}" for x in vector.tolist())  # 9 digits: a float32 exactly

    lines = stdin_lines(sys.stdin)
    if args.similarity:
        texts = [line for line in lines if has_tokens(tokenizer, line)]
        vectors = torch.nn.functional.normalize(embed_texts(model, tokenizer, texts, settings, batch_size=args.batch_size), dim=-1)
        sys.stdout.write("".join(row(r) + "\n" for r in vectors @ vectors.T))
        return
    chunk: list[str] = []
    for line in itertools.chain(lines, [None]):  # None: the end, flush what is left
        if line is not None:
            chunk.append(line)
        if line is None or sum(1 for t in chunk if t) == args.batch_size:
            chunk = [t if has_tokens(tokenizer, t) else "" for t in chunk]  # no token: an empty line, as an empty text
            vectors = iter(embed_texts(model, tokenizer, [t for t in chunk if t], settings, batch_size=args.batch_size))
            sys.stdout.write("".join((row(next(vectors)) if t else "") + "\n" for t in chunk))
            sys.stdout.flush()
            chunk = []


def _average_spec(args, first: Path):
    """The spec of the averaged model: --spec, else the one the first input records (a training
    checkpoint's, a sharded checkpoint's or a zoo file's)."""
    from zoo.train import checkpoint_spec

    if args.spec:
        return _spec(args.spec, args.overrides)
    stored = checkpoint_spec(first)
    if stored is None:
        raise ValueError(f"{first} records no model spec (its model was not a zoo model, e.g. a wrapper around one); "
                         "give one with --spec (a preset, YAML or .safetensors file)")
    return load_spec(stored, args.overrides)


def _average(args) -> None:
    from zoo.train import CheckpointError, average_checkpoints

    if not Path(args.output).parent.is_dir():
        raise SaveError(f"cannot write {args.output!r}: no directory {str(Path(args.output).parent)!r}")
    paths = [Path(name) for name in args.checkpoints]
    for path in paths:
        if not path.is_file() and not path.is_dir():
            raise ValueError(f"no such file: {path}")
    try:
        spec = _average_spec(args, paths[0])
        averaged = average_checkpoints(paths)
    except CheckpointError as e:
        raise ValueError(str(e)) from None
    model = build(spec)
    expected = set(model.state_dict())
    if set(averaged) != expected:
        missing, extra = sorted(expected - set(averaged)), sorted(set(averaged) - expected)
        raise ValueError(f"{paths[0]} does not fit the spec ({spec.name or spec.family}): "
                         f"missing {missing[:3]}, unexpected {extra[:3]}")
    model.load_state_dict(averaged, strict=True)
    path = save(model, args.output, dtype=DTYPES[args.dtype] if args.dtype else None)
    size = read_header(path).size  # every shard of a sharded file
    print(f"wrote {path}: the mean of {len(paths)} checkpoints, {spec.name or spec.family}, "
          f"{count_parameters(model):,} parameters, {size:,} bytes ({human_bytes(size)})")
    counters = [k for k, t in averaged.items() if not t.is_floating_point()]
    if counters and len(paths) > 1:
        print(f"  {len(counters)} integer tensor(s) ({counters[0]}{', ...' * (len(counters) > 1)}) are the last "
              "checkpoint's, not averaged")


def _average_parser(sub) -> argparse.ArgumentParser:
    text = "the element-wise mean of several checkpoints' weights (the paper's checkpoint averaging)"
    p = sub.add_parser("average", help=text, description=text + (
        ". Inputs are training checkpoints (.pt files or sharded .dcp folders written by zoo.train, which "
        "record the model's spec) or .safetensors files written by zoo, all of one model."))
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="training checkpoints (.pt files or sharded .dcp folders) or zoo .safetensors files")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the .safetensors file to write")
    p.add_argument("--spec", default=None, metavar="SPEC",
                   help="the model's spec (preset, YAML or .safetensors); default: the first input's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the spec (repeatable)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="dtype of the written tensors (default: as averaged)")
    return p


def _ablate_parser(sub) -> argparse.ArgumentParser:
    text = "run an ablation grid: rows of overrides over one recipe, then a table and a plot"
    p = sub.add_parser("ablate", help=text, description=text + (
        ". Finished rows (cached by their resolved overrides) are not run again, so an interrupted grid "
        "resumes. See docs/recipes/ablation.md for the file format."))
    p.add_argument("grid", metavar="GRID", help="the ablation YAML file")
    p.add_argument("-o", "--out", default=None, metavar="DIR", help="where runs and results go (default: runs/ablate/<grid name>)")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="N", help="rows run at once (default 1)")
    p.add_argument("--only", nargs="+", default=None, metavar="ROW", help="run these rows only")
    p.add_argument("--table", default=None, metavar="PATH",
                   help="write the table (.md and .csv) and plot (.png) here (default: OUT/table)")
    return p


def _ablate(args) -> None:
    from zoo.ablate import load_ablation, plot_grid, run_grid, write_table

    grid, _ = load_ablation(args.grid)
    out = Path(args.out) if args.out else Path("runs") / "ablate" / Path(args.grid).stem
    records = run_grid(args.grid, out, jobs=args.jobs, only=args.only, echo=lambda m: print(m, flush=True))
    table = Path(args.table) if args.table else out / "table"
    md, csv_path = write_table(records, grid.metrics, table)
    png = plot_grid(records, grid.metrics, table, grid.reference)
    sys.stdout.write(md.read_text())
    print(f"wrote {md}, {csv_path}, {png}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zoo", description="A configurable Transformer architecture zoo.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("presets", help="every preset in a table (the default)")
    sub.add_parser("list", help="registered components, families and presets")

    def spec_command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("spec", metavar="SPEC", help="a preset name, a YAML file, or a .safetensors file written by zoo")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a field, e.g. --set block.attention.n_heads=4 (repeatable)")
        return p

    spec_command("show", "the resolved spec as YAML")
    summary = spec_command("summary", "parameters by part, FLOPs, activation memory and KV cache, on the meta device")
    summary.add_argument("--batch", type=positive_int, default=1, metavar="B", help="batch size for memory estimates (default 1)")
    summary.add_argument("--seq", type=positive_int, default=None, metavar="T",
                         help="tokens per sequence (default: max_seq_len; a ViT's is fixed)")
    summary.add_argument("--dtype", choices=DTYPES, default="fp32", help="bytes per element for memory (default fp32)")
    summary.add_argument("--json", action="store_true", help="print the numbers as JSON")
    summary.add_argument("--shard", type=positive_int, default=None, metavar="N",
                         help="plan training memory per process for N processes (with --strategy)")
    summary.add_argument("--strategy", choices=["ddp", "fsdp"], default=None, help="how the processes share the model (default ddp)")
    summary.add_argument("--checkpointing", action="store_true", help="plan with activation checkpointing")
    export = spec_command("export", "a freshly initialised model as a safetensors file carrying its spec")
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="the .safetensors file to write")
    export.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0: exports are reproducible)")
    export.add_argument("--dtype", choices=DTYPES, default="fp32", help="dtype of the stored tensors (default fp32)")
    inspect = sub.add_parser("inspect", help="a safetensors file's spec, tensors, dtypes and size, without building",
                             description="a safetensors file's spec, tensors, dtypes and size, without building")
    inspect.add_argument("file", metavar="FILE")
    inspect.add_argument("--json", action="store_true", help="print the facts as JSON")
    sub.add_parser("schema", help="JSON Schema of spec files")
    _convert_parser(sub)
    _embed_parser(sub)
    cli_generate.add_parser(sub, positive_int, DTYPES)
    _average_parser(sub)
    _ablate_parser(sub)
    cli_kernels.add_parser(sub, positive_int)
    return parser


def commands() -> list[tuple[str, str]]:
    """Every subcommand as (``zoo NAME POSITIONALS``, its help line), in ``zoo --help``'s order."""
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    out = []
    for name, p in sub.choices.items():
        args = [f"{a.option_strings[0]} {a.metavar}" for a in p._actions if a.option_strings and a.required]
        args += [(f"[{a.metavar or a.dest}]" if a.nargs == "?" else (a.metavar or a.dest) + ("..." if a.nargs in ("+", "*") else ""))
                 for a in p._actions if not a.option_strings]
        out.append((" ".join(["zoo", name, *args]), helps[name]))
    return out


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    text = one_line(error)
    known = (SpecError, RegistryError, LoadError, SaveError, UsageError, ValueError)
    return text if isinstance(error, known) else f"{type(error).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except UsageError as e:
        print(f"zoo: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    console = Console(width=max(Console().width, 140))
    try:
        if args.command in (None, "presets"):
            console.print(presets_table())
        elif args.command == "list":
            _list(console)
        elif args.command == "show":
            spec = _spec(args.spec, args.overrides)
            sys.stdout.write(to_yaml(spec))
            if spec.layers:
                sys.stdout.write("# the layers, resolved:\n" + "".join(f"#   {line}\n" for line in layer_lines(spec)))
        elif args.command == "summary":
            _summary(args, console)
        elif args.command == "export":
            _export(args)
        elif args.command == "inspect":
            _inspect(args)
        elif args.command == "schema":
            sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
        elif args.command == "convert":
            _convert(args)
        elif args.command == "embed":
            _embed(args)
        elif args.command == "generate":
            cli_generate.run(args, DTYPES)
        elif args.command == "average":
            _average(args)
        elif args.command == "ablate":
            _ablate(args)
        elif args.command == "kernels":
            cli_kernels.run(args, console, _spec)
    except KeyboardInterrupt:
        print("zoo: error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure is one line, never a traceback
        print(f"zoo: error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
