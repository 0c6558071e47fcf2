"""The GPU path (marked ``cuda``; skipped, with one reason, where CUDA is absent). ``tools/gpu-check``
runs these and the benchmark's GPU rows on a machine with a GPU and writes a short report.

Every family builds on the GPU and trains under bf16 autocast; generation with the KV cache equals
the uncached forward's choices; a file saved from the GPU loads onto it; each recipe runs a few
steps with ``run.device=cuda``; DDP and FSDP run on one GPU (NCCL, one process) and match plain
training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import example_inputs, tiny_model

import zoo
from zoo.generate import generate

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="CUDA is not available (the GPU path runs where it is: tools/gpu-check)")]
ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["decoder", "encoder", "encoder_decoder", "vit"]
NO_DROPOUT = ["dropout.embedding=0", "dropout.residual=0", "dropout.attention=0", "dropout.ffn=0"]


def loss_of(model, inputs):
    out = model(*inputs)
    if out.dim() == 2:  # ViT logits [B, classes]
        return F.cross_entropy(out.float(), torch.zeros(out.shape[0], dtype=torch.long, device=out.device))
    return F.cross_entropy(out.flatten(0, 1).float(), torch.zeros(out.shape[0] * out.shape[1], dtype=torch.long,
                                                                  device=out.device))


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_backward_under_bf16_autocast_matches_the_cpu(family):
    cpu = tiny_model(family, NO_DROPOUT)
    gpu = tiny_model(family, NO_DROPOUT).cuda()
    inputs = example_inputs(cpu)
    with torch.no_grad():
        want = cpu(*inputs)
        got = gpu(*[x.cuda() for x in inputs])
    torch.testing.assert_close(got.cpu(), want, rtol=1e-3, atol=1e-3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_of(gpu, [x.cuda() for x in inputs])
    loss.backward()
    grads = [p.grad for p in gpu.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    with torch.no_grad():
        assert abs(float(loss) - float(loss_of(cpu, inputs))) < 0.05


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_cached_generation_on_the_gpu_equals_the_uncached_forward(family):
    model = tiny_model(family).cuda().eval()
    inputs = [x.cuda() for x in example_inputs(model, batch=2, length=5)]
    if family == "decoder":
        out = generate(model, inputs[0], max_new_tokens=6)
        seq = inputs[0]
        for t in range(6):
            with torch.no_grad():
                nxt = model(seq)[:, -1].argmax(-1)
            assert torch.equal(out.tokens[:, t], nxt)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
    else:
        out = generate(model, inputs[0], max_new_tokens=6, num_beams=1, bos_id=1)
        tgt = torch.ones(2, 1, dtype=torch.long, device="cuda")
        for t in range(6):
            with torch.no_grad():
                nxt = model(inputs[0], tgt)[:, -1].argmax(-1)
            assert torch.equal(out.tokens[:, t], nxt)
            tgt = torch.cat([tgt, nxt[:, None]], dim=1)


@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_static_compiled_decoding_on_the_gpu_equals_the_dynamic_cache(family):
    """The compiled step as CUDA graphs (compile=True: reduce-overhead), greedy and beam 3, left
    padding for the decoder: the dynamic cache's tokens, without recompiling from step to step."""
    model = tiny_model(family, ["position.kind=rope"] if family == "decoder" else []).cuda().eval()
    x = example_inputs(model, batch=3, length=6)[0].cuda()
    mask = torch.ones_like(x, dtype=torch.bool)
    if family == "decoder":
        mask[1, :2] = False  # left padding
    else:
        mask[1, 4:] = False  # a source's right padding
    for beams in (1, 3):
        kw = dict(padding_mask=mask, max_new_tokens=8, num_beams=beams, bos_id=1)
        want = generate(model, x, **kw)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = generate(model, x, cache="static", compile=True, **kw)
        assert torch.equal(got.tokens, want.tokens)
        torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=1e-4)


def test_save_on_the_gpu_load_onto_it(tmp_path):
    model = tiny_model("decoder").cuda()
    zoo.save(model, tmp_path / "m.safetensors")
    back = zoo.load(tmp_path / "m.safetensors", device="cuda")
    assert next(back.parameters()).device.type == "cuda"
    for a, b in zip(model.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)


def _one_gpu_group():
    import torch.distributed as td

    if not td.is_initialized():
        td.init_process_group("nccl", rank=0, world_size=1, store=td.HashStore(), device_id=torch.device("cuda", 0))


def _train(model, steps: int = 3) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = [x.cuda() for x in example_inputs(tiny_model("decoder"))]
    out = []
    for _ in range(steps):
        loss = loss_of(model, inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(float(loss))
    return out


def test_ddp_and_fsdp_on_one_gpu_match_plain_training():
    from zoo.train import Dist, apply_fsdp, gathered

    _one_gpu_group()
    plain = _train(tiny_model("decoder", NO_DROPOUT).cuda())
    ddp = _train(torch.nn.parallel.DistributedDataParallel(tiny_model("decoder", NO_DROPOUT).cuda(), device_ids=[0]))
    model = tiny_model("decoder", NO_DROPOUT).cuda()
    apply_fsdp(model, Dist(rank=0, world_size=1, device=torch.device("cuda", 0)), precision="fp32")
    fsdp = _train(model)
    assert ddp == pytest.approx(plain, abs=1e-4) and fsdp == pytest.approx(plain, abs=1e-4)
    assert not any(type(m).__name__.startswith("FSDP") for m in gathered(model).modules())


def _recipe_data(recipe: str, root: Path) -> list[str]:
    """Data made here, so the GPU machine needs no data package (ImageNet-style: Fashion-MNIST)."""
    if recipe in ("lm", "mlm"):
        from test_lm_recipes import fake_wordnet

        return [f"data.wordnet_dir={fake_wordnet(root / 'wordnet')}"]
    if recipe == "translate":
        words = "one two three four five six seven eight nine ten".split()
        german = "eins zwei drei vier fünf sechs sieben acht neun zehn".split()
        (root / "pairs").mkdir()
        for split, n in (("train", 400), ("valid", 8), ("test", 8)):
            rows = [(i * 7 + j) % 10 for i in range(n) for j in range(3)]
            lines = [f"{' '.join(words[k] for k in rows[i * 3:i * 3 + 3])}\t{' '.join(german[k] for k in rows[i * 3:i * 3 + 3])}"
                     for i in range(n)]
            (root / "pairs" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return [f"data.path={root / 'pairs'}"]
    from test_imagenet_recipe import HAVE_FMNIST

    if not HAVE_FMNIST:
        pytest.skip("dataset-fashion-mnist is not installed (bash tools/install-data)")
    return []


@pytest.mark.parametrize("recipe,args", [
    ("lm", ["train.steps=3", "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2,block.attention.n_kv_heads=1]",
            "data.vocab_size=300", "train.block_len=16", "train.batch_size=4", "run.eval_every=3", "run.log_every=1",
            "sample.max_new_tokens=2"]),
    ("mlm", ["train.steps=3", "finetune.steps=2", "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2]",
             "data.vocab_size=300", "run.eval_every=3", "run.log_every=1"]),
    ("translate", ["train.steps=3", "train.minutes=null", "data.vocab_size=120",
                   "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2,block.ffn.hidden=64]",
                   "run.eval_every=3", "run.log_every=1", "decode.final_splits=[test]", "decode.max_len_b=4"]),
    ("imagenet", ["train.max_steps=3", "data.train_limit=256", "data.valid_limit=64",
                  "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2,block.ffn.hidden=64]"]),
])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_each_recipe_runs_on_the_gpu(recipe, args, strategy, tmp_path):
    # --defaults cpu: the recipe's CPU-sized defaults (its GPU layer has a test of its own, below)
    cmd = [sys.executable, str(ROOT / "recipes" / f"{recipe}.py"), "--defaults", "cpu", "run.device=cuda",
           f"run.out_dir={tmp_path / 'run'}", "run.progress=false", "run.plot=false", f"run.strategy={strategy}",
           *_recipe_data(recipe, tmp_path), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_recipe_under_its_gpu_layer(tmp_path):
    """The LM recipe on CUDA takes recipes/lm.gpu.yaml under the user's keys: compiled, attention left
    to zoo and torch, said in its first line; shrunk here by keys the user sets."""
    cmd = [sys.executable, str(ROOT / "recipes" / "lm.py"), f"run.out_dir={tmp_path / 'run'}", "run.progress=false",
           "run.plot=false", *_recipe_data("lm", tmp_path), "train.steps=3", "data.vocab_size=300",
           "model_overrides=[d_model=32,n_layers=1,block.attention.n_heads=2,block.attention.n_kv_heads=1]",
           "train.block_len=64", "train.batch_size=4", "run.eval_every=3", "sample.max_new_tokens=2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("gpu-defaults (lm.gpu.yaml;"), first
    assert "run.compile=true" in first and "run.attention=default" in first and "block_len" not in first
