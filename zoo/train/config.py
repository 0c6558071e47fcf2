"""Recipe configs: a pydantic model read from a YAML file, then ``key.path=value`` overrides.

    class MyConfig(Config):
        model: str = "vit-tiny-16"
        optim: OptimConfig = OptimConfig()
        run: RunConfig = RunConfig()

    cfg, args = parse_args(MyConfig, default="recipes/my.yaml")   # [--config F ...] [--resume] [k=v ...]
    cfg = load_config(MyConfig, "my.yaml", ["optim.lr=3e-4", "run.seed=1"])

Overrides and YAML are read exactly as model specs are (:func:`zoo.spec.apply_overrides`,
:func:`zoo.spec.read_yaml`): values are YAML (``4``, ``0.1``, ``true``, ``null``, ``[0.9, 0.98]``),
duplicate keys and unknown fields are errors that name the field. Files layer: a recipe reads its own
YAML first, then each ``--config`` file over it (mappings merge key by key, so a file holds only what
it changes, as Hydra and torchtune's overrides do), then the overrides.

A recipe may declare a GPU layer (``recipes/lm.gpu.yaml`` beside ``recipes/lm.yaml``): GPU-sized
values laid over its own YAML, under the user's files and overrides, only when ``run.device``
resolves to CUDA (:func:`resolve_config`); ``--print-config --sources`` marks them ``gpu-default``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Annotated, Generic, Iterable, Literal, Sequence, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from zoo.spec import SpecError, apply_overrides, read_yaml
from zoo.validation import validation_message

__all__ = [
    "Config", "ConfigError", "OptimConfig", "ScheduleConfig", "RunConfig", "load_config", "parse_args",
    "config_to_yaml", "settings", "resolve_config", "Resolved", "on_cuda",
]

C = TypeVar("C", bound="Config")


class ConfigError(ValueError):
    """A config that cannot be used; the message names each bad field."""


Decay = Annotated[float, Field(ge=0.0, lt=1.0)]  # a moving average's decay (Adam's betas)


class Config(BaseModel):
    """Base of recipe configs: unknown keys are errors, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True, allow_inf_nan=False)


class OptimConfig(Config):
    """Adam(W). Weight decay is decoupled (AdamW) and skips norms, biases, position tables and class
    tokens (see :func:`zoo.train.param_groups`). ``clip_grad``: max global gradient norm, or null.
    ``layer_decay``: BEiT's layer-wise learning-rate decay, lower layers' lrs scaled down geometrically."""

    name: Literal["adamw", "adam"] = Field("adamw", description="adamw: decoupled weight decay; adam: L2 added to the gradient")
    lr: PositiveFloat = Field(1e-3, description="peak learning rate (inverse_sqrt: a factor on the paper's schedule)")
    betas: tuple[Decay, Decay] = Field((0.9, 0.999), description="Adam's moment decays, each in [0, 1)")
    eps: PositiveFloat = Field(1e-8, description="Adam's epsilon")
    weight_decay: NonNegativeFloat = Field(0.05, description="on matrices only (not norms, biases, position tables)")
    clip_grad: PositiveFloat | None = Field(1.0, description="max global gradient norm; null: no clipping")
    layer_decay: float | None = Field(None, gt=0.0, le=1.0, description="layer-wise lr decay (BEiT, fine-tuning): "
                                      "block i of n gets lr * layer_decay ** (n - i), the embeddings lr * "
                                      "layer_decay ** (n + 1), the head lr; null: one lr for all")


class ScheduleConfig(Config):
    """Learning-rate schedule, a factor on ``optim.lr`` at each optimizer step.

    ``cosine``: linear warmup, then half a cosine down to ``min_lr_ratio`` * lr.
    ``inverse_sqrt``: the paper's ``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``; the factor is
    the learning rate itself, so ``optim.lr`` scales it (1.0 reproduces the paper).
    ``constant``: linear warmup, then flat. ``warmup`` counts optimizer steps.
    ``cooldown``: a fraction of the run at its end over which any of these falls linearly to zero
    (warmup-stable-decay); the run's progress is its steps, or its time budget where a recipe has one
    and that runs out first, so a run stopped by the clock still ends annealed.
    """

    kind: Literal["cosine", "inverse_sqrt", "constant"] = Field(
        "cosine", description="cosine (warmup, then down to min_lr_ratio), inverse_sqrt (the paper's) or constant")
    warmup: NonNegativeInt = Field(0, description="optimizer steps of linear warmup")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine: where it ends, a fraction of optim.lr")
    cooldown: float = Field(0.0, ge=0.0, le=1.0, description="the last fraction of the run (steps or time budget, "
                            "whichever runs out first) over which the lr falls linearly to 0; 0: none")

    @model_validator(mode="after")
    def _check(self) -> ScheduleConfig:
        if self.kind == "inverse_sqrt" and self.warmup == 0:
            raise ValueError("schedule inverse_sqrt needs warmup > 0 steps (the paper: 4000)")
        return self


class RunConfig(Config):
    """How a run executes: where it writes, precision, devices, logging, checkpoints."""

    out_dir: Path = Field(Path("runs/run"), description="checkpoints, metrics.jsonl, plots, the exported model")
    seed: int = Field(0, description="seeds the weights, data order, dropout and augmentation")
    device: str = Field("auto", description="auto (cuda when available, else cpu), cpu, cuda (under torchrun: each "
                        "process its LOCAL_RANK's GPU), cuda:N (one process only)")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="bf16: autocast on CPU and GPU; auto: bf16 where the hardware runs it natively "
        "(GPUs with bf16, CPUs with AVX-512/AMX), else fp32")
    compile: bool = Field(False, description="torch.compile the model for training")
    attention: Literal["default", "dense", "blocked", "flex", "math", "flash", "efficient"] = Field(
        "default", description="attention kernel: default lets zoo and torch choose (blocked on CPU, flex on CUDA where a "
        "window or packed documents bound the keys enough, else SDPA); dense/blocked/flex force how masks are computed "
        "(SDPA on the dense mask; zoo's blocked CPU kernel; FlexAttention, CUDA only); math/flash/efficient force one "
        "SDPA kernel on dense masks (zoo.train.attention_kernels): efficient is CUDA's alone, and a kernel torch cannot "
        "run for the model (flash with attention dropout on CPU, flash in fp32 on GPU, flex on a CPU) stops the run "
        "naming this field"
    )
    threads: PositiveInt | None = Field(None, description="torch intra-op threads per process (CPU work, on GPU runs "
                                        "too); default: torch's choice")
    grad_accum: PositiveInt = Field(1, description="micro-batches per optimizer step")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="how several processes share the work: ddp replicates the model on every process; fsdp "
        "shards parameters, gradients and optimizer state over them (PyTorch FSDP2; zoo.train.fsdp). On one process "
        "either trains the whole model; fsdp still writes sharded checkpoints, which resume on any number of processes")
    offload: bool = Field(False, description="fsdp on several GPU processes only: keep the sharded parameters, "
                          "gradients and optimizer state in CPU memory; refused on CPU and on one process (no shards)")
    activation_checkpointing: bool = Field(False, description="recompute each block's activations in the backward "
                                           "pass instead of keeping them (less memory, ~1/3 more compute)")
    log_every: PositiveInt = Field(50, description="steps between train-loss log lines and metrics.jsonl rows")
    eval_every: PositiveInt | None = Field(None, description="steps between evaluations; default: once an epoch")
    checkpoint_every: PositiveInt | None = Field(None, description="steps between checkpoints; default: once an epoch")
    keep_checkpoints: PositiveInt = Field(2, description="how many periodic checkpoints to keep (newest)")
    ema: float | None = Field(None, gt=0.0, lt=1.0, description="decay of an EMA of the weights (e.g. 0.999), or null")
    progress: bool = Field(True, description="a progress bar on rank 0 (off when stderr is not a terminal: log lines)")
    plot: bool = Field(True, description="write curves.png at each evaluation")

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        kind, _, index = v.partition(":")
        if v not in ("auto", "cpu", "cuda") and not (kind == "cuda" and index.isdigit()):
            raise ValueError(f"{v!r} is not a device zoo trains on; use auto, cpu, cuda or cuda:N")
        return v

    @model_validator(mode="after")
    def _check_strategy(self) -> RunConfig:
        if self.offload and self.strategy != "fsdp":
            raise ValueError("run.offload: CPU offload is part of FSDP; set run.strategy=fsdp or run.offload=false")
        return self


# ------------------------------------------------------------------------------------ loading
Sources = dict[str, str]  # dotted key -> where its value came from


def _layer(base: dict, over: dict, source: str, sources: Sources, prefix: str = "") -> dict:
    """``over`` laid over ``base``: mappings merge key by key, anything else (lists too) replaces."""
    out = dict(base)
    for key, value in over.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            below = out.get(key)
            if not isinstance(below, dict):
                below = {}
                sources.pop(path, None)
            out[key] = _layer(below, value, source, sources, path + ".")
        else:
            out[key] = value
            for old in [k for k in sources if k == path or k.startswith(path + ".")]:
                del sources[old]
            sources[path] = source
    return out


def _read(path: str | Path) -> dict:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config {source}: {e.strerror or e}") from None
    try:
        data = read_yaml(text, f"config {source}") or {}
    except SpecError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {source} must hold a mapping of fields, got {type(data).__name__}")
    return data


def load_config(
    cls: type[C], path: str | Path | Sequence[str | Path] | None = None, overrides: Iterable[str] = (),
    *, sources: Sources | None = None,
) -> C:
    """``cls`` from its defaults, then each YAML file of ``path`` in order (one path or a list: a later
    file's keys replace an earlier one's, mappings merge key by key, keys it leaves out keep their
    values), then ``a.b=value`` overrides. Pass a dict as ``sources`` to learn where each set value
    came from (dotted key -> file or "command line"); keys absent from it are the class defaults."""
    paths = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    found: Sources = {} if sources is None else sources
    data: dict = {}
    for file in paths:
        data = _layer(data, _read(file), str(file), found)
    names = " + ".join(map(str, paths)) or "(defaults)"
    overrides = list(overrides)
    if overrides:
        try:
            data = apply_overrides(data, overrides)
        except SpecError as e:
            raise ConfigError(str(e)) from None
        for key in (o.partition("=")[0].strip() for o in overrides):
            for old in [k for k in found if k == key or k.startswith(key + ".")]:
                del found[old]
            found[key] = "command line"
        names += f" with {' '.join(overrides)}"
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_message(e, f"config {names}")) from None


def config_to_yaml(cfg: Config, sources: Sources | None = None) -> str:
    """Every field of ``cfg`` as YAML, readable back by :func:`load_config`; with ``sources`` (from
    :func:`load_config`), each value ends in a comment saying where it came from."""
    import yaml

    data = cfg.model_dump(mode="json")
    if sources is None:
        return yaml.safe_dump(data, sort_keys=False)
    default = f"default ({type(cfg).__name__})"

    def lines(node: dict, prefix: str, indent: str) -> list[tuple[str, str]]:
        out = []
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                out.append((f"{indent}{key}:", ""))
                out += lines(value, path + ".", indent + "  ")
            else:
                flow = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()
                origin = next((sources[p] for p in _prefixes(path) if p in sources), default)
                out.append((f"{indent}{key}: {flow}", f"  # {origin}"))
        return out

    rows = lines(data, "", "")
    width = min(48, max(len(text) for text, _ in rows))
    return "".join(f"{text.ljust(width) if origin else text}{origin}\n" for text, origin in rows)


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def settings(cfg: Config) -> list[tuple[str, str, str]]:
    """(dotted key, value as YAML, description) of every setting of ``cfg``, in the config's order:
    what a recipe's ``--help`` and the recipes' settings tables show."""
    import yaml

    def rows(node: BaseModel, prefix: str) -> list[tuple[str, str, str]]:
        out = []
        for name, info in type(node).model_fields.items():
            value = getattr(node, name)
            if isinstance(value, BaseModel):
                out += rows(value, f"{prefix}{name}.")
                continue
            shown = yaml.safe_dump(node.model_dump(mode="json")[name], default_flow_style=True, width=1 << 16)
            out.append((f"{prefix}{name}", shown.removesuffix("...\n").strip(), info.description or ""))
        return out

    return rows(cfg, "")


def _help_settings(cls: type[C], default: str | Path | None) -> str:
    try:
        cfg = load_config(cls, default)
    except ConfigError as e:
        return f"settings: the defaults do not load ({e})"
    lines = ["settings and their defaults (set any with key=value; --print-config --sources shows where each "
             "value comes from):"]
    for key, value, description in settings(cfg):
        lines.append(f"  {key}={value}" + (f"\n      {description}" if description else ""))
    return "\n".join(lines)


GPU_SOURCE = "gpu-default"


def on_cuda(device: str) -> bool:
    """Whether ``run.device`` resolves to a CUDA GPU here: ``cuda``/``cuda:N``, or ``auto`` where
    CUDA is available (as :func:`zoo.train.resolve_device` decides); nothing is started."""
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.partition(":")[0] == "cuda"


@dataclass
class Resolved(Generic[C]):
    """A recipe's config and where its values came from; ``gpu``: the GPU layer's keys that took effect
    (dotted key -> value), empty when the layer was not applied or the user set all of them."""

    config: C
    sources: Sources
    gpu: dict[str, object] = field(default_factory=dict)


def _flat(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolve_config(
    cls: type[C], default: str | Path | None = None, configs: Sequence[str | Path] = (), overrides: Iterable[str] = (),
    *, gpu: str | Path | None = None, defaults: Literal["auto", "gpu", "cpu"] = "auto",
) -> Resolved[C]:
    """The config a recipe runs with: ``cls``'s defaults, the recipe's own YAML (``default``), its GPU
    layer (``gpu``, a YAML of GPU-sized values) when ``defaults`` is ``gpu``, or ``auto`` and the
    device resolves to CUDA (:func:`on_cuda` of ``run.device`` as the other layers set it), then
    each of the user's ``configs`` files and the ``key=value`` overrides: a key the user sets, in a
    file or on the command line, keeps the user's value. Sources name the recipe's files by their
    name (``lm.yaml (the recipe's defaults)``) and the GPU layer's keys ``gpu-default (lm.gpu.yaml)``."""
    if defaults not in ("auto", "gpu", "cpu"):
        raise ConfigError(f"--defaults {defaults!r}: use auto, gpu or cpu")
    overrides = list(overrides)
    base = ([] if default is None else [default])
    sources: Sources = {}
    cfg = load_config(cls, [*base, *configs], overrides, sources=sources)
    device = getattr(getattr(cfg, "run", None), "device", "cpu")
    applied: dict[str, object] = {}
    if gpu is not None and (defaults == "gpu" or (defaults == "auto" and on_cuda(device))):
        sources = {}
        cfg = load_config(cls, [*base, gpu, *configs], overrides, sources=sources)
        layer = _flat(_read(gpu))
        if any(k == "run.device" or k.startswith("run.device.") for k in layer):
            raise ConfigError(f"config {gpu}: a GPU layer cannot set run.device (the device decides whether it applies)")
        applied = {k: v for k, v in layer.items() if sources.get(k) == str(gpu)}
    labels = {}
    if default is not None:
        labels[str(default)] = f"{Path(default).name} (the recipe's defaults)"
    if gpu is not None:
        labels[str(gpu)] = f"{GPU_SOURCE} ({Path(gpu).name})"
    return Resolved(cfg, {k: labels.get(v, v) for k, v in sources.items()}, applied)


def gpu_note(resolved: Resolved, gpu: str | Path) -> str:
    """The line a recipe starts with when its GPU layer took effect: which values it set."""
    shown = " ".join(f"{k}={_flow(v)}" for k, v in resolved.gpu.items())
    return (f"{GPU_SOURCE}s ({Path(gpu).name}; set any to change it, --defaults cpu for none): {shown}")


def _flow(value: object) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()


def parse_args(
    cls: type[C], argv: Sequence[str] | None = None, *, default: str | Path | None = None, description: str = "",
    gpu: str | Path | None = None,
) -> tuple[C, argparse.Namespace]:
    """The command line of a recipe: ``[--config FILE ...] [--resume [CKPT]] [--print-config [--sources]]
    [--defaults auto|gpu|cpu] [key=value ...]``.

    The recipe's own YAML (``default``) is read first; on CUDA its GPU layer (``gpu``, see
    :func:`resolve_config`) over it; each ``--config`` file is laid over them in order (a file holds
    only what it changes), then the ``key=value`` overrides. ``--resume`` alone continues from the
    newest checkpoint in ``run.out_dir``; with a path, from that file. A bad config prints one line and
    exits with status 2. When the GPU layer sets anything, a line on rank 0 says what
    (``args.gpu_note``; ``None`` otherwise).
    """
    parser = argparse.ArgumentParser(description=description, epilog=_help_settings(cls, default),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. optim.lr=3e-4")
    shown = Path(default).name if default is not None else None
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help=f"YAML laid over the recipe's defaults ({shown}): it holds only the keys it changes; "
                             "repeat to layer several")
    parser.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                        help="continue from the newest checkpoint in run.out_dir, or from CKPT")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--sources", action="store_true",
                        help="with --print-config: say where each value came from (a file, the command line, a default)")
    if gpu is not None:
        parser.add_argument("--defaults", choices=("auto", "gpu", "cpu"), default="auto",
                            help=f"auto: lay the recipe's GPU-sized values ({Path(gpu).name}) under your settings "
                                 "when run.device resolves to CUDA; gpu: always (e.g. to see them with "
                                 "--print-config on a CPU); cpu: never")
    args = parser.parse_args(argv)
    if args.resume not in (None, "latest") and "=" in args.resume and not Path(args.resume).exists():
        # `--resume key=value`: argparse hands the override to --resume's optional CKPT
        args.overrides.insert(0, args.resume)
        args.resume = "latest"
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"overrides look like key.path=value, got {bad[0]!r}")
    if args.sources and not args.print_config:
        parser.error("--sources goes with --print-config")
    try:
        resolved = resolve_config(cls, default, args.config, args.overrides, gpu=gpu,
                                  defaults=getattr(args, "defaults", "cpu"))
    except ConfigError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    cfg = resolved.config
    if args.print_config:
        print(config_to_yaml(cfg, resolved.sources if args.sources else None), end="")
        raise SystemExit(0)
    args.gpu_note = gpu_note(resolved, gpu) if resolved.gpu else None
    if args.gpu_note and os.environ.get("RANK", "0") == "0":
        print(args.gpu_note, flush=True)
    return cfg, args
