"""``zoo kernels``: the machine's measured CPU kernel choices listed, made ahead of a run from a spec,
and cleared; the inputs it makes for each family."""

from __future__ import annotations

import json

import pytest
import torch

import zoo

from zoo.cli import main
from zoo.kernels.cpu import choose, linear
from zoo.spec import load_spec

LLAMA = ["kernels", "--measure", "llama-3.2-tiny", "--set", "n_layers=1", "--set", "vocab_size=512",
         "--batch", "2", "--seq", "128"]


def test_kernels_measures_a_training_step_lists_and_clears(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "kernels.json"
    zoo.kernels.use(cache=str(cache))
    zoo.kernels.use(cpu_attention="measure")
    choose.forget()
    try:
        assert main(["kernels"]) == 0 and "no kernel choices measured on this machine yet" in capsys.readouterr().out
        assert main(LLAMA) == 0
        out = capsys.readouterr().out
        saved = json.loads(cache.read_text())["choices"]
        assert f"measured {len(saved)} new shape class(es) in a training step of llama-3.2-tiny" in out
        ops = {key.split("/")[0] for key in saved}
        # 128 queries x 128 keys in fp32 training; the 256-row products of a 256-wide model
        assert "attention" in ops and ("linear_fp32" in ops) == linear.onednn_available()
        assert all(set(v["seconds"]) == {"zoo", "sdpa"} for k, v in saved.items() if k.startswith("attention/"))
        for key, entry in saved.items():  # the table shows each choice with its timings
            assert key.split("/", 1)[1] in out and entry["pick"] in out
        choose.forget()  # a new process: the cache holds them, nothing is timed again
        assert main(LLAMA) == 0 and "measured 0 new shape class(es)" in capsys.readouterr().out
        assert main(["kernels", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["choices"] == saved and shown["cache"] == str(cache) and shown["machine"] == choose.machine()
        assert main(["kernels", "--clear"]) == 0
        assert f"deleted {cache}" in capsys.readouterr().out and not cache.exists() and not choose.choices()
        zoo.kernels.use(cache="off")
        assert main(LLAMA) == 2
        assert "zoo: error: ZOO_KERNEL_CACHE=off: choices would not be kept" in capsys.readouterr().err
    finally:
        choose.forget()


@pytest.mark.parametrize("preset,shapes", [("vit-tiny-16", [(3, 3, 224, 224)]),
                                           ("t5-tiny", [(3, 16), (3, 16)]), ("bert-mini", [(3, 16)])])
def test_each_family_declares_its_example_inputs(preset, shapes):
    spec = load_spec(preset, ["n_layers=1"])
    model = zoo.build(spec, seed=0)
    got = model.example_inputs(3, 16, torch.Generator().manual_seed(0))
    assert [tuple(x.shape) for x in got] == shapes
    if spec.family != "vit":
        assert all(int(x.max()) < spec.vocab_size and int(x.min()) >= 0 for x in got)
    with torch.no_grad():
        model.eval()(*got)  # forward takes them as they come


def test_kernels_measures_an_inference_pass_of_a_vit(tmp_path, monkeypatch, capsys):
    zoo.kernels.use(cache=str(tmp_path / "kernels.json"))
    zoo.kernels.use(cpu_attention="measure")
    choose.forget()
    try:
        assert main(["kernels", "--measure", "vit-tiny-16", "--set", "n_layers=1", "--batch", "2", "--infer"]) == 0
        assert "in a forward pass of vit-tiny-16 (batch 2, fp32, " in capsys.readouterr().out
        saved = json.loads((tmp_path / "kernels.json").read_text())["choices"]
        assert any(k.startswith("attention/float32/infer/") and "/s256/" in k for k in saved)  # 197 keys
        assert not any(k.endswith("+grad") for k in saved)
    finally:
        choose.forget()


def test_a_damaged_cache_file_never_stops_zoo(tmp_path, capsys):
    """Entries that are not what pick writes (seconds that are not numbers, no pick) are left out with
    a warning naming the file; the good ones stand, and a file that is not a JSON object is ignored."""
    cache = tmp_path / "kernels.json"
    good = {"pick": "zoo", "seconds": {"zoo": 0.001, "sdpa": 0.002}}
    cache.write_text(json.dumps({"machine": choose.machine(), "choices": {
        "attention/a": good, "attention/b": {"pick": "zoo", "seconds": {"zoo": "fast"}},
        "attention/c": {"pick": "zoo", "seconds": [1, 2]}, "attention/d": {"pick": 3}, "attention/e": "zoo"}}))
    zoo.kernels.use(cache=str(cache))
    choose.forget()
    try:
        with pytest.warns(UserWarning, match=rf"zoo kernel cache {cache}: 4 damaged entries ignored \(attention/b, attention/c, "
                                             r"attention/d, ...\); measured afresh when needed"):
            assert main(["kernels", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["choices"] == {"attention/a": good}
        assert main(["kernels"]) == 0 and "attention" in capsys.readouterr().out
        cache.write_text("[1, 2]")
        choose.forget()
        with pytest.warns(UserWarning, match=rf"zoo kernel cache {cache} unreadable \(not a JSON object\); measuring afresh"):
            assert main(["kernels"]) == 0
        assert "no kernel choices measured on this machine yet" in capsys.readouterr().out
    finally:
        zoo.kernels.use(cache="off")
        choose.forget()
