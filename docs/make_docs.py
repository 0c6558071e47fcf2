"""Rewrite the generated regions of README.md and docs/: numbers and tables that come from measured
results (bench/results/*.json) or from the code (the recipes' config classes, the converters'
registries), never typed by hand.

A region is marked in the markdown source, on its own lines or inline::

    <!-- generated: bench-summary bench/results/2026-11-25_1920_UTC.json -->
    ...
    <!-- /generated -->

    the grid has <!-- generated: ablation-rows recipes/ablations/table3.yaml -->26<!-- /generated --> rows

Run ``python docs/make_docs.py`` after a benchmark run or a change of a recipe's settings;
tests/test_docs.py fails while any region differs from what this renders.
"""

from __future__ import annotations

import importlib
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGION = re.compile(r"<!-- generated: (?P<name>[\w-]+)(?P<args>[^>]*?) -->(?P<body>.*?)<!-- /generated -->", re.S)
FILES = [ROOT / "README.md", ROOT / "bench" / "NOTES.md", *sorted((ROOT / "docs").rglob("*.md"))]
RECIPES = {"translate": "TranslateConfig", "imagenet": "RecipeConfig", "lm": "LMConfig", "mlm": "MLMConfig",
           "classify": "ClassifyConfig"}


# ---------------------------------------------------------------------------------- benchmarks
def _rows(path: str) -> list[dict]:
    return json.loads((ROOT / path).read_text(encoding="utf-8"))["rows"]


def _ratio(row: dict, peer: str) -> float:
    zoo = "zoo" if "zoo" in row["seconds"] else "zoo compiled"
    return row["seconds"][peer] / row["seconds"][zoo]


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def _kind(row: dict) -> str:
    name = row["workload"]
    if "torch.compile" in name:
        return "compile"
    return "train" if name.endswith(" train") else "infer" if name.endswith(" infer") else "decode"


def _groups(rows: list[dict]) -> dict[tuple[str, str, str], list[float]]:
    """(peer, kind, precision) -> ratios, in the order rows appear."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for row in rows:
        for peer in row["seconds"]:
            if not peer.startswith("zoo"):
                out.setdefault((peer, _kind(row), row["precision"]), []).append(_ratio(row, peer))
    return out


def bench_summary(path: str) -> str:
    """One line per peer: the span of zoo / peer over the run's rows, by kind and precision."""
    rows, groups = _rows(path), _groups(_rows(path))
    lines = []
    for peer in dict.fromkeys(p for p, _, _ in groups):
        parts = []
        for kind, word in [("train", "training"), ("infer", "inference")]:
            spans = [f"{_span(v)} {prec}" for (p, k, prec), v in groups.items() if p == peer and k == kind]
            if spans:
                parts.append(f"{word} {', '.join(spans)}")
        decode = [f"{r['workload']} {_ratio(r, peer):.2f}x" for r in rows if _kind(r) == "decode" and peer in r["seconds"]]
        parts += decode
        lines.append(f"- against {peer}: " + "; ".join(parts))
    compiled = [r for r in rows if _kind(r) == "compile"]
    lines += [f"- {r['workload']} ({r['precision']}): {_ratio(r, 'zoo eager'):.2f}x zoo eager" for r in compiled]
    return "\n".join(lines)


def bench_table(path: str) -> str:
    """A run's table as ``python -m bench`` writes it (machine, peaks, one line per row and peer):
    for runs that have a section of their own (``--only moe``)."""
    sys.path.insert(0, str(ROOT))  # bench/ is beside zoo, not installed (as recipe_settings reads recipes/)
    try:
        from bench.common import Row
        from bench.run import markdown
    finally:
        sys.path.remove(str(ROOT))

    data = json.loads((ROOT / path).read_text(encoding="utf-8"))
    return markdown([Row(**r) for r in data["rows"]], data["peaks"], data["machine"]).rstrip("\n")


def bench_line(path: str) -> str:
    """The README's one sentence: training, inference and decoding spans of a run."""
    groups, rows = _groups(_rows(path)), _rows(path)
    train = {prec: [x for (p, k, pr), v in groups.items() if k == "train" and pr == prec for x in v] for prec in ("fp32", "bf16")}
    infer = [x for (p, k, _), v in groups.items() if k == "infer" for x in v]
    decode = ", ".join(f"{r['workload'].replace('GPT-2 small ', 'GPT-2 ').replace('Transformer base ', '')} "
                       f"{_ratio(r, p):.2f}x" for r in rows if _kind(r) == "decode" for p in r["seconds"] if p != "zoo")
    return (f"training {_span(train['fp32'])} the peers in fp32 and {_span(train['bf16'])} in bf16, "
            f"inference {_span(infer)}, decoding {decode}")


def bench_compare(folder: str) -> str:
    """A table of zoo / peer before and after a change: run 1 of each side, and the mean of every run
    holding the row (``before-N.json``, ``after-N.json`` in ``folder``)."""
    runs = {side: [_rows(str(p.relative_to(ROOT))) for p in sorted((ROOT / folder).glob(f"{side}-*.json"))]
            for side in ("before", "after")}

    def ratios(side: str) -> dict[tuple[str, str, str], list[float]]:
        out: dict[tuple[str, str, str], list[float]] = {}
        for rows in runs[side]:
            for row in rows:
                for peer in row["seconds"]:
                    if not peer.startswith("zoo"):
                        out.setdefault((row["workload"], row["precision"], peer), []).append(_ratio(row, peer))
                if _kind(row) == "compile":
                    out.setdefault((row["workload"], row["precision"], "zoo eager"), []).append(_ratio(row, "zoo eager"))
        return out

    before, after = ratios("before"), ratios("after")
    lines = ["| workload | precision | peer | before | after | runs | mean before | mean after |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for key in after:
        if key not in before:
            continue
        b, a = before[key], after[key]
        n = min(len(a), len(b))
        means = (f"{statistics.mean(b):.2f}x | {statistics.mean(a):.2f}x" if n > 1 else "– | –")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {b[0]:.2f}x | {a[0]:.2f}x | {n} | {means} |")
    return "\n".join(lines)


def convert_memory(path: str) -> str:
    """The peak memory of ``zoo convert`` against checkpoint sizes (bench/convert_memory.py's run)."""
    data = json.loads((ROOT / path).read_text(encoding="utf-8"))

    def ratio(peak: int, size: int) -> str:  # none for the libraries-only checkpoint
        return f"{peak / size:.2f}x" if size >= 10**8 else "–"

    lines = ["| checkpoint (bf16, sharded) | on disk | HF -> zoo: peak | / size | zoo -> HF: peak | / size |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["rows"]:
        on_disk = f"{r['hf_bytes'] / 1e9:.2f} GB" if r["hf_bytes"] >= 10**8 else f"{r['hf_bytes'] / 1e6:.1f} MB"
        lines.append(f"| {r['label']} | {on_disk} | {r['hf_to_zoo_peak'] / 1e9:.2f} GB | "
                     f"{ratio(r['hf_to_zoo_peak'], r['hf_bytes'])} | {r['zoo_to_hf_peak'] / 1e9:.2f} GB | "
                     f"{ratio(r['zoo_to_hf_peak'], r['zoo_bytes'])} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- recipes
def recipe_settings(recipe: str) -> str:
    """A recipe's settings as its ``--help`` lists them: every key, its default (the recipe's YAML over
    the config class), and the field's description."""
    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        module = importlib.import_module(recipe)
    finally:
        sys.path.remove(str(ROOT / "recipes"))
    from zoo.train import load_config, settings

    cfg = load_config(getattr(module, RECIPES[recipe]), ROOT / "recipes" / f"{recipe}.yaml")
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, value, description in settings(cfg):
        cell = description.replace("|", "\\|")  # a bar inside a table cell is escaped, not replaced
        lines.append(f"| `{key}` | `{value}` | {cell} |")
    return "\n".join(lines)


def ablation_table(path: str) -> str:
    """A table a measurement wrote (``zoo ablate --table``, ``python -m bench.packing_eval``), as it is."""
    return (ROOT / path).read_text(encoding="utf-8").rstrip("\n")


def ablation_rows(path: str) -> str:
    import yaml

    return str(len(yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))["rows"]))


# ---------------------------------------------------------------------------------- converters
BACKBONES = ("each class above without its LM head: `head: none`, whose forward returns the hidden states after the "
             "final norm (HF's `last_hidden_state`)")  # the row of the backbones without a description of their own


def interop_classes(path: str) -> str:
    """The table of every class the converters' registries hold (:mod:`zoo.interop.catalog`): a row
    per class or group of classes named in ``path`` (a YAML mapping of class names, comma-separated
    where several share a row, to what each corresponds to, in the table's order), and one row of
    the backbones it leaves out. A class registered without a description, or described without
    being registered, fails here."""
    import yaml

    from zoo.interop.catalog import references

    described = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    refs = {r.name: r for r in references()}
    groups = {key: [name.strip() for name in key.split(",")] for key in described}
    unknown = [name for names in groups.values() for name in names if name not in refs]
    if unknown:
        raise ValueError(f"{path}: {', '.join(unknown)} is no registered class (zoo.interop.catalog); fix or remove it")
    named = {name for names in groups.values() for name in names}
    missing = [r.name for r in refs.values() if r.name not in named and r.backbone_of is None]
    if missing:
        raise ValueError(f"{path}: no row for {', '.join(missing)}; add what its spec corresponds to")
    rows = [(names, described[key]) for key, names in groups.items()]
    rest = [r.name for r in refs.values() if r.name not in named]  # backbones sharing one row
    if rest:
        last = max(i for i, (names, _) in enumerate(rows) if refs[names[0]].library == refs[rest[0]].library)
        rows.insert(last + 1, (rest, BACKBONES))
    lines = ["| reference class | zoo family | zoo spec it corresponds to |", "| --- | --- | --- |"]
    for names, text in rows:
        library = refs[names[0]].library.split()[0]
        families = dict.fromkeys(f for name in names for f in refs[name].families)
        lines.append(f"| {library} {', '.join(f'`{n}`' for n in names)} | {', '.join(f'`{f}`' for f in families)} | "
                     f"{' '.join(text.split())} |")
    return "\n".join(lines)


def interop_order(module: str) -> str:
    """One library's classes (``module``: zoo.interop.hf or zoo.interop.timm), in the order a spec
    tries them."""
    from zoo.interop.catalog import LIBRARIES

    archs = next(archs for mod, archs in LIBRARIES.values() if mod == module)
    return ", ".join(f"`{name}`" for name in archs)


# ---------------------------------------------------------------------------------- commands
def zoo_commands() -> str:
    """The ``zoo`` command's subcommands, as ``zoo --help`` lists them."""
    from zoo.cli import commands

    lines = ["| command | what it does |", "| --- | --- |"]
    lines += [f"| `{usage}` | {text} |" for usage, text in commands()]
    return "\n".join(lines)


def suite_times(path: str) -> str:
    """The test tiers' wall times as ``python -m bench.suite`` measured them, and on what."""
    data = json.loads((ROOT / path).read_text(encoding="utf-8"))
    m, tiers = data["machine"], data["tiers"]
    broken = [name for name, t in tiers.items() if t.get("returncode", 0) != 0]
    if broken:
        raise ValueError(f"{path}: the {', '.join(broken)} tier did not pass when it was timed; fix the suite and run "
                         "python -m bench.suite again")
    words = {"full": "the whole suite", "fast": "the fast lane"}
    parts = [f"{words[name]}, {t['passed']:,} tests in {t['seconds'] / 60:.1f} min" for name, t in
             sorted(tiers.items(), key=lambda kv: kv[0] != "full")]
    load = f", load {m['loadavg_1min']:.1f} at the start" if "loadavg_1min" in m else ""
    return (f"Measured with `python -m bench.suite` on a {m['cores']}-core {m['cpu']} ({m['cpu_generation']}{load}), "
            f"{data['date']}: {'; '.join(parts)}.")


GENERATORS: dict[str, Callable[..., str]] = {
    "bench-summary": bench_summary, "bench-line": bench_line, "bench-compare": bench_compare, "bench-table": bench_table,
    "recipe-settings": recipe_settings, "ablation-rows": ablation_rows, "ablation-table": ablation_table, "convert-memory": convert_memory,
    "interop-classes": interop_classes, "interop-order": interop_order, "zoo-commands": zoo_commands,
    "suite-times": suite_times,
}


def render(text: str) -> str:
    """``text`` with every generated region rendered afresh (block regions keep their own lines)."""
    def one(m: re.Match) -> str:
        body = GENERATORS[m["name"]](*m["args"].split())
        inline = "\n" not in m["body"]
        fresh = body if inline else f"\n{body}\n"
        return f"<!-- generated: {m['name']}{m['args']} -->{fresh}<!-- /generated -->"

    return REGION.sub(one, text)


def stale() -> list[str]:
    """The files whose generated regions differ from a fresh render."""
    return [str(f.relative_to(ROOT)) for f in FILES if render(t := f.read_text(encoding="utf-8")) != t]


if __name__ == "__main__":
    for file in FILES:
        text = file.read_text(encoding="utf-8")
        fresh = render(text)
        if fresh != text:
            file.write_text(fresh, encoding="utf-8")
            print(f"rewrote {file.relative_to(ROOT)}")
