"""Recipe configs: a pydantic model read from a YAML file, then ``key.path=value`` overrides.

    class MyConfig(Config):
        model: str = "vit-tiny-16"
        optim: OptimConfig = OptimConfig()
        run: RunConfig = RunConfig()

    cfg, args = parse_args(MyConfig, default="recipes/my.yaml")   # [--config F] [--resume] [k=v ...]
    cfg = load_config(MyConfig, "my.yaml", ["optim.lr=3e-4", "run.seed=1"])

Overrides and YAML are read exactly as model specs are (:func:`zoo.spec.apply_overrides`,
:func:`zoo.spec.read_yaml`): values are YAML (``4``, ``0.1``, ``true``, ``null``, ``[0.9, 0.98]``),
duplicate keys and unknown fields are errors that name the field.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence, TypeVar

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
    "config_to_yaml",
]

C = TypeVar("C", bound="Config")


class ConfigError(ValueError):
    """A config that cannot be used; the message names each bad field."""


class Config(BaseModel):
    """Base of recipe configs: unknown keys are errors, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


class OptimConfig(Config):
    """Adam(W). Weight decay is decoupled (AdamW) and skips norms, biases, position tables and class
    tokens (see :func:`zoo.train.param_groups`). ``clip_grad``: max global gradient norm, or null."""

    name: Literal["adamw", "adam"] = "adamw"
    lr: PositiveFloat = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: PositiveFloat = 1e-8
    weight_decay: NonNegativeFloat = 0.05
    clip_grad: PositiveFloat | None = 1.0


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

    kind: Literal["cosine", "inverse_sqrt", "constant"] = "cosine"
    warmup: NonNegativeInt = 0
    min_lr_ratio: NonNegativeFloat = 0.0
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
    seed: int = 0
    device: str = Field("auto", description="auto (cuda when available, else cpu), cpu, cuda (under torchrun: each "
                        "process its LOCAL_RANK's GPU), cuda:N (one process only)")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="bf16: autocast on CPU and GPU; auto: bf16 where the hardware runs it natively "
        "(GPUs with bf16, CPUs with AVX-512/AMX), else fp32")
    compile: bool = Field(False, description="torch.compile the model for training")
    attention: Literal["default", "math", "flash", "efficient"] = Field(
        "default", description="attention kernel: default lets zoo and torch choose; math/flash/efficient force one SDPA "
        "kernel (zoo.train.attention_kernels): efficient is CUDA's alone, and a kernel torch cannot run for the model "
        "(flash with attention dropout on CPU, flash in fp32 on GPU) stops the run naming this field"
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
    log_every: PositiveInt = 50
    eval_every: PositiveInt | None = Field(None, description="steps between evaluations; default: once an epoch")
    checkpoint_every: PositiveInt | None = Field(None, description="steps between checkpoints; default: once an epoch")
    keep_checkpoints: PositiveInt = Field(2, description="how many periodic checkpoints to keep (newest)")
    ema: float | None = Field(None, gt=0.0, lt=1.0, description="decay of an EMA of the weights (e.g. 0.999), or null")
    progress: bool = Field(True, description="a progress bar on rank 0 (off when stderr is not a terminal: log lines)")
    plot: bool = True

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
def load_config(cls: type[C], path: str | Path | None = None, overrides: Iterable[str] = ()) -> C:
    """``cls`` from a YAML file (or its defaults when ``path`` is None) plus ``a.b=value`` overrides."""
    data: Any = {}
    source = "(defaults)"
    if path is not None:
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
    overrides = list(overrides)
    if overrides:
        try:
            data = apply_overrides(data, overrides)
        except SpecError as e:
            raise ConfigError(str(e)) from None
        source += f" with {' '.join(overrides)}"
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_message(e, f"config {source}")) from None


def config_to_yaml(cfg: Config) -> str:
    """Every field of ``cfg`` as YAML, readable back by :func:`load_config`."""
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def parse_args(
    cls: type[C], argv: Sequence[str] | None = None, *, default: str | Path | None = None, description: str = ""
) -> tuple[C, argparse.Namespace]:
    """The command line of a recipe: ``[--config FILE] [--resume [CKPT]] [--print-config] [key=value ...]``.

    ``--resume`` alone continues from the newest checkpoint in ``run.out_dir``; with a path, from that
    file. A bad config prints one line and exits with status 2.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. optim.lr=3e-4")
    parser.add_argument("--config", default=default, help=f"YAML config (default: {default})")
    parser.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                        help="continue from the newest checkpoint in run.out_dir, or from CKPT")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    args = parser.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"overrides look like key.path=value, got {bad[0]!r}")
    try:
        cfg = load_config(cls, args.config, args.overrides)
    except ConfigError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.print_config:
        print(config_to_yaml(cfg), end="")
        raise SystemExit(0)
    return cfg, args
