"""The docs stay true: the spec reference matches the code, links resolve (the extension walk-through:
test_extending.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import zoo
from zoo.registry import REGISTRIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("make_spec_reference", DOCS / "make_spec_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.mark.parametrize("page", ["spec-reference.md", "spec-reference-components.md", "spec-reference-blocks.md"])
def test_spec_reference_is_current(page):
    committed = (DOCS / page).read_text(encoding="utf-8")
    fresh = {path.name: text for path, text in GEN.render_pages().items()}[page]
    if fresh != committed:
        old, new = committed.splitlines(), fresh.splitlines()
        line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        pytest.fail(
            f"docs/{page} is stale (first difference at line {line + 1}); "
            f"run `python docs/make_spec_reference.py` and commit the result"
        )


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {GEN.anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_links_between_docs_resolve():
    broken = []
    for doc in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        name = doc.relative_to(ROOT)
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an external address
            file, _, fragment = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "broken links in README.md and docs/:\n" + "\n".join(broken)



MAX_LINES = 500  # a page longer than this is split into pages that follow its sections


def test_no_page_is_over_the_length_limit():
    long = {str(doc.relative_to(ROOT)): n for doc in sorted(DOCS.rglob("*.md"))
            if (n := len(doc.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"pages over {MAX_LINES} lines (split them by section, keeping their anchors): {long}"


def test_guide_lists_every_builtin_kind():
    text = (DOCS / "guide.md").read_text(encoding="utf-8")
    for part in REGISTRIES:
        row = re.search(rf"^\| `{part}` \| (.+) \|$", text, flags=re.M)
        assert row, f"docs/guide.md: no row for the {part} registry in the registries table"
        listed = set(re.findall(r"`([^`]+)`", row.group(1)))
        builtin = {kind for kinds, _ in GEN.builtin_kinds(part) for kind in kinds}
        assert listed == builtin, f"docs/guide.md lists {part} kinds {sorted(listed)}, the registry has {sorted(builtin)}"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _load("make_docs")


def test_generated_regions_are_current():
    """Numbers from bench/results and the recipes' settings tables match what they are made from."""
    stale = MAKE.stale()
    assert not stale, f"generated regions are stale in {stale}; run `python docs/make_docs.py` and commit the result"
    regions = [m["name"] for f in MAKE.FILES for m in MAKE.REGION.finditer(f.read_text(encoding="utf-8"))]
    assert {"bench-summary", "bench-line", "bench-compare", "recipe-settings", "ablation-rows"} <= set(regions)


def test_a_region_renders_from_its_source(tmp_path):
    # an independent count: the rows of a grid file, and a bench line read off a two-row result
    (tmp_path / "g.yaml").write_text("rows:\n  a: []\n  b: [x=1]\n  c: [x=2]\n")
    text = f"has <!-- generated: ablation-rows {tmp_path / 'g.yaml'} -->99<!-- /generated --> rows"
    assert MAKE.render(text) == f"has <!-- generated: ablation-rows {tmp_path / 'g.yaml'} -->3<!-- /generated --> rows"
    rows = [{"workload": "m train", "precision": "fp32", "seconds": {"zoo": 1.0, "HF": 1.5}},
            {"workload": "m infer", "precision": "bf16", "seconds": {"zoo": 2.0, "HF": 1.0}}]
    (tmp_path / "r.json").write_text(__import__("json").dumps({"rows": rows}))
    assert MAKE.bench_summary(str(tmp_path / "r.json")) == "- against HF: training 1.50x fp32; inference 0.50x bf16"


def test_every_recipe_setting_is_described():
    """--help and the settings tables say what each key does."""
    import sys

    from zoo.train import load_config, settings

    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        for recipe, cls in MAKE.RECIPES.items():
            module = importlib.import_module(recipe)
            cfg = load_config(getattr(module, cls), ROOT / "recipes" / f"{recipe}.yaml")
            bare = [key for key, _, description in settings(cfg) if not description]
            assert not bare, f"recipes/{recipe}.py: settings without a description: {bare}"
    finally:
        sys.path.remove(str(ROOT / "recipes"))


def test_guide_lists_every_preset():
    text = (DOCS / "guide.md").read_text(encoding="utf-8")
    table = text[text.index("| preset | family | what |"):]
    table = table[: table.index("\n\n")]
    listed = set(re.findall(r"`([\w.-]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()[2:])))
    assert listed == set(zoo.preset_names()), f"docs/guide.md's presets table: missing {set(zoo.preset_names()) - listed}"


@pytest.mark.parametrize("recipe", sorted(MAKE.RECIPES))
def test_recipe_help_lists_every_setting_with_its_default(recipe, capsys):
    import sys

    from zoo.train import load_config, parse_args, settings

    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        cls = getattr(importlib.import_module(recipe), MAKE.RECIPES[recipe])
    finally:
        sys.path.remove(str(ROOT / "recipes"))
    default = ROOT / "recipes" / f"{recipe}.yaml"
    with pytest.raises(SystemExit):
        parse_args(cls, ["--help"], default=default)
    shown = capsys.readouterr().out
    for key, value, _ in settings(load_config(cls, default)):
        assert f"  {key}={value}\n" in shown, f"recipes/{recipe}.py --help does not list {key}={value}"


def test_docs_hold_no_control_characters():
    """A formula written through a non-raw Python string loses its backslashes (``\\t`` in ``\\text``
    becomes a tab, ``\\r`` in ``\\right`` a line break): what is left is a control character."""
    found = []
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            bad = [repr(c) for c in line if ord(c) < 32 or c == "\x7f"]
            if bad:
                found.append(f"{path.relative_to(ROOT)}:{n}: {', '.join(bad)}")
        found += [f"{path.relative_to(ROOT)}:{n}: a line starting 'ight' (\\right lost its backslash)"
                  for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1) if line.startswith("ight")]
    assert not found, "\n".join(found)


def test_the_ablation_table_shows_the_grid_file_rows():
    """Each row of the measured Table 3 shows the overrides the grid file holds now (a renamed key
    there is renamed in the table: the row still runs as shown)."""
    import yaml

    grid = yaml.safe_load((ROOT / "recipes" / "ablations" / "table3.yaml").read_text())["rows"]
    shown = re.findall(r"^\| ([\w.-]+) \| `([^`]*)` \|", (DOCS / "ablation" / "table3.md").read_text(), flags=re.M)
    assert len(shown) >= 20
    for row, changed in shown:
        assert row in grid and changed.split() == [str(o) for o in grid[row] or ["(base)"]], (row, changed)
