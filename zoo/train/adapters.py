"""Adapters in the recipes: ``finetune.lora`` trains low-rank adapters (:mod:`zoo.finetune`) instead of
every weight, and the export writes them alone beside the merged model.

    model = with_adapters(model, cfg.finetune.lora, trainable=("classifier",), run=cfg.run, dist=dist)
    fitted = fit(model, ...)                      # the optimizer takes what requires grad: the adapters
    exported = export_adapters(fitted.best, model_dir, base=str(cfg.init))   # adapters.safetensors, merged

The merged model has the module tree and state dict of an unadapted one, so ``zoo.save``, ``zoo
convert`` and ``zoo.interop.to_hf`` take it unchanged; ``adapters.safetensors`` names the base model's
spec and a hash of its weights (``zoo.finetune.load_adapters`` refuses another base).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pydantic import Field
from torch import nn

from zoo.finetune.spec import LoraSpec
from zoo.train.config import Config, RunConfig
from zoo.train.errors import TrainError

__all__ = ["AdapterConfig", "with_adapters", "export_adapters", "ADAPTERS_FILE"]

ADAPTERS_FILE = "adapters.safetensors"


class AdapterConfig(Config):
    """``finetune``: how an ``init=`` run fine-tunes."""

    lora: LoraSpec | None = Field(None, description="train low-rank adapters instead of every weight: {rank, alpha, "
                                  "dropout, targets: [q, k, v, o, ffn]} (zoo.finetune.LoraSpec); the run saves them "
                                  "alone (model/adapters.safetensors) and exports the merged model; null: every weight "
                                  "trains")


def with_adapters(model: nn.Module, lora: LoraSpec | None, *, trainable: Sequence[str] = (), run: RunConfig,
                  dist) -> nn.Module:
    """``model`` with LoRA applied as ``lora`` says (``trainable``: parameter-name prefixes trained in
    full beside the adapters, such as a fresh head), or unchanged where ``lora`` is None."""
    if lora is None:
        return model
    from zoo.finetune import apply_lora

    if run.strategy == "fsdp":
        raise TrainError("finetune.lora with run.strategy=fsdp: a sharded run rebuilds its model from the spec, "
                         "which holds no adapters; use run.strategy=ddp (the frozen weights need no optimizer state)")
    present = {name for name, _ in model.named_parameters()}
    extra = tuple(t for t in trainable if any(n == t or n.startswith(t + ".") for n in present))
    spec = lora.model_copy(update={"trainable": tuple(dict.fromkeys((*lora.trainable, *extra)))})
    try:
        apply_lora(model, spec, seed=run.seed)
    except ValueError as e:
        raise TrainError(f"finetune.lora: {e}") from None
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    dist.print(f"lora: rank {spec.rank}, alpha {spec.alpha or spec.rank}, on {', '.join(spec.targets)}"
               + (f" (+ {', '.join(spec.trainable)} in full)" if spec.trainable else "")
               + f": {n_train:,} of {n_all:,} parameters train ({100 * n_train / n_all:.2f}%)")
    return model


def export_adapters(model: nn.Module, model_dir: Path, *, base: str | None, name: str = ADAPTERS_FILE) -> nn.Module:
    """Where ``model`` carries adapters: write them alone to ``model_dir/name`` and fold them into its
    weights (in place); returns the model to ``zoo.save``."""
    from zoo.finetune import has_lora, merge_lora, save_adapters

    if not has_lora(model):
        return model
    save_adapters(model, Path(model_dir) / name, base=base)
    return merge_lora(model)
