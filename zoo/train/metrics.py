"""A metrics log (JSON lines) people can read, plot and resume, and a progress bar.

    log = MetricsLog(out_dir / "metrics.jsonl", enabled=dist.is_main, resume_step=start_step)
    log.write(step=100, split="train", loss=3.2, lr=4e-4, tokens_per_s=2100)
    plot_metrics(out_dir / "metrics.jsonl", out_dir / "curves.png", panels=[("loss", ["train/loss", "valid/loss"])])

Each line is one JSON object with ``step``, ``split`` and the values. Resuming at step S drops the
lines written after S by the interrupted run, so the log of a resumed run reads like an
uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from zoo.atomic import atomic_write_text

__all__ = ["MetricsLog", "read_metrics", "series_styles", "metrics_figure", "plot_metrics", "Progress", "perplexity"]


class MetricsLog:
    """Append-only JSONL metrics; a no-op where ``enabled`` is False (ranks other than 0)."""

    def __init__(self, path: str | os.PathLike, *, enabled: bool = True, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():  # keep what the interrupted run logged up to the checkpoint
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, *, step: int, split: str = "train", **values: Any) -> dict[str, Any]:
        record = {"step": int(step), "split": split, **{k: _plain(v) for k, v in values.items()}}
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        return record


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def perplexity(nll: float) -> float:
    """exp(nll), capped so a diverged run logs a number, not inf."""
    return math.exp(min(nll, 50.0))


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics log (a torn last line from a crash is ignored)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


LINE_STYLES = ("-", "--", ":", "-.")


def series_styles(panels: Sequence[tuple[str, Sequence[str]]]) -> dict[tuple[int, str], tuple[str, str]]:
    """The (colour, line style) of each ``(panel index, "split/metric")`` series of a figure.

    A split (``train``, ``valid``, ``valid_<domain>``) has one colour in every panel, in the order the
    splits first appear; several metrics of one split in a panel (``valid/top1`` and ``valid/top5``)
    share its colour and differ by line style."""
    from matplotlib import rcParams

    cycle = rcParams["axes.prop_cycle"].by_key()["color"]
    colours: dict[str, str] = {}
    styles = {}
    for i, (_, series) in enumerate(panels):
        seen: dict[str, int] = {}
        for key in series:
            split = key.split("/", 1)[0]
            colour = colours.setdefault(split, cycle[len(colours) % len(cycle)])
            styles[(i, key)] = (colour, LINE_STYLES[seen.get(split, 0) % len(LINE_STYLES)])
            seen[split] = seen.get(split, 0) + 1
    return styles


def metrics_figure(records: Sequence[dict[str, Any]], panels: Sequence[tuple[str, Sequence[str]]], *,
                   title: str | None = None, log_y: Iterable[str] = ()):
    """A matplotlib figure with one panel per ``(title, ["split/metric", ...])`` of ``records``, x = step,
    styled by :func:`series_styles`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log_y = set(log_y)
    styles = series_styles(panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for i, (ax, (name, series)) in enumerate(zip(axes[0], panels)):
        for key in series:
            split, metric = key.split("/", 1)
            pts = [(r["step"], r[metric]) for r in records
                   if r.get("split") == split and isinstance(r.get(metric), (int, float))]
            if pts:
                xs, ys = zip(*pts)
                colour, style = styles[(i, key)]
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, ms=3, label=key, color=colour, linestyle=style)
        ax.set_title(name)
        ax.set_xlabel("step")
        if name in log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_metrics(
    path: str | os.PathLike,
    out: str | os.PathLike,
    panels: Sequence[tuple[str, Sequence[str]]],
    *,
    title: str | None = None,
    log_y: Iterable[str] = (),
) -> Path:
    """A PNG of :func:`metrics_figure` over the metrics log at ``path``.

    Example: ``[("loss", ["train/loss", "valid/loss"]), ("BLEU", ["valid/bleu"])]``.
    """
    import matplotlib.pyplot as plt

    fig = metrics_figure(read_metrics(path), panels, title=title, log_y=log_y)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


class Progress:
    """A tqdm bar on the main process when stderr is a terminal; otherwise a log line every
    ``every`` updates (CI logs and files stay readable). ``update(n, **postfix)``."""

    def __init__(self, total: int, *, initial: int = 0, desc: str = "train", enabled: bool = True,
                 every: int = 50, force_bar: bool | None = None) -> None:
        self.total, self.n, self.desc, self.enabled, self.every = total, initial, desc, enabled, every
        self.start = time.perf_counter()
        use_bar = sys.stderr.isatty() if force_bar is None else force_bar
        self.bar = None
        if enabled and use_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=True)

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        if not self.enabled:
            return
        text = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()}
        if self.bar is not None:
            self.bar.update(n)
            if text:
                self.bar.set_postfix(text, refresh=False)
        elif self.n % self.every == 0 or self.n == self.total:
            elapsed = time.perf_counter() - self.start
            fields = " ".join(f"{k} {v}" for k, v in text.items())
            print(f"{self.desc} {self.n}/{self.total} {fields} [{elapsed:.0f}s]", file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
