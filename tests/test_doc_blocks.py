"""Every code block the README and docs/ show runs as written, in a fresh folder, one doc at a time:
its Python blocks in order in one namespace (a block whose first line is ``# name.py`` or
``# name.yaml`` is a file the doc has the reader write), its shell commands, and its ``console``
blocks, whose shown output must appear in what the command prints.

A block that cannot run here says so in the doc, in an HTML comment just above it (unseen when the
doc is rendered)::

    <!-- doc-test
    skip: trains for ~10 minutes (the shrunk run: tests/test_lm_recipes.py)
    replace: device="cuda" => device="cpu"
    setup: lm_run
    -->

``skip: REASON`` leaves out the block's commands, except the quick ones (``--print-config`` and
``--help`` always run); on a Python block, ``skip`` needs a ``replace`` (the shrunk form that runs).
``replace: A => B`` runs the block with ``A`` replaced by ``B``; ``setup: NAME`` first runs one of the
SETUPS below, which writes the files the block reads (a run's outputs, a local checkpoint folder).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import zoo
from zoo.registry import REGISTRIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
QUICK = ("--print-config", "--help")


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    code: str
    skip: str | None = None
    replace: list[tuple[str, str]] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)

    def shrunk(self) -> str:
        code = self.code
        for old, new in self.replace:
            assert old in code, f"{self.doc}:{self.line}: replace {old!r}: not in the block"
            code = code.replace(old, new)
        return code


def blocks(path: Path) -> list[Block]:
    """The python, bash, console and yaml blocks of one doc, with the doc-test comment above each."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, i, marker = [], 0, None
    name = str(path.relative_to(ROOT))
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- doc-test"):
            end = next(j for j in range(i, len(lines)) if lines[j].rstrip().endswith("-->"))
            marker = "\n".join(lines[i:end + 1])[len("<!-- doc-test"):-3]
            i = end + 1
            continue
        m = re.match(r"^```(\w*)\s*$", line)
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if m.group(1) in ("python", "bash", "console", "yaml"):
                block = Block(name, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n")
                for key, value in re.findall(r"^\s*(skip|replace|setup):\s*(.+?)\s*$", marker or "", flags=re.M):
                    if key == "skip":
                        block.skip = value
                    elif key == "replace":
                        old, sep, new = value.partition(" => ")
                        assert sep, f"{name}:{i + 1}: a replace reads `old => new`"
                        block.replace.append((old, new))
                    else:
                        block.setup.append(value)
                found.append(block)
            elif marker:
                pytest.fail(f"{name}:{i + 1}: a doc-test comment above a {m.group(1) or 'plain'} block")
            marker, i = None, end + 1
            continue
        if line.strip():
            marker = None  # a comment counts only just above its block
        i += 1
    return found


def commands(script: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comment lines dropped."""
    joined = re.sub(r"[ \t]*\\\n\s*", " ", script)
    return [c for c in (line.strip() for line in joined.splitlines()) if c and not c.startswith("#")]


IN_PROCESS = ("average", "convert", "generate", "inspect", "list", "presets", "show", "summary")  # zoo commands without global state


def _in_process(command: str) -> subprocess.CompletedProcess | None:
    """A plain ``zoo COMMAND ...`` line (no pipes, redirects, globs or variables) run by ``zoo.cli.main``
    in this process (the test's cwd is the doc's folder), as the console script would run it, without
    a new interpreter's start-up (seconds per command); None for any other command."""
    from zoo.cli import main

    try:
        argv = shlex.split(command, comments=True)
    except ValueError:
        return None
    if len(argv) < 2 or argv[0] != "zoo" or argv[1] not in IN_PROCESS or re.search(r"[|<>;&$*?`]", command.split("#")[0]):
        return None
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv[1:])
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    done = _in_process(command)
    if done is not None:
        assert Path.cwd() == cwd
        return done
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "recipes")]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    command = re.sub(r"^python\b", sys.executable, command)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def run_shell(block: Block, cwd: Path) -> None:
    for command in commands(block.shrunk()):
        if block.skip and not any(q in command for q in QUICK):
            continue
        done = _shell(command, cwd)
        assert done.returncode == 0, f"{block.doc}:{block.line}: `{command}` failed:\n{done.stderr[-2000:]}"


def run_console(block: Block, cwd: Path) -> None:
    """``$ command`` then the output it shows; a ``...`` line stands for any lines."""
    first, *shown = block.shrunk().rstrip("\n").split("\n")
    assert first.startswith("$ "), f"{block.doc}:{block.line}: a console block starts with `$ command`"
    done = _shell(first[2:], cwd)
    assert done.returncode == 0, f"{block.doc}:{block.line}: `{first[2:]}` failed:\n{done.stderr[-2000:]}"
    printed = [line.rstrip() for line in done.stdout.splitlines()]
    at = 0
    for want in (line.rstrip() for line in shown):
        if want == "...":
            continue
        hits = [j for j in range(at, len(printed)) if printed[j] == want]
        assert hits, f"{block.doc}:{block.line}: `{first[2:]}` does not print {want!r} (after line {at}):\n{done.stdout}"
        at = hits[0] + 1


def run_doc(path: Path, cwd: Path) -> None:
    namespace: dict = {"__name__": "__docs__"}
    for block in blocks(path):
        for name in block.setup:
            SETUPS[name](cwd)
        file = re.fullmatch(r"# ([\w.-]+\.(py|ya?ml))", block.code.splitlines()[0])
        if file and block.lang in ("python", "yaml"):  # a file the doc has the reader write
            (cwd / file.group(1)).write_text(block.code, encoding="utf-8")
        elif block.lang == "yaml":
            continue  # a spec or config shown as an example (the spec reference and their tests check them)
        elif block.lang == "python":
            assert not block.skip or block.replace, f"{block.doc}:{block.line}: a skipped Python block needs a shrunk form"
            code = compile(block.shrunk(), f"{block.doc}:{block.line}", "exec", dont_inherit=True)
            exec(code, namespace)  # noqa: S102 (the doc's own code)
        elif block.lang == "bash":
            run_shell(block, cwd)
        else:
            run_console(block, cwd)


# ----------------------------------------------------------------------------------- set-ups
def _tokenizer(folder: Path) -> int:
    """A small byte-level BPE with the text recipes' special tokens, saved as ``folder/tokenizer.json``."""
    from zoo.data import bpe
    from zoo.data.text import SPECIALS

    text = ["a person who sells goods", "the act of running", "a small dog", "move quickly"] * 20
    tok = bpe.train_bpe(text, 300, specials=SPECIALS, min_frequency=1)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


def _lm_run(cwd: Path) -> None:
    """What recipes/lm.py exports, at a tiny size: runs/lm/model/{model.safetensors, tokenizer.json}."""
    out = cwd / "runs" / "lm" / "model"
    vocab = _tokenizer(out)
    zoo.save(zoo.build("llama-tiny", [f"vocab_size={vocab}"], seed=0), out / "model.safetensors")


def _mlm_run(cwd: Path) -> None:
    """What recipes/mlm.py's fine-tuning exports: runs/mlm/finetune/model/{model.safetensors, tokenizer.json}."""
    out = cwd / "runs" / "mlm" / "finetune" / "model"
    vocab = _tokenizer(out)
    zoo.save(zoo.build("bert-mini", [f"vocab_size={vocab}", "classifier.num_labels=4"], seed=0), out / "model.safetensors")


def _convert_inputs(cwd: Path) -> None:
    """The files docs/interop.md's commands read: a local HF GPT-2 folder, zoo files of a Llama and a
    ViT, and a timm ViT-Tiny state dict, all at small sizes."""
    import timm
    import transformers
    from safetensors.torch import save_file

    config = transformers.GPT2Config(vocab_size=120, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                      bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(cwd / "gpt2-local")
    zoo.save(zoo.build("llama-tiny", ["n_layers=2", "vocab_size=128"], seed=0), cwd / "my-llama.safetensors")
    zoo.save(zoo.build("vit-tiny-16", ["n_layers=2"], seed=0), cwd / "vit.safetensors")
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, str(cwd / "vit_tiny.safetensors"))


def _hf_llama(cwd: Path) -> None:
    """What docs/quickstart.md converts: ./my-llama-hf, a small HF Llama folder as downloaded (config,
    weights, generation_config.json with a list of eos ids, tokenizer.json)."""
    import transformers

    folder = cwd / "my-llama-hf"
    vocab = _tokenizer(folder)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=[2, 3])
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


def _sentence_model(cwd: Path) -> None:
    """What docs/guide.md's commands read: a tiny sentence-transformers directory ./my-sentence-model
    (BertModel, a WordPiece tokenizer.json, mean pooling, normalised) and sentences.txt."""
    import json

    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    folder, text = cwd / "my-sentence-model", ["a cat sat on the mat", "the dog ran in the park", "the park is green"]
    folder.mkdir()
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(text, trainers.WordPieceTrainer(vocab_size=60, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.save(str(folder / "tokenizer.json"))
    transformers.BertModel(transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=4, intermediate_size=48, max_position_embeddings=64,
                                                   architectures=["BertModel"])).save_pretrained(folder)
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    (folder / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
                                                     for i, (path, kind) in enumerate(kinds)]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
    (cwd / "sentences.txt").write_text("\n".join(text) + "\n")


def _my_yaml(cwd: Path) -> None:
    """A user's layer over a recipe's defaults, as docs/training.md shows it."""
    (cwd / "my.yaml").write_text("optim: {lr: 5.0e-4}\n", encoding="utf-8")


def _my_model(cwd: Path) -> None:
    (cwd / "configs").mkdir(exist_ok=True)
    (cwd / "configs" / "my-model.yaml").write_text("family: decoder\nd_model: 64\nn_layers: 2\n", encoding="utf-8")


SETUPS = {"hf_llama": _hf_llama, "lm_run": _lm_run, "mlm_run": _mlm_run, "convert_inputs": _convert_inputs, "my_yaml": _my_yaml,
          "my_model": _my_model, "sentence_model": _sentence_model}


# ------------------------------------------------------------------------------------- tests
@pytest.mark.docs
@pytest.mark.slow
@pytest.mark.parametrize("doc", [d for d in DOCS if blocks(d)], ids=lambda d: str(d.relative_to(ROOT)))
def test_doc_runs_as_written(doc, tmp_path, monkeypatch):
    for shared in ("recipes", "tools"):
        (tmp_path / shared).symlink_to(ROOT / shared)
    saved = {name: (dict(r._specs), dict(r._builders)) for name, r in REGISTRIES.items()}
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    try:
        run_doc(doc, tmp_path)
    finally:
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(tmp_path)):
                del sys.modules[name]
        for name, (specs, builders) in saved.items():
            r = zoo.registry(name)
            r._specs.clear(), r._specs.update(specs)
            r._builders.clear(), r._builders.update(builders)


def test_every_skip_says_why_and_names_its_shrunk_run():
    """A skipped block names why; where it names a test that runs its shrunk form, that test exists."""
    for doc in DOCS:
        for block in blocks(doc):
            if block.skip:
                assert len(block.skip) > 10, f"{block.doc}:{block.line}: skip needs a reason, got {block.skip!r}"
                for test in re.findall(r"tests/[\w/]+\.py", block.skip):
                    assert (ROOT / test).exists(), f"{block.doc}:{block.line}: skip names {test}, which does not exist"
            for name in block.setup:
                assert name in SETUPS, f"{block.doc}:{block.line}: no set-up named {name!r} (known: {sorted(SETUPS)})"


def test_commands_split_as_a_shell_reads_them():
    script = "zoo a \\\n   --b 1   # two lines\n# a comment\n\nzoo c\n"
    assert commands(script) == ["zoo a --b 1   # two lines", "zoo c"]
    assert _in_process("zoo schema > out.json") is None and _in_process("zoo average runs/ckpt-*.pt -o a") is None
    assert _in_process("zoo show gpt2-small | head") is None and _in_process("python -m zoo show gpt2-small") is None
    shown = _in_process("zoo show gpt2-small --set n_layers=3   # a comment")
    assert shown.returncode == 0 and "n_layers: 3" in shown.stdout
    assert shutil.which("bash"), "the doc commands run in bash"
