"""Shared helpers: tiny specs of every family, seeded; the one launcher of child processes and
torchrun; gettext catalogs written with Babel.

Test tiers (markers, pyproject.toml): ``slow`` (seconds each: recipe runs, torchrun, the docs'
commands, wide reference sweeps), ``torchrun`` (launches processes with torch.distributed.run),
``recipe`` (runs a recipe script end to end) and ``docs`` (runs what the docs show). torchrun and
recipe tests are slow too (marked here, at collection). ``python -m pytest -q -m "not slow"`` is the
fast lane; ``python -m pytest -q`` runs everything."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo

# measured kernel choices (zoo.kernels.cpu.choose) stay in each test process's memory: the suite
# writes nothing under the user's home, and every run measures what it uses
os.environ.setdefault("ZOO_KERNEL_CACHE", "off")
# the CPU attention kernel by its length rule, not by timing: the tests of each kernel know which ran
# (tests/test_kernels.py tests the measured choice itself)
os.environ.setdefault("ZOO_CPU_ATTENTION", "rule")

ROOT = Path(__file__).resolve().parents[1]

# pytest-xdist (pyproject's ``-n auto``) runs a worker process per core: each computes on its share of
# the cores, so two workers' thread pools do not fight over the same two
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_collection_modifyitems(items):
    """A test launching processes or running a recipe end to end is slow: off the fast lane."""
    for item in items:
        if item.get_closest_marker("torchrun") or item.get_closest_marker("recipe"):
            item.add_marker(pytest.mark.slow)


def covering(*dims: list, strength: int = 2) -> set[tuple]:
    """A few combinations of ``dims``' values among which every ``strength`` values of as many dims
    occur together (a covering array; greedy, deterministic): every pair (strength 2) or triple (3)
    of choices is tested at a fraction of the full cross product's cost."""
    groups = list(itertools.combinations(range(len(dims)), strength))

    def tuples(c: tuple) -> set:
        return {(g, tuple(c[i] for i in g)) for g in groups}

    candidates = list(itertools.product(*dims))
    uncovered = set().union(*map(tuples, candidates))
    chosen: set[tuple] = set()
    while uncovered:
        best = max(candidates, key=lambda c: len(tuples(c) & uncovered))
        chosen.add(best)
        uncovered -= tuples(best)
    return chosen


def pairwise(*dims: list) -> set[tuple]:
    """Combinations holding every pair of two dims' values together: the fast lane's share."""
    return covering(*dims, strength=2)


# ------------------------------------------------------------------------ child processes
def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: unbuffered, one thread per process (two torchrun ranks
    share the 2 cores), no torchrun variables inherited from a launcher around pytest, and the
    repository and its recipes importable."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "recipes")] + [p for p in [env.get("PYTHONPATH")] if p])
    return {**env, **extra}


def launch_command(script: Path | str, args: list[str], processes: int = 1) -> list[str]:
    """``python script args`` for one process, ``python -m torch.distributed.run --standalone`` for more."""
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [*launcher, str(script), *args]


def launch(script: Path | str, args: list[str], processes: int = 1, *, timeout: float = 300, check: bool = True,
           **env: str) -> subprocess.CompletedProcess:
    """Run ``script`` (a recipe: ``ROOT / "recipes" / "lm.py"``) on ``processes`` processes from the
    repository root; with ``check``, a failure shows the end of its output."""
    proc = subprocess.run(launch_command(script, args, processes), cwd=ROOT, env=child_env(**env), capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


TINY = ["d_model=32", "n_layers=2", "block.attention.n_heads=4", "block.ffn.hidden=48"]
TEXT_TINY = TINY + ["vocab_size=61", "max_seq_len=32"]
FAMILY_PRESET = {"decoder": "gpt2-small", "encoder": "bert-base", "encoder_decoder": "transformer-base", "vit": "vit-tiny-16"}
VIT_TINY = TINY + ["image_size=16", "patch_size=4", "head.num_classes=7", "in_channels=3"]


def tiny_overrides(family: str) -> list[str]:
    return VIT_TINY if family == "vit" else TEXT_TINY


def tiny_spec(family: str, extra: list[str] = ()):
    """A small spec of ``family`` from its preset, with ``extra`` overrides."""
    return zoo.load_spec(FAMILY_PRESET[family], tiny_overrides(family) + list(extra))


def tiny_model(family: str, extra: list[str] = (), seed: int = 0):
    return zoo.build(tiny_spec(family, extra), seed=seed)


def example_inputs(model, batch: int = 3, length: int = 9, seed: int = 0) -> tuple:
    """Positional inputs for ``model`` (tokens, or src+tgt, or images)."""
    g = torch.Generator().manual_seed(seed)
    spec = model.spec
    if spec.family == "vit":
        return (torch.randn(batch, spec.in_channels, spec.image_size, spec.image_size, generator=g),)
    tokens = torch.randint(0, spec.vocab_size, (batch, length), generator=g)
    if spec.family == "encoder_decoder":
        return (torch.randint(0, spec.src_vocab_size, (batch, length + 2), generator=g), tokens)
    return (tokens,)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _kernel_policy():
    """Each test's ``zoo.kernels.use(...)`` changes end with the test."""
    before = zoo.kernels.use()
    yield
    before.restore()


# ------------------------------------------------------------------- against reference models
@pytest.fixture
def aten_linears(monkeypatch):
    """fp32 linears on ATen, as the reference models' are, so a comparison is not off by oneDNN's
    summation order (``pytestmark = pytest.mark.usefixtures("aten_linears")``)."""
    zoo.kernels.use(cpu_linear="aten")  # the autouse _kernel_policy puts it back


def randomize(model: torch.nn.Module, seed: int = 0, *, buffers: tuple[str, ...] = ()) -> torch.nn.Module:
    """Every parameter random, 1-D weights (norms, layer scales) around 1, so a swapped or dropped
    tensor shows; Marian's fixed sinusoids (frozen) kept; ``buffers`` named here randomized too. In eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name or p.requires_grad:  # BART's learned tables are randomized
                base = 1.0 if p.dim() == 1 and name.endswith(("weight", "gamma")) else 0.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name in buffers:
                b.copy_(0.2 * torch.randn(b.shape, generator=g))
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor | None = None) -> float:
    """The largest absolute difference, over the ``real`` positions only where given."""
    assert a.shape == b.shape
    d = (a - b).abs()
    return (d[real] if real is not None else d).max().item()


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch, as zoo computes them (HF takes them as an argument)."""
    return (mask.long().cumsum(1) - 1).clamp(min=0)


# ------------------------------------------------------------------------- message catalogs
def assert_greedy_equals_hf(model, hf, prompt: torch.Tensor, mask: torch.Tensor | None, new_tokens: int) -> None:
    """zoo's cached greedy decoding of ``prompt`` (``mask``: True = real token, None = all real) equals
    HF's ``generate`` for ``new_tokens`` tokens, run to the full length on both sides (no eos)."""
    hf.generation_config.eos_token_id = None
    attention = torch.ones_like(prompt) if mask is None else mask.long()
    ours = zoo.generate(model, prompt, padding_mask=mask, max_new_tokens=new_tokens).tokens
    theirs = hf.generate(prompt, attention_mask=attention, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs[:, prompt.shape[1]:])


def write_catalog(path: Path, entries, *, charset: str = "utf-8") -> Path:
    """A compiled catalog of ``entries``: (msgid, msgstr) or (msgid, msgstr, context)."""
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    cat = Catalog(locale="de", charset=charset)
    for entry in entries:
        cat.add(entry[0], entry[1], context=entry[2] if len(entry) > 2 else None)
    buf = io.BytesIO()
    write_mo(buf, cat)
    path.write_bytes(buf.getvalue())
    return path


NOUNS = ["file", "folder", "device", "printer", "network", "window", "archive", "server", "user", "key"]
VERBS = ["open", "remove", "copy", "find", "create", "lock", "mount", "save", "check", "rename"]
DE_NOUNS = ["Datei", "Ordner", "Gerät", "Drucker", "Netzwerk", "Fenster", "Archiv", "Server", "Benutzer", "Schlüssel"]
DE_VERBS = ["öffnen", "entfernen", "kopieren", "finden", "erstellen", "sperren", "einhängen", "speichern", "prüfen",
            "umbenennen"]


def messages(prefix: str) -> list[tuple[str, str]]:
    """100 distinct message pairs, plus near-duplicates of some (other placeholders, digits, case)."""
    out = []
    for v, dv in zip(VERBS, DE_VERBS):
        for n, dn in zip(NOUNS, DE_NOUNS):
            out.append((f"{prefix} cannot {v} {n} %s", f"{prefix} kann {dn} %s nicht {dv}"))
    out += [("Cannot open file {path} (error 2)", "Kann Datei {path} nicht öffnen (Fehler 2)"),
            ("cannot OPEN file %s: error 17", "kann Datei »%1$s« nicht öffnen: Fehler 17")]
    return out
