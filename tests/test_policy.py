"""The kernel policy: one object, read from the environment once, set in Python and by run.*,
printed by ``zoo kernels --explain``; the torchrun workflow (measure first, ranks read)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.kernels import policy
from zoo.kernels.cpu import choose
from zoo.train import attention_kernels


def test_environment_is_read_once_and_use_sets_fields_for_good_or_within_a_block(monkeypatch):
    zoo.kernels.use(from_env=True)
    before = policy.policy()
    monkeypatch.setenv("ZOO_CPU_LINEAR", "aten")
    assert policy.policy() == before  # read once: a later change of the environment is not seen
    zoo.kernels.use(from_env=True)  # ... until asked
    assert policy.policy().cpu_linear == "aten" and policy.sources()["cpu_linear"] == "environment (ZOO_CPU_LINEAR)"
    with zoo.kernels.use(attention="dense", cpu_linear="onednn") as now:
        assert (now.attention, now.cpu_linear) == ("dense", "onednn") and policy.sources()["attention"] == "use()"
    assert (policy.policy().attention, policy.policy().cpu_linear) == (before.attention, "aten")
    zoo.kernels.use(cpu_attention="rule")  # no block: for the rest of the process
    assert policy.policy().cpu_attention == "rule"
    with pytest.raises(ValueError, match=r"zoo.kernels.use\(attention=...\)='fast': use one of auto, dense, blocked, flex"):
        zoo.kernels.use(attention="fast")
    with pytest.raises(ValueError, match="unknown field 'linear'; use one of attention, cpu_attention, cpu_linear, cache"):
        zoo.kernels.use(linear="aten")
    monkeypatch.setenv("ZOO_ATTENTION", "sparse")
    with pytest.raises(ValueError, match="ZOO_ATTENTION='sparse': use one of auto, dense, blocked, flex"):
        zoo.kernels.use(from_env=True)


@pytest.mark.parametrize("choice,attention,cpu_attention", [
    ("default", "auto", "rule"), ("blocked", "blocked", "rule"), ("dense", "dense", "rule"), ("math", "dense", "sdpa")])
def test_run_attention_sets_the_policy_within_the_run(choice, attention, cpu_attention):
    zoo.kernels.use(attention="auto", cpu_attention="rule")
    with attention_kernels(choice):
        assert (policy.policy().attention, policy.policy().cpu_attention) == (attention, cpu_attention)
    assert (policy.policy().attention, policy.policy().cpu_attention) == ("auto", "rule")


def test_the_policy_steers_the_kernels_a_step_takes():
    model = zoo.build("llama-3.2-tiny", seed=0, overrides=["n_layers=1", "vocab_size=128"])
    tokens = torch.randint(0, 128, (2, 32))

    def kernels(**fields):
        with zoo.kernels.use(**fields), policy.explaining() as seen:
            model(tokens).sum().backward()
        return {(op, kernel) for op, _, kernel in seen.calls}

    got = kernels(cpu_attention="sdpa", cpu_linear="aten")
    assert ("attention", "sdpa") in got and ("linear", "aten") in got and ("attention", "zoo") not in got
    got = kernels(cpu_attention="rule", cpu_linear="aten")  # 32 keys in fp32 training: zoo's kernel by rule
    assert ("attention", "zoo") in got and ("attention", "sdpa") not in got


def test_cache_dir_moves_the_kernel_cache_with_the_data_caches(monkeypatch, tmp_path):
    from zoo.data.images import default_cache_dir

    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    zoo.kernels.use(cache="")  # the default file (the suite keeps its choices in memory: ZOO_KERNEL_CACHE=off)
    assert choose.cache_path().parent == tmp_path == default_cache_dir()
    assert choose.cache_path().name.startswith("kernels-")
    zoo.kernels.use(cache=str(tmp_path / "mine.json"))
    assert choose.cache_path() == tmp_path / "mine.json"
    zoo.kernels.use(cache="off")
    assert choose.cache_path() is None


@pytest.mark.slow
def test_measure_for_torchrun_writes_what_its_ranks_read(monkeypatch, tmp_path, capsys):
    """`zoo kernels --measure SPEC --nproc 2` measures with a rank's threads (torchrun gives each of
    several processes OMP_NUM_THREADS=1), so the file it writes is the one a rank reads."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    zoo.kernels.use(cache="", cpu_attention="measure")
    threads = torch.get_num_threads()
    choose.forget()
    try:
        assert main(["kernels", "--measure", "llama-3.2-tiny", "--set", "n_layers=1", "--set", "vocab_size=256",
                     "--batch", "2", "--seq", "64", "--nproc", "2"]) == 0
        assert "1 threads" in capsys.readouterr().out
        written = choose.cache_path()
    finally:
        torch.set_num_threads(threads)
        choose.forget()
    saved = json.loads(written.read_text())
    assert saved["machine"].endswith("| 1 threads") and saved["choices"]
    # a rank as torchrun starts it: OMP_NUM_THREADS=1, the same cache directory, nothing set in Python
    rank = ("import json, torch; from zoo.kernels.cpu import choose; "
            "print(json.dumps([str(choose.cache_path()), torch.get_num_threads(), sorted(choose.choices())]))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ZOO_CACHE_DIR": str(tmp_path), "RANK": "1", "WORLD_SIZE": "2"}
    env.pop("ZOO_KERNEL_CACHE", None)
    out = subprocess.run([sys.executable, "-c", rank], env=env, capture_output=True, text=True, check=True).stdout
    path, rank_threads, known = json.loads(out.strip().splitlines()[-1])
    assert (path, rank_threads, known) == (str(written), 1, sorted(saved["choices"]))


def test_explain_prints_the_policy_and_each_calls_kernel(capsys):
    zoo.kernels.use(cpu_attention="rule", cpu_linear="aten")
    assert main(["kernels", "--explain", "vit-tiny-16", "--set", "n_layers=1", "--batch", "2", "--infer"]) == 0
    out = capsys.readouterr().out
    assert "cpu_attention" in out and "rule" in out and "use()" in out
    assert "attention" in out and "linear" in out and "aten" in out and "[2, 3, 197, 64]" in out
