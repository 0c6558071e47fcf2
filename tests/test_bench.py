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


@pytest.mark.slow
def test_every_workload_runs_at_toy_size(tmp_path):
    out = tmp_path / "r.json"
    md = tmp_path / "b.md"
    assert main(["--tiny", "--only", "vit", "gpt2", "mistral", "moe", "bert", "transformer", "generate", "dropout", "window", "packing",
                 "loss", "lora", "--precision", "fp32",
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


@pytest.mark.slow
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


# ------------------------------------------------------------------------------ sized rows (--size)
@pytest.mark.slow
def test_sized_rows_run_at_toy_size_eager_and_compiled(tmp_path):
    """The GPU rows' code at toy size on the CPU, through ``python -m bench``: zoo and its peer, eager and
    compiled (dynamo's eager backend: graphs captured, no code generated), the table, the page rebuilt
    from the JSON."""
    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    assert main(["--size", "toy", "--compile", "--compile-backend", "eager", "--only", "peak", "gpt2", "vit",
                 "--precision", "fp32", "--json", str(out), "--out", str(md)]) == 0
    data = json.loads(out.read_text())
    rows = {r["workload"]: r for r in data["rows"]}
    assert len(rows) == 3 and all(r["extra"]["size"] == "toy" for r in rows.values())
    for name, r in rows.items():
        peer = "HF" if "GPT" in name else "timm"
        assert set(r["seconds"]) == {"zoo", "zoo compiled", peer, f"{peer} compiled"}, name
        assert r["flops"] > 0 and r["extra"]["flop_weights"] > 0 and r["extra"]["compile_scope"] == "blocks"
        assert all(s > 0 and math.isfinite(s) for s in r["seconds"].values())
    text = md.read_text()
    assert "| side | throughput | zoo / peer | MFU | peak memory |" in text and "vs HF compiled" in text
    assert "tokens x (6N + 12 L T d)" in text
    again = tmp_path / "again.md"
    assert main(["--from-json", str(out), "--out", str(again)]) == 0
    assert again.read_text() == text


@pytest.mark.slow
def test_a_budget_measures_eager_sides_first_and_lists_what_it_skipped(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["--size", "toy", "--compile", "--compile-backend", "eager", "--budget", "600", "--only", "vit",
                 "--precision", "fp32", "--json", str(out), "--out", str(tmp_path / "b.md")]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(len(r["seconds"]) == 4 for r in rows)  # two passes, merged into one row each
    log = capsys.readouterr().out
    assert log.count("vit_tiny_patch16_224 train b4 [fp32]: ") == 2  # a line a pass: eager, then with compiled
    assert main(["--size", "toy", "--compile", "--compile-backend", "eager", "--budget", "1e-9", "--only", "gpt2",
                 "--precision", "fp32", "--json", str(out), "--out", str(tmp_path / "c.md")]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["seconds"] == {} and len(row["extra"]["failed"]) == 4
    assert "past the --budget of 1e-09 s, not run: GPT-2 toy train 2x16: zoo;" in capsys.readouterr().out


@pytest.mark.slow
def test_every_sized_row_runs_at_toy_size():
    """The rest of the GPU rows (eager; the compiled sides are the same code with a compiled model)."""
    from bench import sized, sized_rows

    plan = sized.Plan(size="toy", warmup=0, repeats=2)
    rows = [r for name in ("llama", "bert", "transformer", "moe", "generate") for r in sized_rows.rows(name, "fp32", plan)]
    assert len(rows) == 7
    for r in rows:
        assert r.seconds.keys() >= {"zoo"} and len(r.seconds) >= 2 and all(s > 0 for s in r.seconds.values()), r
        assert r.flops is None if ("greedy" in r.workload or "beam" in r.workload) else r.flops > 0
    with pytest.raises(ValueError, match="workload 'mistral' has no sized rows"):
        sized_rows.rows("mistral", "fp32", plan)


@pytest.mark.slow
def test_sized_sides_one_at_a_time_with_a_deadline_and_the_decoding_hook(monkeypatch):
    """The CUDA order (each side built, timed and freed in turn) on the CPU, whole-model compilation
    through AOT autograd, a deadline that stops sides, and zoo.generate's static-cache hook."""
    import time

    import zoo
    from bench import sized, sized_rows

    # the CUDA branch's memory bookkeeping, with the CUDA calls stood in for
    peaks = iter(range(1, 100))
    monkeypatch.setattr(sized, "_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: next(peaks) * 2**30)
    plan = sized.Plan(size="toy", compile=True, scope="model", backend="aot_eager", warmup=0, repeats=2)
    row = sized_rows.gpt2("fp32", plan)
    assert set(row.seconds) == {"zoo", "zoo compiled", "HF", "HF compiled"}
    assert list(row.extra["memory"].values()) == [2**30, 2 * 2**30, 3 * 2**30, 4 * 2**30]
    assert "| GPT-2 toy train 2x16 | fp32 | zoo compiled |" in sized.markdown([row], {})
    assert "1.0 GiB" in sized.markdown([row], {}) and "GiB" in sized.describe(row, None)
    monkeypatch.setattr(sized, "_cuda", lambda: False)
    assert [p for _, p, _ in sized.ratios(row)] == ["HF", "HF compiled"]

    # a GPU run's two passes: every row's eager sides, then the compiled ones, merged into one row
    two = sized.Plan(size="toy", compile=True, backend="eager", warmup=0, one_at_a_time=True, only="eager")
    first = sized_rows.vit("fp32", two, "infer")
    two.only = "compiled"
    second = sized_rows.vit("fp32", two, "infer")
    assert set(first.seconds) == {"zoo", "timm"} and set(second.seconds) == {"zoo compiled", "timm compiled"}
    both = sized.merge(first, second)
    assert len(both.seconds) == 4 and set(both.extra["first_step_seconds"]) == set(both.seconds)
    assert [p for _, p, _ in sized.ratios(both)] == ["timm", "timm compiled"]

    late = sized.Plan(size="toy", warmup=0, deadline=time.monotonic() - 1, one_at_a_time=True)
    row = sized_rows.bert("fp32", late)
    assert row.seconds == {} and set(row.extra["failed"]) == {"zoo", "HF"} and len(late.skipped) == 2

    real, seen = zoo.generate, []

    def with_hooks(*args, cache=None, compile=False, **kw):  # what a static-cache decoding path accepts
        seen.append((cache, compile))
        return real(*args, **kw)

    monkeypatch.setattr(zoo, "generate", with_hooks)
    assert sized.generate_hooks() == {"cache": "static", "compile": True}
    row = sized_rows.greedy("fp32", sized.Plan(size="toy", warmup=0), batch=1)
    assert set(row.seconds) == {"zoo", "HF", "zoo static+compiled"} and ("static", True) in seen


def test_mfu_counts_weights_in_matmuls():
    import zoo
    from bench import sized

    spec = zoo.load_spec("gpt2-small", ["n_layers=2", "d_model=64", "block.attention.n_heads=4", "vocab_size=100",
                                        "max_seq_len=32"])
    model = zoo.build(spec)
    total = sum(p.numel() for p in model.parameters())
    # tied head: the token table counts once (as the output projection), the learned positions not at all
    assert sized.flop_weights(model, tied=True) == total - 32 * 64
    assert sized.train_flops(10, 1000, 2, 16, 64) == 10 * (6 * 1000 + 12 * 2 * 16 * 64)
    assert sized.forward_flops(10, 1000, 2, 16, 64) == 10 * (2 * 1000 + 4 * 2 * 16 * 64)


@pytest.mark.parametrize("argv,named", [(["--tiny", "--size", "gpu"], "--tiny"), (["--budget", "0"], "--budget"),
                                        (["--step-seconds", "-1"], "--step-seconds"), (["--size", "big"], "--size"),
                                        (["--compile-scope", "all"], "--compile-scope")])
def test_sized_options_are_checked_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and named in capsys.readouterr().err


def test_decoding_bench_times_each_cache_and_refuses_bad_counts(capsys):
    from bench import decode

    assert decode.main(["--tiny", "--new-tokens", "3", "--repeats", "1", "--sides", "dynamic", "static"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| model | decoding | batch | dynamic tok/s | static tok/s |") and len(rows) == 1 + 6
    with pytest.raises(SystemExit) as e:
        decode.main(["--repeats", "0"])
    assert e.value.code == 2 and "--repeats must be >= 1" in capsys.readouterr().err


def test_lora_bench_counts_what_each_side_trains_at_toy_size():
    """The toy decoder (2 layers of 64, q 64 and k, v 32 rows, SwiGLU 96) at rank 16 on q, k, v, o and
    ffn: per layer A and B of qkv's three slices, out, fc1's gate and up, fc2, counted by hand."""
    from bench import lora

    full = lora.measure_here("full", "fp32", tiny=True, repeats=1)
    adapted = lora.measure_here("lora", "fp32", tiny=True, repeats=1)
    per_layer = 16 * (3 * 64 + (64 + 32 + 32) + 64 + 64 + 2 * 64 + 2 * 96 + 96 + 64)
    assert adapted["trainable"] == 2 * per_layer and adapted["params"] == full["params"] + 2 * per_layer
    assert full["trainable"] == full["params"]
    for m in (full, adapted):  # AdamW: two fp32 moments per trained element, a step count per tensor
        assert m["grad_bytes"] == 4 * m["trainable"] and 2 * m["grad_bytes"] < m["optimizer_bytes"] < 2 * m["grad_bytes"] + 4096
        assert m["seconds"] > 0


@pytest.mark.slow
def test_lora_bench_table_runs_each_side_in_a_process_of_its_own(capsys):
    from bench import lora

    assert lora.main(["--tiny", "--repeats", "1", "--precision", "fp32"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| fp32 |")]
    assert [r.split(" | ")[1] for r in rows[-2:]] == ["LoRA", "full"]


def test_deepseek_rows_run_at_toy_size():
    from bench import deepseek

    rows = deepseek.rows("fp32", {"warmup": 0, "repeats": 1}, tiny=True)
    decode, *layer = rows
    mla, gqa = (decode.extra["kv_cache_bytes_per_token"][k] for k in ("MLA", "GQA"))
    assert mla == 2 * (64 // 14 + 8) * 4 and gqa == 2 * 2 * (1 * 16) * 4  # latent + rotary key; k and v of 1 kv head
    assert set(decode.seconds) == {"zoo", "GQA", "MLA unfolded"}
    assert all(set(r.seconds) == {"zoo", "HF"} and r.flops for r in layer)
    from bench.run import markdown

    text = markdown(rows, {}, {"date": "-", "cpu": "-", "threads": 1, "torch": "-", "malloc": "-"})
    assert f"KV cache bytes per token MLA {mla:,}, GQA {gqa:,}" in text
