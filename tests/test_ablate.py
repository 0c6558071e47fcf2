"""Ablation grids: every row runs once with the shared overrides, finished rows are not run again,
and the table holds what the runs reported."""

from __future__ import annotations


import pytest

from zoo.ablate import AblationError, load_ablation, plot_grid, run_grid, write_table

# A stand-in recipe: records its overrides and the number of times it ran, fails when told to.
RECIPE = '''
import json, pathlib, sys
args = dict(a.split("=", 1) for a in sys.argv[1:])
out = pathlib.Path(args["run.out_dir"])
runs = pathlib.Path(args["count"])
runs.write_text(runs.read_text() + out.name + "\\n" if runs.exists() else out.name + "\\n")
if args.get("fail") == "yes" and pathlib.Path(args["flag"]).exists():
    raise SystemExit("boom: asked to fail")
heads = int(args.get("heads", 8))
(out / "results.json").write_text(json.dumps({"params": 1000 * heads, "valid_ppl": 10.0 / heads, "valid_bleu": heads * 1.5}))
'''


def _grid(tmp_path, rows: str) -> tuple:
    (tmp_path / "fake.py").write_text(RECIPE)
    path = tmp_path / "grid.yaml"
    count, flag = tmp_path / "count.txt", tmp_path / "flag"
    path.write_text(f"recipe: fake.py\nbase: [count={count}, flag={flag}]\nrows:\n{rows}metrics: [valid_ppl, valid_bleu]\n")
    return path, count, flag


def test_rows_run_once_and_an_interrupted_grid_resumes(tmp_path):
    path, count, flag = _grid(tmp_path, "  base: []\n  h1: [heads=1]\n  h4: [heads=4, fail=yes]\n")
    flag.write_text("")  # h4 fails this time, as if the grid were interrupted there
    with pytest.raises(AblationError, match="boom: asked to fail"):
        run_grid(path, tmp_path / "out", echo=lambda *_: None)
    assert len(count.read_text().splitlines()) == 3
    flag.unlink()
    records = run_grid(path, tmp_path / "out", echo=lambda *_: None)
    ran = count.read_text().splitlines()
    assert len(ran) == 4 and ran[-1].startswith("h4-")  # only the unfinished row ran again
    assert [r["cached"] for r in records] == [True, True, False]
    assert [r["results"]["params"] for r in records] == [8000, 1000, 4000]
    again = run_grid(path, tmp_path / "out", echo=lambda *_: None)
    assert len(count.read_text().splitlines()) == 4  # nothing left to run
    # the wall time measured when a row ran stays with the row
    walls = [r["results"]["wall_seconds"] for r in records]
    assert all(isinstance(w, float) and w >= 0 for w in walls)
    assert all(r["cached"] for r in again) and [r["results"]["wall_seconds"] for r in again] == walls

    md, csv_path = write_table(records, ["valid_ppl", "valid_bleu"], tmp_path / "table")
    lines = md.read_text().splitlines()
    assert lines[0] == "| row | changed | params | valid_ppl | valid_bleu | wall_seconds |"
    assert lines[3].startswith("| h1 | `heads=1` | 1,000 | 10.00 | 1.50 |")
    assert csv_path.read_text().splitlines()[1].startswith("base,(base),8000,1.25,12.0")
    # params named among the metrics (to get a plot panel) is still one column of the table
    md, _ = write_table(records, ["params", "valid_ppl"], tmp_path / "again")
    assert md.read_text().splitlines()[0] == "| row | changed | params | valid_ppl | wall_seconds |"
    assert plot_grid(records, ["valid_ppl", "valid_bleu"], tmp_path / "table").read_bytes()[:4] == b"\x89PNG"


def test_editing_a_row_reruns_that_row_only(tmp_path):
    path, count, _ = _grid(tmp_path, "  base: []\n  h1: [heads=1]\n")
    run_grid(path, tmp_path / "out", echo=lambda *_: None)
    path.write_text(path.read_text().replace("h1: [heads=1]", "h1: [heads=2]"))
    records = run_grid(path, tmp_path / "out", echo=lambda *_: None)
    assert len(count.read_text().splitlines()) == 3 and records[1]["results"]["params"] == 2000


@pytest.mark.parametrize("text,match", [
    ("recipe: fake.py\nrows: {}\n", "no rows"),
    ("recipe: fake.py\nrows:\n  a: [heads]\n", "key.path=value"),
    ("recipe: missing.py\nrows:\n  a: []\n", "not found"),
    ("recipe: fake.py\nrows:\n  a: []\nreference: b\n", "reference 'b' is not a row"),
    ("recipe: fake.py\nrows:\n  a: []\nextra: 1\n", "extra"),
])
def test_bad_files_are_named(tmp_path, text, match):
    (tmp_path / "fake.py").write_text(RECIPE)
    (tmp_path / "g.yaml").write_text(text)
    with pytest.raises(AblationError, match=match):
        load_ablation(tmp_path / "g.yaml")


def test_model_keys_are_gathered_for_the_recipe():
    from zoo.ablate import AblationFile, row_overrides

    grid = AblationFile(recipe="r.py", base=["train.steps=5", "model.dropout.residual=0.3"],
                        rows={"h1": ["model.block.attention.n_heads=1", "run.seed=2"]}, model_overrides="model_overrides")
    assert row_overrides(grid, "h1") == [
        "train.steps=5", "run.seed=2", 'model_overrides=["dropout.residual=0.3", "block.attention.n_heads=1"]']
    import yaml

    assert yaml.safe_load(row_overrides(grid, "h1")[-1].split("=", 1)[1]) == ["dropout.residual=0.3", "block.attention.n_heads=1"]


def test_the_command_writes_table_and_plot(tmp_path, capsys):
    from zoo.cli import main

    path, count, _ = _grid(tmp_path, "  base: []\n  h2: [heads=2]\n")
    assert main(["ablate", str(path), "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "| h2 | `heads=2` | 2,000 | 5.00 | 3.00 |" in out
    assert (tmp_path / "out" / "table.png").is_file() and (tmp_path / "out" / "table.csv").is_file()
    assert main(["ablate", str(path), "-o", str(tmp_path / "out"), "--only", "nope"]) == 2
    assert "unknown row 'nope'" in capsys.readouterr().err


def test_shipped_table3_rows_are_valid_specs():
    """Every row of the shipped grid resolves to a valid model; the parameter counts move as the paper's do."""
    from pathlib import Path

    import yaml

    import zoo
    from zoo.ablate import row_overrides

    grid, recipe = load_ablation(Path(__file__).resolve().parents[1] / "recipes" / "ablations" / "table3.yaml")
    assert recipe.name == "translate.py" and grid.reference == "base"
    base_preset = yaml.safe_load((recipe.parent / "translate.yaml").read_text())["model"]
    counts = {}
    for row in grid.rows:
        gathered = [o for o in row_overrides(grid, row) if o.startswith("model_overrides=")]
        model = yaml.safe_load(gathered[0].split("=", 1)[1]) if gathered else []
        counts[row] = zoo.count_parameters(zoo.build(zoo.load_spec(base_preset, model), device="meta"))
    assert all(counts[r] == counts["base"] for r in ("A-h1", "A-h2", "A-h8", "A-h16", "D-ls0", "D-drop0"))  # (A), (D): same size
    assert counts["B-dk16"] < counts["B-dk32"] < counts["base"]  # (B): smaller keys, fewer parameters
    assert counts["C-N1"] < counts["C-N2"] < counts["base"] < counts["C-N4"]
    assert counts["C-d128"] < counts["base"] < counts["C-d512"] < counts["big"]
    assert counts["E-learned"] > counts["base"]  # a learned table instead of fixed sinusoids


def test_a_metric_no_run_reports_is_named(tmp_path):
    path, _, _ = _grid(tmp_path, "  base: []\n")
    path.write_text(path.read_text().replace("metrics: [valid_ppl, valid_bleu]", "metrics: [valid_ppl, valid/last.bleu]"))
    with pytest.raises(AblationError, match=r"metrics: 'valid/last.bleu' is in no row's results.json; its keys: "
                                            r"params, valid_bleu, valid_ppl, wall_seconds"):
        run_grid(path, tmp_path / "out", echo=lambda *_: None)


def test_a_finished_rows_damaged_results_are_named(tmp_path):
    """A results.json cut short (a run killed while writing it) is named with the way to run the row
    again, never taken as finished nor a parser's traceback."""
    path, count, _ = _grid(tmp_path, "  base: []\n  h1: [heads=1]\n")
    records = run_grid(path, tmp_path / "out", echo=lambda *_: None)
    damaged = tmp_path / "out" / records[1]["dir"].rsplit("/", 1)[-1] / "results.json"
    damaged.write_text(damaged.read_text()[:10])
    with pytest.raises(AblationError, match=rf"^{damaged}: unreadable results \(not JSON: .*\); delete it to run the row again$"):
        run_grid(path, tmp_path / "out", echo=lambda *_: None)
    damaged.unlink()
    assert [r["cached"] for r in run_grid(path, tmp_path / "out", echo=lambda *_: None)] == [True, False]
