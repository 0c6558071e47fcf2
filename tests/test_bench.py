"""The benchmark scripts keep working (toy sizes; no timing is asserted: benchmarks are not tests)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bench.common import Row, count_flops
import bench.run
from bench.run import main, usable_precisions
from zoo.data.corpus import CATALOG_HINT, catalogs_dir
from zoo.data.translation import DING_PATH, INSTALL_HINT


def test_every_workload_runs_at_toy_size(tmp_path):
    out = tmp_path / "r.json"
    md = tmp_path / "b.md"
    assert main(["--tiny", "--only", "vit", "gpt2", "mistral", "moe", "bert", "transformer", "generate", "dropout", "window", "packing",
                 "loss", "--precision", "fp32",
                 "--json", str(out), "--out", str(md)]) == 0
    data = json.loads(out.read_text())
    names = [r["workload"] for r in data["rows"]]
    assert any("vit" in n for n in names) and any("beam" in n for n in names) and any("BERT" in n for n in names)
    loss_rows = [r for r in data["rows"] if r["workload"].startswith("loss:")]
    assert len(loss_rows) == 1 and all(r["extra"]["peak_mb"].keys() == r["extra"]["saved_mb"].keys() == {
        "zoo", "logits + F.cross_entropy"} for r in loss_rows)
    assert sum("dropout" in n for n in names) == 2 and any("packed" in n or "packing" in n for n in names)
    assert any("causal window" in n and "ALiBi" not in n for n in names) and any("ALiBi at" in n for n in names)
    moe_rows = [r for r in data["rows"] if "experts" in r["workload"]]  # train, forward, greedy: HF's experts kinds
    assert len(moe_rows) == 3 and all({"HF grouped_mm", "HF eager"} <= set(r["seconds"]) for r in moe_rows)
    assert all(r["flops"] for r in moe_rows[:2]) and "HF batched_mm" in moe_rows[2]["seconds"]
    for r in data["rows"]:
        assert "zoo" in r["seconds"] and len(r["seconds"]) >= 2, r
        assert all(s > 0 and math.isfinite(s) for s in r["seconds"].values())
    assert "| vit_tiny_patch16_224 train | fp32 |" in md.read_text()
    assert md.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    again = tmp_path / "again.md"  # the page rebuilt from the JSON alone
    assert main(["--from-json", str(out), "--out", str(again)]) == 0
    assert again.read_text() == md.read_text() and again.with_suffix(".png").exists()


@pytest.mark.skipif(not (DING_PATH.is_file() and catalogs_dir().is_dir()), reason=f"{INSTALL_HINT}; {CATALOG_HINT}")
def test_translation_quality_yardstick_runs_at_toy_size(tmp_path):
    out, md = tmp_path / "q.json", tmp_path / "q.md"
    assert main(["--tiny", "--only", "translation-quality", "--json", str(out), "--out", str(md)]) == 0
    report = json.loads(out.read_text())
    domains = set(report["zoo"]["scores"])
    assert domains >= {"ding", "messages", "all"} and domains == set(report["peer"]["scores"])
    for side in ("zoo", "peer"):
        for sc in report[side]["scores"].values():
            assert 0 <= sc["bleu"] <= 100 and 0 <= sc["chrf"] <= 100
    # the same dimensions on both sides (Marian has its own position table and a final-logits bias)
    assert report["peer"]["steps"] > 0 and abs(report["peer"]["params"] - report["zoo"]["params"]) < 0.1 * report["zoo"]["params"]
    assert "| messages |" in md.read_text() and "HF Marian" in md.read_text()


def test_flop_count_of_a_linear_layer_by_hand():
    layer = torch.nn.Linear(32, 16)
    x = torch.randn(4, 32, requires_grad=True)
    assert count_flops(lambda: layer(x)) == 2 * 4 * 32 * 16
    assert count_flops(lambda: layer(x).sum().backward()) == 3 * 2 * 4 * 32 * 16  # forward + grad of input and of weight


def test_attention_flops_are_counted_on_cpu():
    q = torch.randn(1, 2, 8, 4)
    flops = count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert flops == 2 * (2 * 1 * 2 * 8 * 8 * 4)  # QK^T and PV


def test_ratio_and_mfu():
    row = Row("w", "fp32", "tokens", work=100, seconds={"zoo": 1.0, "peer": 1.5}, flops=2e9)
    assert row.ratio() == 1.5 and row.throughput("zoo") == 100
    assert row.mfu("zoo", peak=4e9) == 0.5 and row.mfu("zoo", None) is None


def test_bf16_rows_are_skipped_only_where_bf16_matmuls_are_not_native(monkeypatch):
    monkeypatch.setattr(bench.run, "bf16_is_fast", lambda device: False)
    assert usable_precisions(["fp32", "bf16"], tiny=False) == ["fp32"]
    assert usable_precisions(["fp32", "bf16"], tiny=True) == ["fp32", "bf16"]  # toy sizes only check the scripts
    monkeypatch.setattr(bench.run, "bf16_is_fast", lambda device: True)
    assert usable_precisions(["fp32", "bf16"], tiny=False) == ["fp32", "bf16"]


def test_gpu_rows_need_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tools/gpu-check runs the GPU rows")
    with pytest.raises(SystemExit) as e:
        main(["--tiny", "--only", "gpt2", "--device", "cuda"])
    assert e.value.code == 2 and "--device cuda: CUDA is not available here" in capsys.readouterr().err


@pytest.mark.parametrize("argv,named", [(["--repeats", "0"], "--repeats"), (["--threads", "-2"], "--threads"),
                                        (["--warmup", "-1"], "--warmup")])
def test_counts_below_their_minimum_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--tiny", *argv])
    assert e.value.code == 2 and named in capsys.readouterr().err
