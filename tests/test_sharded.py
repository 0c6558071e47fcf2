"""Sharded checkpoints: zoo files written and read in shards (zoo.save / zoo.load), and ``zoo convert``
between sharded HF directories and zoo files tensor by tensor, exactly and in bounded memory.

The HF models are tiny, at odd sizes, randomised, saved by ``save_pretrained`` with a tiny
``max_shard_size`` so that they span several shards; what the command writes is read back with the
readers users have (``zoo.load``, ``from_pretrained(local_files_only=True)``) and compared with the
in-memory converters (``from_hf``), bit for bit where both are zoo tensors.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import randomize, tiny_model

import zoo
from zoo.cli import main
from zoo.io import LoadError, read_header
from zoo.shards import ShardError, parse_size

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.reference
V = 67


def tiny_llama(**kw):
    config = {"vocab_size": V, "hidden_size": 24, "intermediate_size": 44, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "attention_bias": False, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2}
    return randomize(transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**config, **kw})))


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(seed))


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["convert", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def refuse(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith("zoo: error: ") and err.count("\n") == 1, err
    return err


def shards(folder, stem: str = "model") -> list[str]:
    return sorted(p.name for p in folder.glob(f"{stem}-*-of-*.safetensors"))


def test_sharded_hf_directory_converts_to_what_from_hf_gives(tmp_path, capsys):
    hf = tiny_llama()
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert len(shards(tmp_path / "hf")) >= 3 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    code, out, err = run(capsys, tmp_path / "hf", "-o", tmp_path / "m.safetensors", "--max-shard-size", "30KB")
    assert code == 0 and err == "", err
    assert out.startswith(f"wrote {tmp_path / 'm.safetensors.index.json'}: zoo file, LlamaForCausalLM")
    assert len(shards(tmp_path, "m")) >= 3 and not (tmp_path / "m.safetensors").exists()
    model = zoo.load(tmp_path / "m.safetensors").eval()
    expected = zoo.interop.from_hf(hf).eval()
    assert model.spec == expected.spec and list(model.state_dict()) == list(expected.state_dict())
    for (name, a), b in zip(model.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(a, b), name
    with torch.no_grad():
        assert torch.equal(model(tokens()), expected(tokens()))
        assert (model(tokens()) - hf(tokens()).logits).abs().max().item() < 1e-5


def test_gpt_neox_checkpoint_names_are_read_and_written_as_transformers_does(tmp_path, capsys):
    """GPT-NeoX checkpoints call the head embed_out; transformers renames it while loading and back when saving."""
    hf = randomize(transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=V, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=40, rotary_pct=0.5)))
    hf.save_pretrained(tmp_path / "hf", max_shard_size="10KB")
    assert "embed_out.weight" in json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())["weight_map"]
    assert run(capsys, tmp_path / "hf", "-o", tmp_path / "m.safetensors")[0] == 0
    assert run(capsys, tmp_path / "m.safetensors", "-o", tmp_path / "back", "--max-shard-size", "10KB")[0] == 0
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())["weight_map"])
    back = transformers.GPTNeoXForCausalLM.from_pretrained(tmp_path / "back", local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(back(tokens()).logits, hf(tokens()).logits)


def test_zoo_file_converts_to_sharded_hf_that_from_pretrained_loads(tmp_path, capsys):
    model = randomize(zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=3", "d_model=40", "block.ffn.hidden=56"], seed=0))
    zoo.save(model, tmp_path / "m.safetensors", max_shard_size="25KB")
    code, out, err = run(capsys, tmp_path / "m.safetensors", "-o", tmp_path / "hf", "--max-shard-size", "20KB")
    assert code == 0 and err == "" and out.startswith(f"wrote {tmp_path / 'hf'}: HF directory, LlamaForCausalLM"), err
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json"} <= files
    assert "model.safetensors" not in files and len(shards(tmp_path / "hf")) >= 3
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_parameters"] == zoo.count_parameters(model)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    with torch.no_grad():
        assert (hf(tokens()).logits - model.eval()(tokens())).abs().max().item() < 1e-5


def test_save_in_shards_and_load_them_back_exactly(tmp_path):
    model = tiny_model("decoder", seed=0)  # GPT-2 layout: the head tied to the embedding
    path = zoo.save(model, tmp_path / "m.safetensors", max_shard_size="20KB")
    assert path == tmp_path / "m.safetensors.index.json" and not (tmp_path / "m.safetensors").exists()
    header = read_header(tmp_path / "m.safetensors")
    assert header.path == path and len(header.shards) == len(shards(tmp_path, "m")) >= 3
    assert header.tied == {"head.weight": "tok_emb.weight"} and header.metadata["zoo.format"] == str(zoo.io.FORMAT)
    assert header.size == sum(p.stat().st_size for p in header.shards)
    for where in (tmp_path / "m.safetensors", path):  # the name it was saved as, or its index
        loaded = zoo.load(where)
        assert loaded.head.weight is loaded.tok_emb.weight
        for a, b in zip(loaded.state_dict().values(), model.state_dict().values()):
            assert torch.equal(a, b)
    into = tiny_model("decoder", seed=1)
    zoo.load_weights(into, path)
    assert all(torch.equal(a, b) for a, b in zip(into.state_dict().values(), model.state_dict().values()))
    # saving again in one file replaces the shards and the index; and the other way round
    assert zoo.save(model, tmp_path / "m.safetensors", max_shard_size=None) == tmp_path / "m.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
    assert read_header(tmp_path / "m.safetensors").metadata["zoo.format"] == str(zoo.io.FORMAT_SINGLE)
    zoo.save(model, tmp_path / "m.safetensors", max_shard_size="30KB")
    assert sorted(p.name for p in tmp_path.iterdir()) == shards(tmp_path, "m") + ["m.safetensors.index.json"]
    zoo.save(model, tmp_path / "m.safetensors", max_shard_size="20KB")  # more shards: the old ones go
    assert len(shards(tmp_path, "m")) == len(header.shards)
    assert torch.equal(zoo.load(tmp_path / "m.safetensors").head.weight, model.head.weight)


def test_a_missing_shard_is_one_line_naming_it(tmp_path, capsys):
    zoo.save(tiny_model("decoder"), tmp_path / "m.safetensors", max_shard_size="20KB")
    gone = tmp_path / shards(tmp_path, "m")[1]
    gone.unlink()
    with pytest.raises(LoadError) as info:
        zoo.load(tmp_path / "m.safetensors")
    message = str(info.value)
    assert "\n" not in message and repr(gone.name) in message and "missing" in message, message
    assert repr(gone.name) in refuse(capsys, tmp_path / "m.safetensors", "-o", tmp_path / "hf")
    hf = tiny_llama()
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    first = shards(tmp_path / "hf")[0]
    (tmp_path / "hf" / first).unlink()
    assert repr(first) in refuse(capsys, tmp_path / "hf", "-o", tmp_path / "x.safetensors")


def test_a_shard_alone_or_from_another_save_is_refused(tmp_path):
    zoo.save(tiny_model("decoder", seed=0), tmp_path / "m.safetensors", max_shard_size="20KB")
    first = tmp_path / shards(tmp_path, "m")[0]
    with pytest.raises(LoadError, match=r"is shard 1/\d+ of a sharded zoo file; load its index 'm.safetensors.index.json'"):
        zoo.load(first)
    (tmp_path / "other").mkdir()
    zoo.save(tiny_model("decoder", seed=1), tmp_path / "other" / "m.safetensors", max_shard_size="20KB")
    first.write_bytes((tmp_path / "other" / first.name).read_bytes())
    with pytest.raises(LoadError, match="is not from the save its index 'm.safetensors.index.json' describes"):
        zoo.load(tmp_path / "m.safetensors")


def test_an_index_naming_a_tensor_in_two_shards_is_refused(tmp_path, capsys):
    """JSON keeps the last of two equal keys; an index that names one tensor twice is refused instead."""
    zoo.save(tiny_model("decoder", seed=0), tmp_path / "m.safetensors", max_shard_size="20KB")
    index = tmp_path / "m.safetensors.index.json"
    body = json.loads(index.read_text())
    first, second = shards(tmp_path, "m")[:2]
    name = next(t for t, f in body["weight_map"].items() if f == first)
    text = index.read_text().replace(f'"{name}": "{first}",', f'"{name}": "{first}",\n    "{name}": "{second}",', 1)
    index.write_text(text)
    with pytest.raises(LoadError) as info:
        zoo.load(tmp_path / "m.safetensors")
    message = str(info.value)
    assert f"weight_map names the tensor {name!r} twice, in {first!r} and in {second!r}" in message and "\n" not in message
    assert repr(name) in refuse(capsys, tmp_path / "m.safetensors", "-o", tmp_path / "hf")


def test_a_directory_whose_tensors_do_not_fit_its_config_names_them(tmp_path, capsys):
    tiny_llama().save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    err = refuse(capsys, tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert "the checkpoint's tensors do not fit its config.json (LlamaForCausalLM)" in err
    assert "model.layers.0.mlp.gate_proj.weight is [44, 24], config.json makes [48, 24]" in err
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    err = refuse(capsys, tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert "the weights do not fit LlamaForCausalLM: it has no model.layers.3." in err
    assert not list(tmp_path.glob("m*"))  # nothing written


def test_shard_sizes(tmp_path):
    assert parse_size("20KB") == 20_000 and parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30
    assert parse_size(1234) == 1234 and parse_size(None) is None and parse_size("1.5MB") == 1_500_000
    for bad in ("5 parsecs", "-1GB", 0, "GB"):
        with pytest.raises(ShardError, match="max_shard_size"):
            parse_size(bad)
    with pytest.raises(zoo.io.SaveError, match="max_shard_size '5 parsecs' is not a size"):
        zoo.save(tiny_model("decoder"), tmp_path / "m.safetensors", max_shard_size="5 parsecs")


_PEAK = """
import sys, torch, transformers
from transformers.utils import logging
from zoo.interop.files import convert
logging.set_verbosity_error()
logging.disable_progress_bar()
with torch.device("meta"):  # every module transformers imports lazily, imported before measuring
    transformers.LlamaForCausalLM(transformers.LlamaConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                  num_attention_heads=2, vocab_size=8)).generation_config

def status(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) * 1024

for src, dst in ((sys.argv[1], sys.argv[2]), (sys.argv[2], sys.argv[3])):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    before = status("VmRSS:")
    convert(src, dst, max_shard_size="8MB")
    print(status("VmHWM:") - before)
"""


@pytest.mark.slow
def test_conversion_holds_a_fraction_of_the_checkpoint(tmp_path):
    """A 61 MB sharded bf16 checkpoint converts to zoo and back with the peak resident memory of a
    fresh process growing by well under its size (holding the model once would be 1x; reading it
    with from_pretrained, converting and saving holds it two or three times)."""
    from bench.convert_memory import write_checkpoint

    size = write_checkpoint(tmp_path / "hf", (512, 8, 8, 2, 1408, 8000), max_shard_size="8MB")
    run = subprocess.run([sys.executable, "-c", _PEAK, str(tmp_path / "hf"), str(tmp_path / "m.safetensors"),
                          str(tmp_path / "back")], capture_output=True, text=True, check=True)
    to_zoo, to_hf = (int(line) for line in run.stdout.split())
    print(f"peak grew by {to_zoo / size:.2f}x (HF -> zoo) and {to_hf / size:.2f}x (zoo -> HF) the checkpoint's {size:,} B")
    assert to_zoo < 0.75 * size and to_hf < 0.75 * size
    assert len(list((tmp_path / "back").glob("model-*-of-*.safetensors"))) >= 7


SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=40, max_position_embeddings=64)
STREAMED = {  # RoPE scalings, whose parameters travel in config.json (tests/test_conformance.py streams each class)
    "Phi3ForCausalLM, longrope": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SMALL, pad_token_id=None, rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                                                     "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
        original_max_position_embeddings=16)),
    "LlamaForCausalLM, llama3 rope": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
}


@pytest.mark.parametrize("case", STREAMED)
def test_rope_scalings_stream_both_ways(case, tmp_path, capsys):
    hf = randomize(STREAMED[case]()).eval()
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert run(capsys, tmp_path / "hf", "-o", tmp_path / "m.safetensors")[0] == 0
    model, expected = zoo.load(tmp_path / "m.safetensors").eval(), zoo.interop.from_hf(hf).eval()
    assert model.spec == expected.spec
    for (name, a), b in zip(model.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(a, b), name
    assert run(capsys, tmp_path / "m.safetensors", "-o", tmp_path / "back", "--max-shard-size", "20KB",
               "--architecture", type(hf).__name__)[0] == 0  # a Phi-3 without partial rotary is LLaMA by default
    back = type(hf).from_pretrained(tmp_path / "back", local_files_only=True).eval()
    with torch.no_grad():
        out, ref = back(tokens()), hf(tokens())
        key = "logits" if hasattr(ref, "logits") else "last_hidden_state"
        assert torch.equal(getattr(out, key), getattr(ref, key))


def test_an_index_naming_a_shard_outside_its_directory_is_refused(tmp_path):
    zoo.save(tiny_model("decoder", seed=0), tmp_path / "m.safetensors", max_shard_size="20KB")
    index = tmp_path / "m.safetensors.index.json"
    first = shards(tmp_path, "m")[0]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / first).write_bytes((tmp_path / first).read_bytes())
    index.write_text(index.read_text().replace(f'"{first}"', f'"../{tmp_path.name}/elsewhere/{first}"'))
    with pytest.raises(LoadError, match=rf"weight_map names the shard '../{tmp_path.name}/elsewhere/{first}', which is not a "
                                        r"file beside the index"):
        zoo.load(tmp_path / "m.safetensors")
