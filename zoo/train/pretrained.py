"""Start a recipe from pretrained weights: ``init=PATH`` in every recipe.

    start = pretrained(cfg.init, families=("decoder",), overrides=cfg.model_overrides,
                       recipe="lm.py", work_dir=out / "init", dist=dist, seed=cfg.run.seed)
    model = start.model                 # the file's spec, with the overrides that keep weights meaningful
    dist.print(start.describe())        # what was loaded, what is new (a fresh head), what was dropped

``PATH`` is a zoo file, or an HF or timm model directory, converted on the fly by ``zoo convert``'s
code into ``work_dir`` (once: a resumed run finds it there) with the model's tokenizer files beside it.
The spec comes from the weights. ``model_overrides`` may change only what keeps the weights
meaningful: dropout rates, attention windows, ``max_seq_len``, the head (``head.*``, an encoder's
``classifier.*`` and ``pooler``), a ViT's ``image_size`` (its learned position table resampled to
the new grid, as timm does; sin-cos and 2-D rotary positions hold no table) and its ``in_channels``
(the first convolution's weight adapted as timm's ``adapt_input_conv`` does: summed over the file's
channels for one, repeated and rescaled for more); any other key is refused by name before anything
is built. Tensors of the new model are taken from the file by name where the shapes agree (or fitted,
as above); a head whose shape changed starts fresh and is reported as new; the file's tensors the new model has no place for (an MLM head
under a classifier) are reported as dropped. Nothing is dropped silently: :meth:`Start.report` goes
into ``results.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from zoo.train.errors import TrainError

__all__ = ["Start", "Weights", "locate", "pretrained", "ALLOWED_OVERRIDES", "check_overrides", "adapt_input_conv"]

# first segments of spec keys an init= run may override: they keep the pretrained weights meaningful
ALLOWED_OVERRIDES = ("dropout", "head", "classifier", "pooler", "max_seq_len", "image_size", "in_channels")
# module prefixes that may start fresh when their shape changes (the task's head)
FRESH_PREFIXES = ("head.", "classifier.", "pooler.")
SOURCE_NOTE = "source.json"  # in work_dir: which init= the converted file came from


@dataclass(frozen=True)
class Weights:
    """Where an ``init=`` run's weights are (:func:`locate`), before any model is built."""

    init: Path  # what init= named
    path: Path  # the zoo file (the converted one for an HF/timm directory)
    source: str  # init=, in words
    spec: Any  # the file's model spec


def locate(init: str | Path, *, work_dir: str | Path, dist, families: Sequence[str] = (), recipe: str = "") -> Weights:
    """The zoo file ``init`` names, and its spec: an HF/timm directory is converted into ``work_dir``
    here (once); a model of none of ``families`` (where given) is refused. For a recipe that needs
    the spec before it can say its overrides (the image size an image folder is read at); pass the
    result to :func:`pretrained` in place of the path."""
    from zoo.io import read_spec

    path, source = _resolve(Path(init), Path(work_dir), dist)
    base = read_spec(path)
    if families and base.family not in families:
        raise TrainError(f"init={init} holds a {base.family} ({base.name or 'unnamed'}); {recipe} trains "
                         f"{' or '.join(f'a {f}' for f in families)} — pass such a model")
    return Weights(Path(init), path, source, base)


@dataclass
class Start:
    """A model built from pretrained weights, and what happened to each tensor."""

    model: nn.Module
    path: Path  # the zoo file the weights came from (the converted one for an HF/timm directory)
    source: str  # what init= named, in words
    loaded: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)  # the model's tensors the file did not give (a fresh head)
    dropped: list[str] = field(default_factory=list)  # the file's tensors the model has no place for
    resized: list[str] = field(default_factory=list)  # loaded after fitting (a ViT's positions, first convolution)

    @property
    def spec(self):
        return self.model.spec

    @property
    def folder(self) -> Path:
        """Where the weights' sidecar files lie (tokenizer.json, tokenizer_config.json, ...)."""
        return self.path.parent

    def report(self) -> dict[str, Any]:
        """For results.json: the source and the names of new, dropped and resized tensors."""
        return {"init": self.source, "weights": str(self.path), "loaded": len(self.loaded), "new": self.new,
                "dropped": self.dropped, "resized": self.resized}

    def describe(self) -> str:
        """One line for the run's log."""

        def names(items: list[str]) -> str:
            shown = ", ".join(items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else "")
            return f"{len(items)} ({shown})" if items else "0"

        return (f"init: {self.source}: loaded {len(self.loaded)} tensors, new {names(self.new)}, "
                f"dropped {names(self.dropped)}" + (f", resized {names(self.resized)}" if self.resized else ""))


def check_overrides(overrides: Sequence[str], *, setting: str = "model_overrides") -> None:
    """Refuse, by name, an override that would change what pretrained weights mean."""
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        top = key.split(".", 1)[0]
        last = key.rsplit(".", 1)[-1]
        if top in ALLOWED_OVERRIDES or "dropout" in last or last in ("window", "windows"):
            continue
        raise TrainError(f"{setting}: {text!r} would change the architecture the init= weights were trained for; "
                         f"with init= only dropout rates, attention windows, max_seq_len, the head "
                         f"(head.*, classifier.*, pooler) and a ViT's image_size and in_channels may change — drop "
                         f"the override, or train from scratch without init=")


def _zoo_file(path: Path) -> bool:
    from zoo.io import read_spec

    try:
        read_spec(path)
    except (ValueError, OSError):
        return False
    return True


def _convert(src: Path, work_dir: Path, dist) -> tuple[Path, str]:
    """``src`` (an HF or timm directory) as a zoo file in ``work_dir``, converted once (rank 0)."""
    from zoo.interop.files import ConversionError, convert

    target, note = work_dir / "model.safetensors", work_dir / SOURCE_NOTE
    stamp = {"source": str(src.resolve())}
    done = note.is_file() and json.loads(note.read_text(encoding="utf-8")) == stamp and _zoo_file(target)
    reference = ""
    if not done and dist.is_main:
        if work_dir.exists():
            for old in work_dir.iterdir():  # another source's conversion: replaced whole
                if old.is_file():
                    old.unlink()
        work_dir.mkdir(parents=True, exist_ok=True)
        try:
            converted = convert(src, target)
        except ConversionError as e:
            raise TrainError(f"init={src}: {e}") from None
        reference = converted.reference
        note.write_text(json.dumps(stamp) + "\n", encoding="utf-8")
    dist.barrier()
    found = sorted(work_dir.glob("model*.safetensors*"))
    path = target if target.is_file() else next((p for p in found if p.name.endswith(".index.json")), target)
    return path, f"{src} ({reference or 'converted earlier'} -> {path})"


def _resolve(init: Path, work_dir: Path, dist) -> tuple[Path, str]:
    if not init.exists():
        raise TrainError(f"init={init}: no such file or directory; give a zoo file (model.safetensors) or an HF/timm "
                         f"model directory")
    if init.is_file():
        if not _zoo_file(init):
            raise TrainError(f"init={init}: not a zoo file (no zoo spec in its safetensors header); convert a "
                             f"checkpoint with `zoo convert`, or pass its HF/timm directory")
        return init, str(init)
    if init.is_dir() and (init / "config.json").is_file():
        return _convert(init, work_dir, dist)
    zoo_files = sorted(init.glob("*.safetensors"))
    if len(zoo_files) == 1 and _zoo_file(zoo_files[0]):
        return zoo_files[0], str(zoo_files[0])
    raise TrainError(f"init={init}: a directory without config.json; give the zoo file itself, or an HF/timm model "
                     f"directory")


def _fit_positions(stored: torch.Tensor, base, spec) -> torch.Tensor | None:
    """A ViT's learned position table fitted to the new image size, or None where that does not apply."""
    from zoo.components.position import resample_grid_table

    if getattr(base, "family", None) != "vit" or base.grid == spec.grid:
        return None
    return resample_grid_table(stored, base.grid, spec.grid, prefix=stored.shape[0] - base.grid[0] * base.grid[1])


def adapt_input_conv(weight: torch.Tensor, in_channels: int) -> torch.Tensor:
    """A first convolution's weight ``[out, c, kh, kw]`` for ``in_channels`` inputs, as timm adapts an
    RGB checkpoint: one channel sums the ``c`` (a gray image's response is the RGB one's for equal
    channels); more are the ``c`` repeated, cut to ``in_channels`` and scaled by ``c / in_channels``
    so the activations keep their size."""
    have = weight.shape[1]
    if in_channels == have:
        return weight
    w = weight.float()
    if in_channels == 1:
        w = w.sum(1, keepdim=True)
    else:
        w = w.repeat(1, -(-in_channels // have), 1, 1)[:, :in_channels] * (have / in_channels)
    return w.to(weight.dtype)


def _first_conv(state: dict[str, torch.Tensor], in_channels: int) -> str | None:
    """The name of the model's first convolution weight (the one that sees the image's channels)."""
    return next((n for n, t in state.items() if t.ndim == 4 and t.shape[1] == in_channels), None)


def pretrained(init: str | Path | Weights, *, families: Sequence[str], recipe: str, overrides: Sequence[str] = (),
               work_dir: str | Path, dist, seed: int = 0) -> Start:
    """The model ``init`` holds (see the module's docstring; or :func:`locate`'s result for it), built
    with ``overrides`` on its spec.

    ``families`` are those the recipe trains (refused otherwise, naming both), ``recipe`` names the
    recipe in messages, ``work_dir`` receives an HF/timm directory's conversion, ``dist`` is the run's
    :class:`zoo.train.Dist` (rank 0 converts, the others wait), ``seed`` seeds what starts fresh."""
    import zoo
    from zoo.io import read_lazily
    from zoo.spec import SpecError

    check_overrides(overrides)
    if not isinstance(init, Weights) or init.spec.family not in families:
        init = locate(init.init if isinstance(init, Weights) else init, work_dir=work_dir, dist=dist,
                      families=families, recipe=recipe)
    init, path, source, base = init.init, init.path, init.source, init.spec
    try:
        spec = zoo.load_spec(base, list(overrides))
    except SpecError as e:
        raise TrainError(f"model_overrides on init={init}: {e}") from None
    model = zoo.build(spec, seed=seed)
    _, stored = read_lazily(path)
    state = model.state_dict()
    start = Start(model, path, source)
    take: dict[str, torch.Tensor] = {}
    refused = []
    first_conv = _first_conv(state, spec.in_channels) if getattr(base, "in_channels", None) != getattr(
        spec, "in_channels", None) else None
    for name, want in state.items():
        if name not in stored:
            start.new.append(name)
            continue
        t = stored[name]
        if tuple(t.shape) != tuple(want.shape):
            fitted = _fit_positions(t, base, spec) if name.startswith("position.") else None
            if name == first_conv:
                fitted = adapt_input_conv(t, spec.in_channels)
            if fitted is not None and tuple(fitted.shape) == tuple(want.shape):
                t = fitted
                start.resized.append(name)
            elif name.startswith(FRESH_PREFIXES):
                start.new.append(name)
                continue
            else:
                refused.append(f"{name} is {list(t.shape)} in the file, {list(want.shape)} with the overrides")
                continue
        else:
            start.loaded.append(name)
        take[name] = t.to(want.dtype)
    if refused:
        raise TrainError(f"model_overrides {list(overrides)} change the shapes of pretrained tensors: "
                         f"{'; '.join(refused[:3])}; drop those overrides")
    start.dropped = sorted(set(stored) - set(state))
    start.loaded += [n for n in start.resized if n not in start.loaded]
    missing, unexpected = model.load_state_dict(take, strict=False)
    assert not unexpected, unexpected
    return start
