"""The routers of a model's mixtures of experts (``ffn.kind: moe``) in training: their losses, the
auxiliary-loss-free balance, and what the metrics log shows of them.

    logits = model(tokens)                          # a forward pass: each MoE layer keeps what it routed
    extra = router_losses(model)                    # RouterLosses: aux_loss, z_loss, total
    (task_loss + extra.total).backward()            # total = aux_loss_coef * aux_loss + z_loss_coef * z_loss

:func:`~zoo.train.loop.fit` does this itself for a model with MoE layers (:class:`RouterTraining`),
after each micro-batch's forward pass and before its backward pass, so activation checkpointing's
recomputation (which runs the layers again inside the backward pass) never counts twice:

* ``aux_loss``: the Switch Transformer's load-balancing loss as HF's ``load_balancing_loss_func``
  computes it, over all MoE layers of a stack together, padding left out (the stack's padding mask of
  the pass); ``z_loss``: ST-MoE's router z-loss, mean over the tokens of all layers of
  ``logsumexp(logits)^2``. A model with several stacks (an encoder-decoder) adds each stack's, as
  HF's Switch Transformers does, and so do layers of one stack whose expert counts or coefficients
  differ. The loop adds ``total`` with each micro-batch's weight ``1 / micro-batches of the step``
  (over all processes), so a step's router gradient is their mean on any number of processes and
  with any gradient accumulation; the logged train ``loss`` stays the task's loss alone.
* ``router.bias_update`` (DeepSeek-V3): after each optimizer step, every such layer's
  ``expert_bias += bias_update * sign(mean load - load_e)``, the loads being the step's (token,
  expert) pairs per expert summed over its micro-batches and all processes (one all-reduce), so
  every process keeps the same bias; it is a buffer, saved in checkpoints and exports.
* the train log row gains ``aux_loss`` and ``z_loss`` (the unweighted values, mean over the window's
  micro-batches), and with a ``capacity_factor`` ``dropped_tokens`` ((token, expert) pairs over
  capacity per optimizer step, all layers and processes) and ``dropped_fraction`` (of the pairs of
  those layers); a row of split ``experts`` gives each MoE layer's share of the window's pairs per
  expert (padding left out); :func:`plot_expert_load` draws those rows (``experts.png``).

Shapes: N tokens of a pass, E experts, k top_k.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from zoo.components.moe import MoE, load_balancing_loss, router_z_loss
from zoo.components.stack import Stack
from zoo.train.distributed import Dist
from zoo.train.fsdp import stacks
from zoo.train.metrics import read_metrics

__all__ = ["MoELayer", "moe_layers", "RouterLosses", "router_losses", "RouterTraining", "plot_expert_load"]

LOAD_SPLIT = "experts"  #: the metrics log's split of the per-expert load rows


@dataclass(frozen=True)
class MoELayer:
    """An MoE module of a model: its qualified name, and the stack it sits in (whose padding mask its
    losses leave out; None outside any stack)."""

    name: str
    moe: MoE
    stack: Stack | None


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """The model's MoE modules in the order of its modules (empty for a dense model)."""
    in_stack = {id(m): stack for stack in stacks(model) for m in stack.modules() if isinstance(m, MoE)}
    return [MoELayer(name, m, in_stack.get(id(m))) for name, m in model.named_modules() if isinstance(m, MoE)]


@dataclass(frozen=True)
class RouterLosses:
    """The router losses of a forward pass: ``aux_loss`` and ``z_loss`` unweighted (detached, for
    the log), ``total`` the weighted sum training adds to the task's loss."""

    aux_loss: Tensor
    z_loss: Tensor
    total: Tensor


def _padding(layer: MoELayer, rows: int) -> Tensor | None:
    mask = layer.stack.padding_mask if layer.stack is not None else None
    if mask is not None and mask.numel() != rows:
        raise ValueError(f"{layer.name}: routed {rows} tokens, but its stack's padding mask has {mask.numel()}")
    return mask


def router_losses(model: nn.Module | Sequence[MoELayer]) -> RouterLosses:
    """The router losses of the last forward pass of ``model``'s MoE layers (or of ``layers``); see
    the module docstring. A term whose coefficient is 0 is computed for the log but adds no gradient."""
    layers = moe_layers(model) if isinstance(model, nn.Module) else list(model)
    groups: dict[tuple, list[Tensor]] = {}
    masks: dict[tuple, Tensor | None] = {}
    for layer in layers:
        m, logits = layer.moe, layer.moe.router_logits
        if logits is None:  # not run yet
            continue
        key = (id(layer.stack), m.n_experts, m.top_k, m.aux_loss_coef, m.z_loss_coef)
        groups.setdefault(key, []).append(logits)
        masks[key] = _padding(layer, logits.shape[0])
    zero = torch.zeros(())
    aux, z, total = zero, zero, zero
    for key, logits in groups.items():
        _, n_experts, top_k, aux_coef, z_coef = key
        lb = load_balancing_loss(tuple(t if aux_coef else t.detach() for t in logits), top_k, n_experts, masks[key])
        zl = router_z_loss(tuple(t if z_coef else t.detach() for t in logits), masks[key])
        aux, z = aux + lb.detach(), z + zl.detach()
        total = total + aux_coef * lb + z_coef * zl
    return RouterLosses(aux_loss=aux, z_loss=z, total=total)


def _routed_counts(layer: MoELayer) -> Tensor:
    """(E,) float64 on the CPU: the (token, expert) pairs of the last pass per expert, padding left out."""
    routed = layer.moe.routed
    mask = _padding(layer, routed.shape[0])
    weights = None if mask is None else mask.reshape(-1, 1).expand(routed.shape).reshape(-1).double()
    return torch.bincount(routed.reshape(-1), weights=weights, minlength=layer.moe.n_experts).to("cpu", torch.float64)


class RouterTraining:
    """What :func:`~zoo.train.loop.fit` does for a model with MoE layers (see the module docstring):
    ``micro_batch()`` after each micro-batch's forward pass (the router losses to add), ``after_step(dist)``
    after each optimizer step (the bias update), ``log_values(dist)`` when the loop writes a train row,
    and ``state_dict()``/``load_state_dict()`` for the log window across a resume."""

    SUMS = ("aux_loss", "z_loss", "micro_batches", "dropped", "capped_pairs")  # summed over processes

    def __init__(self, layers: list[MoELayer]) -> None:
        self.layers = layers
        self.sizes = [layer.moe.n_experts for layer in layers]
        self.capped = any(layer.moe.capacity_factor is not None for layer in layers)
        self.balanced = any(layer.moe.expert_bias is not None for layer in layers)
        # per expert of every layer, on the CPU: this process's pairs of this step, and of this log window
        self.step_counts = torch.zeros(sum(self.sizes), dtype=torch.float64)
        self.window_counts = torch.zeros_like(self.step_counts)
        self.sums = dict.fromkeys(self.SUMS, 0.0)
        self.steps = 0  # optimizer steps in this log window (the same on every process)

    @classmethod
    def of(cls, model: nn.Module) -> RouterTraining | None:
        """The helper for ``model``; None when it has no MoE layer."""
        layers = moe_layers(model)
        return cls(layers) if layers else None

    def micro_batch(self) -> Tensor:
        """The weighted router losses of the pass just run (to add to the task's loss before its
        backward pass); counts each expert's pairs and the dropped ones."""
        losses = router_losses(self.layers)
        ran = [layer for layer in self.layers if layer.moe.routed is not None]
        self.step_counts += torch.cat([_routed_counts(layer) if layer.moe.routed is not None
                                       else torch.zeros(layer.moe.n_experts, dtype=torch.float64) for layer in self.layers])
        for layer in ran:
            if layer.moe.dropped is not None:
                self.sums["dropped"] += float(layer.moe.dropped)
                self.sums["capped_pairs"] += layer.moe.routed.numel()
        self.sums["aux_loss"] += float(losses.aux_loss)
        self.sums["z_loss"] += float(losses.z_loss)
        self.sums["micro_batches"] += 1
        return losses.total

    @torch.no_grad()
    def after_step(self, dist: Dist) -> None:
        """Move the experts' biases by the step's loads over all processes (``router.bias_update``),
        and add the step's counts to the log window."""
        if self.balanced:
            loads = dist.all_reduce(self.step_counts.clone())
            for layer, load in zip(self.layers, loads.split(self.sizes)):
                bias = layer.moe.expert_bias
                if bias is not None:  # overloaded experts go down, underloaded ones up (DeepSeek-V3)
                    bias += layer.moe.bias_update * torch.sign(load.mean() - load).to(bias)
        self.window_counts += self.step_counts
        self.step_counts.zero_()
        self.steps += 1

    def log_values(self, dist: Dist) -> tuple[dict[str, float], dict[str, list[float]]]:
        """(the train row's values, the ``experts`` row: each layer's share of pairs per expert) of the
        log window over all processes; starts a new window. Collective."""
        head = torch.tensor([self.sums[k] for k in self.SUMS], dtype=torch.float64)
        packed = dist.all_reduce(torch.cat([head, self.window_counts])).tolist()
        sums, counts = dict(zip(self.SUMS, packed)), torch.tensor(packed[len(self.SUMS):], dtype=torch.float64)
        n = max(sums["micro_batches"], 1.0)
        values = {"aux_loss": sums["aux_loss"] / n, "z_loss": sums["z_loss"] / n}
        if self.capped:
            values["dropped_tokens"] = sums["dropped"] / max(self.steps, 1)
            values["dropped_fraction"] = sums["dropped"] / max(sums["capped_pairs"], 1.0)
        loads = {layer.name: (c / c.sum().clamp(min=1.0)).tolist() for layer, c in zip(self.layers, counts.split(self.sizes))}
        self.window_counts.zero_()
        self.sums, self.steps = dict.fromkeys(self.SUMS, 0.0), 0
        return values, loads

    def state_dict(self) -> dict[str, Any]:
        return {"sums": dict(self.sums), "steps": self.steps, "counts": self.window_counts.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.sums = {k: float(state["sums"].get(k, 0.0)) for k in self.SUMS}
            self.steps = int(state.get("steps", 0))
            self.window_counts = torch.tensor(state["counts"], dtype=torch.float64)


def plot_expert_load(path: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """A PNG of the ``experts`` rows of the metrics log at ``path``: one panel per MoE layer, x the
    step (each row's log window), y the expert, the colour its share of the layer's pairs over an even share (1: balanced;
    0: unused; 2: twice its share). None when the log has no such row."""
    records = [r for r in read_metrics(path) if r.get("split") == LOAD_SPLIT]
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.ticker import MaxNLocator

    names = [k for k in records[0] if k not in ("step", "split")]
    edges = [0] + [r["step"] for r in records]  # a row covers the steps since the one before
    cols = min(len(names), 4)
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        share = torch.tensor([r[name] for r in records], dtype=torch.float64).T  # (E, log rows)
        relative = (share * share.shape[0]).numpy()
        norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=max(2.0, float(relative.max())))
        rows_at = [e - 0.5 for e in range(share.shape[0] + 1)]  # expert e's row centred on e
        image = ax.pcolormesh(edges, rows_at, relative, cmap="RdBu_r", norm=norm)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("expert")
        fig.colorbar(image, ax=ax, label="load / even share")
    fig.suptitle("tokens per expert (share of each layer's routed pairs, over an even share)")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
