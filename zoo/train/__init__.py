"""What every recipe shares: the one training loop (``fit`` over a ``Task``), configs, distributed
set-up, FSDP, optimizers and schedules, checkpoints (atomic, resumable, averaged, carrying the model's
spec), a metrics log with plots, and progress. Nothing here serves one recipe alone.

Recipes (``recipes/*.py``) are thin scripts over these pieces, with their own data preparation and
scoring beside them; see docs/training.md and docs/recipes/.
"""

from zoo.train.checkpoint import (
    CheckpointError,
    average_checkpoints,
    average_state_dicts,
    check_checkpoint,
    checkpoint_name,
    checkpoint_problem,
    checkpoint_spec,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_sharded_checkpoint,
    model_spec,
    prune_checkpoints,
    read_train_state,
    resolve_resume,
    restore_rng,
    rng_state,
    save_checkpoint,
    save_sharded_checkpoint,
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
    Resolved,
    on_cuda,
    parse_args,
    resolve_config,
    settings,
)
from zoo.train.distributed import Dist, distributed, resolve_device
from zoo.train.errors import TrainError
from zoo.train.fsdp import apply_fsdp, full_parameters, gathered, set_activation_checkpointing
from zoo.train.loop import Fitted, ListTask, Task, fit
from zoo.train.metrics import MetricsLog, Progress, metrics_figure, perplexity, plot_metrics, read_metrics, series_styles
from zoo.train.optim import (EMA, autocast, bf16_is_fast, build_optimizer, build_scheduler, lr_factor, param_groups,
                             resolve_precision, seed_everything)
from zoo.train.router import MoELayer, RouterLosses, RouterTraining, moe_layers, plot_expert_load, router_losses
from zoo.train.runtime import attention_kernels, tune_malloc

__all__ = [
    "CheckpointError", "average_checkpoints", "average_state_dicts", "check_checkpoint", "checkpoint_name",
    "checkpoint_problem", "checkpoint_spec",
    "latest_checkpoint", "list_checkpoints", "load_checkpoint", "load_sharded_checkpoint", "model_spec",
    "prune_checkpoints", "read_train_state", "resolve_resume", "restore_rng", "rng_state", "save_checkpoint",
    "save_sharded_checkpoint", "unwrap", "Config", "ConfigError", "OptimConfig", "RunConfig", "ScheduleConfig",
    "config_to_yaml", "settings", "load_config", "parse_args", "resolve_config", "Resolved", "on_cuda", "Dist", "distributed", "resolve_device", "TrainError",
    "apply_fsdp", "full_parameters", "gathered", "set_activation_checkpointing", "Task", "ListTask", "Fitted", "fit",
    "MetricsLog", "Progress", "metrics_figure", "perplexity", "plot_metrics", "read_metrics", "series_styles", "EMA", "autocast", "bf16_is_fast",
    "build_optimizer", "build_scheduler", "lr_factor", "param_groups", "resolve_precision", "seed_everything",
    "attention_kernels", "tune_malloc", "MoELayer", "RouterLosses", "RouterTraining", "moe_layers", "plot_expert_load",
    "router_losses",
]
