"""Peak memory of ``zoo convert`` against the size of the checkpoint it converts, both directions.

    python -m bench --only convert-memory     # a TinyLlama-shaped bf16 checkpoint (2.2 GB), and two more

For each checkpoint the bench writes a synthetic HF LLaMA directory itself: ``config.json`` and
random bf16 tensors in shards with their ``model.safetensors.index.json``, as ``save_pretrained``
lays them out, each tensor made and written on its own (zoo.shards), so the writer never holds the
model either. Then ``python -m zoo convert`` runs in a child process, HF -> zoo file and that file ->
HF directory, and the child's peak resident set size (``wait4``'s ``ru_maxrss``: every page it had
mapped at once, the libraries' included) is divided by the size of its input on disk. The child
runs with the environment's malloc settings, as a user runs the command, started by a small
launcher process (a child's ``ru_maxrss`` counts the address space of the process that forked it).

Three checkpoints: a tiny one (the libraries' share: what the command needs for any model), the
TinyLlama shape with 2 and with 22 layers (the same tensors, 11 times as many: if conversion were
holding the model, the peak would grow with them), and one layer of Llama-2-7B's width (its widest
tensors: a 7B checkpoint's peak is this one's, since the layer count does not move it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from zoo.shards import Entry, write_files

ROOT = Path(__file__).resolve().parents[1]

# (label, hidden, layers, heads, kv heads, FFN, vocab)
SHAPES = {
    "tiny": ("tiny (libraries only)", 64, 2, 4, 2, 160, 512),
    "tinyllama-2": ("TinyLlama shape, 2 layers", 2048, 2, 32, 4, 5632, 32000),
    "tinyllama": ("TinyLlama 1.1B shape, 22 layers", 2048, 22, 32, 4, 5632, 32000),
    "llama7b-1": ("Llama-2-7B width, 1 layer", 4096, 1, 32, 32, 11008, 32000),
}
RUNS = ["tiny", "tinyllama-2", "tinyllama", "llama7b-1"]
TINY_RUNS = ["tiny"]
SHARD = "500MB"


def llama_entries(hidden: int, layers: int, heads: int, kv: int, ffn: int, vocab: int) -> list[Entry]:
    """The tensors of LlamaForCausalLM (untied head), in save_pretrained's names, bf16."""
    head = hidden // heads
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes += [
            (f"{p}.input_layernorm.weight", (hidden,)), (f"{p}.self_attn.q_proj.weight", (heads * head, hidden)),
            (f"{p}.self_attn.k_proj.weight", (kv * head, hidden)), (f"{p}.self_attn.v_proj.weight", (kv * head, hidden)),
            (f"{p}.self_attn.o_proj.weight", (hidden, heads * head)), (f"{p}.post_attention_layernorm.weight", (hidden,)),
            (f"{p}.mlp.gate_proj.weight", (ffn, hidden)), (f"{p}.mlp.up_proj.weight", (ffn, hidden)),
            (f"{p}.mlp.down_proj.weight", (hidden, ffn)),
        ]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return [Entry(name, torch.bfloat16, shape) for name, shape in shapes]


def write_checkpoint(out: Path, dims: tuple[int, ...], max_shard_size: str = SHARD) -> int:
    """A random bf16 HF LLaMA directory at ``out`` (``dims``: hidden, layers, heads, kv heads, FFN,
    vocabulary), written tensor by tensor; its size on disk."""
    hidden, layers, heads, kv, ffn, vocab = dims
    out.mkdir(parents=True)
    entries = llama_entries(hidden, layers, heads, kv, ffn, vocab)
    g = torch.Generator().manual_seed(0)

    def tensors():
        for e in entries:
            if len(e.shape) == 1:
                yield e.name, 1 + 0.1 * torch.randn(e.shape, generator=g).to(torch.bfloat16)
            else:
                yield e.name, (0.02 * torch.randn(e.shape, generator=g)).to(torch.bfloat16)

    write_files(out / "model.safetensors", entries, tensors(), max_shard_size=max_shard_size, single={"format": "pt"},
                index={"total_parameters": sum(e.nbytes for e in entries) // 2})
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return disk_size(out)


def disk_size(path: Path) -> int:
    """Bytes of the safetensors files at ``path``: a directory's, or a zoo file's (its shards)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return sum(p.stat().st_size for p in path.parent.glob("*.safetensors"))


# A small process that starts the command and reports its peak: Linux counts in a child's ru_maxrss
# the memory of the process that forked it (the copied address space, before exec replaces it), so
# the bench, which holds torch, must not fork the measured command itself.
_LAUNCHER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
_, status, usage = os.wait4(child.pid, 0)
err = child.stderr.read().decode(errors="replace")
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss,
                  "seconds": time.perf_counter() - start, "stderr": err[-2000:]}))
"""


def convert_peak(src: Path, dst: Path, max_shard_size: str = SHARD) -> tuple[int, float]:
    """Run ``python -m zoo convert src -o dst`` in a child process; its peak RSS in bytes and seconds."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}  # malloc as the user has it
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "zoo", "convert", str(src), "-o", str(dst), "--max-shard-size", max_shard_size]
    done = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *cmd], env=env, cwd=ROOT, capture_output=True,
                          text=True, check=True)
    report = json.loads(done.stdout)
    if report["code"] != 0:
        raise RuntimeError(f"zoo convert {src} failed ({report['code']}): {report['stderr'].strip()}")
    return report["maxrss_kb"] * 1024, report["seconds"]  # Linux reports kilobytes


def measure(shape: str, work: Path) -> dict:
    """One checkpoint, written, converted to zoo and back; peaks against sizes on disk."""
    label, hidden, layers, heads, kv, ffn, vocab = SHAPES[shape]
    here = work / shape
    size = write_checkpoint(here / "hf", (hidden, layers, heads, kv, ffn, vocab))
    entries = llama_entries(hidden, layers, heads, kv, ffn, vocab)
    to_zoo, t1 = convert_peak(here / "hf", here / "model.safetensors")
    zoo_size = disk_size(here / "model.safetensors")
    shutil.rmtree(here / "hf")
    to_hf, t2 = convert_peak(here / "model.safetensors", here / "back")
    shutil.rmtree(here)
    largest = max(e.nbytes for e in entries)
    row = {"shape": shape, "label": label, "hidden": hidden, "layers": layers, "ffn": ffn, "vocab": vocab,
           "parameters": sum(e.nbytes for e in entries) // 2, "hf_bytes": size, "zoo_bytes": zoo_size,
           "largest_tensor_bytes": largest, "hf_to_zoo_peak": to_zoo, "zoo_to_hf_peak": to_hf,
           "hf_to_zoo_seconds": round(t1, 1), "zoo_to_hf_seconds": round(t2, 1)}
    print(f"convert-memory {label}: {size / 1e9:.2f} GB; HF -> zoo peak {to_zoo / 1e9:.2f} GB "
          f"({to_zoo / size:.2f}x), zoo -> HF peak {to_hf / 1e9:.2f} GB ({to_hf / zoo_size:.2f}x)", flush=True)
    return row


def run_all(*, tiny: bool = False, work: Path | None = None) -> list[dict]:
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        return [measure(shape, Path(tmp)) for shape in (TINY_RUNS if tiny else RUNS)]


def count(n: int) -> str:
    return f"{n / 1e6:,.0f} M" if n >= 10**6 else f"{n / 1e3:,.0f} K"


def size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**8 else f"{n / 1e6:.1f} MB"


def ratio(peak: int, size: int) -> str:
    """peak / size, or a dash where the checkpoint is too small for the ratio to mean anything."""
    return f"{peak / size:.2f}x" if size >= 10**8 else "–"


def markdown(rows: list[dict], env: dict) -> str:
    gb = 1e9
    base = next((r for r in rows if r["shape"] == "tiny"), None)
    lines = ["## Conversion memory: `zoo convert` of sharded bf16 checkpoints", "",
             (f"Measured {env['date']} on {env['cpu']} (torch {env['torch']}): the peak resident memory of the "
             "`zoo convert` process (`ru_maxrss`, the libraries included) against the size on disk of what it "
             f"reads; synthetic LLaMA checkpoints in {SHARD} shards, written by the bench itself. "
             "Made with `python -m bench --only convert-memory`."), "",
             "| checkpoint | parameters | on disk | largest tensor | HF -> zoo peak | peak / size | zoo -> HF peak | peak / size |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['label']} | {count(r['parameters'])} | {size(r['hf_bytes'])} | "
                     f"{r['largest_tensor_bytes'] / 1e6:.0f} MB | {r['hf_to_zoo_peak'] / gb:.2f} GB | "
                     f"{ratio(r['hf_to_zoo_peak'], r['hf_bytes'])} | {r['zoo_to_hf_peak'] / gb:.2f} GB | "
                     f"{ratio(r['zoo_to_hf_peak'], r['zoo_bytes'])} |")
    if base is not None and len(rows) > 1:
        above = [(r["label"], max(r["hf_to_zoo_peak"], r["zoo_to_hf_peak"]) - max(base["hf_to_zoo_peak"], base["zoo_to_hf_peak"]))
                 for r in rows if r is not base]
        lines += ["", "Above the tiny checkpoint's peak (what importing torch and transformers costs): "
                  + ", ".join(f"{extra / 1e6:,.0f} MB ({label})" for label, extra in above) + ". "
                  "The peak follows the widest tensors, not the number of layers; a bf16 Llama-2-7B (14 GB, 32 "
                  "layers of the last row's width) converts within about the last row's peak "
                  "([interop](interop-details.md#sharded-checkpoints-and-memory))."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    rows = run_all(tiny="--tiny" in (argv or sys.argv[1:]))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
