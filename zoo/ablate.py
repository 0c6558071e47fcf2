"""Ablation grids: one base recipe config, named rows of overrides, one table and one plot.

An ablation file (YAML)::

    recipe: recipes/translate.py          # a recipe script taking key=value overrides (relative to the file or cwd)
    model_overrides: model_overrides      # model.* entries go to the recipe's model_overrides list
    base: [train.steps=3000]              # overrides every row gets (the shared budget)
    rows:
      base: []
      A-h1: [model.block.attention.n_heads=1]
      E-learned: [model.position.kind=learned]
    metrics: [params, valid/last.ppl, valid/last.bleu]   # keys of the run's results.json (dots reach inside)
    reference: base                       # the row drawn as a reference line

Each row runs the recipe as ``python RECIPE BASE... ROW... run.out_dir=OUT/<row>-<hash>`` with the
same seed, data and budget. The hash covers the recipe and the row's resolved overrides, so a run
whose ``results.json`` exists is not run again: an interrupted grid resumes with the unfinished
rows, and editing one row reruns that row only. Rows run one after another, or ``jobs`` at once.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from zoo.atomic import atomic_write_text
from zoo.spec import SpecError, read_yaml

__all__ = ["AblationError", "AblationFile", "load_ablation", "row_dir", "run_grid", "write_table", "plot_grid"]

RESULTS = "results.json"


class AblationError(ValueError):
    """An ablation file or run that cannot be used; the message names the row or field."""


class AblationFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(description="the recipe script each row runs")
    base: list[str] = Field(default_factory=list, description="overrides every row gets")
    rows: dict[str, list[str]] = Field(description="row name -> its overrides")
    metrics: list[str] = Field(["params"], min_length=1, description="keys of each run's results.json shown in the "
                               "table and plot; a dotted path reaches into nested results (valid/last.bleu)")
    reference: str | None = Field(None, description="the row drawn as a reference line (default: the first)")
    model_overrides: str | None = Field(
        None, description="the recipe's list field for model-spec overrides: `model.a.b=c` entries of base and rows "
        "are gathered into one `<this>=[a.b=c, ...]` override (e.g. model_overrides for recipes/translate.py)")

    @field_validator("rows")
    @classmethod
    def _rows(cls, rows: dict[str, list[str]]) -> dict[str, list[str]]:
        if not rows:
            raise ValueError("no rows; add at least one, e.g. base: []")
        for name, overrides in rows.items():
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ValueError(f"row {name!r}: overrides look like key.path=value, got {bad[0]!r}")
            if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"row {name!r}: use letters, digits, '-', '_' or '.' in row names")
        return rows


def load_ablation(path: str | os.PathLike) -> tuple[AblationFile, Path]:
    """The ablation file and the recipe's resolved path."""
    path = Path(path)
    try:
        data = read_yaml(path.read_text(encoding="utf-8"), f"ablation file {path}")
    except OSError as e:
        raise AblationError(f"cannot read ablation file {str(path)!r}: {e.strerror or e}") from None
    except SpecError as e:
        raise AblationError(str(e)) from None
    try:
        grid = AblationFile.model_validate(data or {})
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise AblationError(f"{path}: {loc + ': ' if loc else ''}{first['msg'].removeprefix('Value error, ')}") from None
    if grid.reference is not None and grid.reference not in grid.rows:
        raise AblationError(f"{path}: reference {grid.reference!r} is not a row ({', '.join(grid.rows)})")
    for candidate in (path.parent / grid.recipe, Path(grid.recipe)):
        if candidate.is_file():
            return grid, candidate.resolve()
    raise AblationError(f"{path}: recipe {grid.recipe!r} not found (relative to the file or the current folder)")


def row_overrides(grid: AblationFile, row: str) -> list[str]:
    """What the recipe's command line gets for ``row``: base, then the row (later wins)."""
    given = list(grid.base) + list(grid.rows[row])
    if grid.model_overrides is None:
        return given
    model = [o.removeprefix("model.") for o in given if o.startswith("model.")]
    rest = [o for o in given if not o.startswith("model.")]
    return rest + ([f"{grid.model_overrides}={json.dumps(model)}"] if model else [])


def row_dir(out: Path, grid: AblationFile, recipe: Path, row: str) -> Path:
    key = json.dumps({"recipe": recipe.name, "overrides": row_overrides(grid, row)}, sort_keys=True)
    return out / f"{row}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _results(path: Path) -> dict[str, Any]:
    """A run's results.json; one that cannot be read (cut short, edited) is named, with the way to run
    its row again, rather than taken for a finished row or failing inside the JSON parser."""
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        results = e
    if not isinstance(results, dict):
        why = f"not JSON: {results}" if isinstance(results, Exception) else "not a JSON object"
        raise AblationError(f"{path}: unreadable results ({why}); delete it to run the row again")
    return results


def _run_row(recipe: Path, overrides: list[str], where: Path) -> dict[str, Any]:
    where.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(recipe), *overrides, f"run.out_dir={where}"]
    start = time.perf_counter()
    with open(where / "ablation.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (where / "ablation.log").read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise AblationError(f"{where.name}: the recipe exited with status {proc.returncode}: {tail[0]} (log: {where / 'ablation.log'})")
    results_path = where / RESULTS
    if not results_path.is_file():
        raise AblationError(f"{where.name}: the recipe wrote no {RESULTS} in {where}")
    results = _results(results_path)
    if "wall_seconds" not in results:  # kept with the row, so a cached row's table cell keeps its time
        results["wall_seconds"] = round(wall, 1)
        atomic_write_text(results_path, json.dumps(results, indent=2) + "\n")  # a row is done once it reads whole
    return results


def run_grid(path: str | os.PathLike, out: str | os.PathLike, *, jobs: int = 1, only: list[str] | None = None,
             echo=print) -> list[dict[str, Any]]:
    """Run every unfinished row; returns one record per row (name, overrides, results, cached)."""
    grid, recipe = load_ablation(path)
    out = Path(out)
    names = list(grid.rows) if not only else only
    unknown = [n for n in names if n not in grid.rows]
    if unknown:
        raise AblationError(f"unknown row {unknown[0]!r}; rows: {', '.join(grid.rows)}")
    records: dict[str, dict[str, Any]] = {}
    todo = []
    for name in names:
        where = row_dir(out, grid, recipe, name)
        if (where / RESULTS).is_file():
            records[name] = {"row": name, "overrides": grid.rows[name], "dir": str(where), "cached": True,
                             "results": _results(where / RESULTS)}
            echo(f"{name}: done before ({where.name})")
        else:
            todo.append((name, where))

    def work(item):
        name, where = item
        echo(f"{name}: running {' '.join(grid.rows[name]) or '(base)'}")
        results = _run_row(recipe, row_overrides(grid, name), where)
        echo(f"{name}: " + ", ".join(f"{m} {metric(results, m)}" for m in grid.metrics))
        return name, where, results

    failures = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for fut in [pool.submit(work, item) for item in todo]:
            try:
                name, where, results = fut.result()
                records[name] = {"row": name, "overrides": grid.rows[name], "dir": str(where), "cached": False,
                                 "results": results}
            except AblationError as e:
                failures.append(str(e))
    if failures:
        raise AblationError(f"{len(failures)} row(s) failed; first: {failures[0]}")
    done = [records[n] for n in names]
    missing = [m for m in grid.metrics if all(metric(r["results"], m) is None for r in done)]
    if missing:
        keys = sorted({k for r in done for k in _keys(r["results"])})
        raise AblationError(f"metrics: {missing[0]!r} is in no row's results.json; its keys: {', '.join(keys)}")
    return done


def _keys(results: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key path of ``results`` that :func:`metric` reads (nested dicts joined with dots)."""
    out = []
    for k, v in results.items():
        out += _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def metric(results: dict[str, Any], key: str) -> Any:
    """``results[key]``, or a dotted path into nested results (``valid/averaged.bleu``)."""
    if key in results:
        return results[key]
    node: Any = results
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "–" if v is None else str(v)


def write_table(records: list[dict[str, Any]], metrics: list[str], out: Path) -> tuple[Path, Path]:
    """``out``.md (the paper's layout: row, changed fields, params, metrics, wall) and ``out``.csv."""
    cols = ["row", "changed", "params", *[m for m in metrics if m not in ("params", "wall_seconds")], "wall_seconds"]
    rows = []
    for r in records:
        res = r["results"]
        rows.append({"row": r["row"], "changed": " ".join(r["overrides"]) or "(base)", "params": res.get("params"),
                     **{m: metric(res, m) for m in metrics}, "wall_seconds": res.get("wall_seconds")})
    md = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    md += ["| " + " | ".join(_cell(row[c]) if c != "changed" else f"`{row[c]}`" for c in cols) + " |" for row in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    md_path, csv_path = out.with_suffix(".md"), out.with_suffix(".csv")
    md_path.write_text("\n".join(md) + "\n")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return md_path, csv_path


def plot_grid(records: list[dict[str, Any]], metrics: list[str], out: Path, reference: str | None = None) -> Path:
    """One horizontal bar panel per metric, values written on the bars, the reference row as a dashed line; a
    panel whose values span more than 3x is drawn on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    reference = reference or records[0]["row"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 0.35 * len(records) + 1.5), squeeze=False)
    names = [r["row"] for r in records]
    for ax, m in zip(axes[0], metrics):
        vals = [metric(r["results"], m) for r in records]
        nums = [v if isinstance(v, (int, float)) else float("nan") for v in vals]
        bars = ax.barh(range(len(names)), nums, color=["tab:orange" if n == reference else "tab:blue" for n in names])
        ax.bar_label(bars, [_cell(v) for v in vals], fontsize=7, padding=2)
        finite = [v for v in nums if v == v]
        if finite and min(finite) > 0 and max(finite) > 3 * min(finite):  # one outlier must not flatten the rest
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(x=0.15)
        ref = next((v for n, v in zip(names, nums) if n == reference), None)
        if ref is not None:
            ax.axvline(ref, color="k", ls="--", lw=1)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(m)
    fig.tight_layout()
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
