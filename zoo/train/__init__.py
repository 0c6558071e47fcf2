"""Shared recipe machinery: the one training loop (``fit`` over a ``Task``), configs, distributed
set-up, optimizers and schedules, checkpoints (atomic, resumable, averaged), a metrics log with
plots, and progress.

Recipes (``recipes/*.py``) are thin scripts over these pieces; see docs/recipes/.
"""

from zoo.train.checkpoint import (
    CheckpointError,
    average_checkpoints,
    average_state_dicts,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    restore_rng,
    rng_state,
    save_checkpoint,
    unwrap,
)
from zoo.train.config import (
    Config,
    ConfigError,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    config_to_yaml,
    load_config,
    parse_args,
)
from zoo.train.distributed import Dist, distributed, resolve_device
from zoo.train.loop import Fitted, ListTask, Task, fit, resolve_resume
from zoo.train.metrics import MetricsLog, Progress, plot_metrics, read_metrics
from zoo.train.runtime import attention_kernels, tune_malloc
from zoo.train.sharded import load_sharded_checkpoint, save_sharded_checkpoint
from zoo.train.sharding import full_parameters, gathered, set_activation_checkpointing, shard
from zoo.train.optim import (EMA, autocast, bf16_is_fast, build_optimizer, build_scheduler, lr_factor, param_groups,
                             resolve_precision, seed_everything)

__all__ = [
    "CheckpointError", "average_checkpoints", "average_state_dicts", "checkpoint_name", "latest_checkpoint",
    "list_checkpoints", "load_checkpoint", "prune_checkpoints", "restore_rng", "rng_state", "save_checkpoint",
    "unwrap", "Config", "ConfigError", "OptimConfig", "RunConfig", "ScheduleConfig", "config_to_yaml",
    "load_config", "parse_args", "Dist", "distributed", "resolve_device", "MetricsLog", "Progress",
    "plot_metrics", "read_metrics", "EMA", "autocast", "bf16_is_fast", "resolve_precision", "build_optimizer",
    "build_scheduler", "lr_factor", "param_groups", "seed_everything", "tune_malloc", "attention_kernels",
    "Task", "ListTask", "Fitted", "fit", "resolve_resume", "load_sharded_checkpoint", "save_sharded_checkpoint",
    "full_parameters", "gathered", "set_activation_checkpointing", "shard",
]
