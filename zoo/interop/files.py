"""Converting files on disk: the ``zoo convert`` command's work, usable from Python too.

    convert(src, dst, to=None, dtype=None, architecture=None, timm_model=None, max_shard_size="5GB") -> Converted

``src`` is one of

    a zoo .safetensors file (written by ``zoo.save``)    -> an HF or timm directory at ``dst``
      (or the index of one saved in shards)
    an HF directory (config.json + weights)             -> a zoo .safetensors file at ``dst``
    a timm directory (config.json with "architecture")  -> a zoo .safetensors file at ``dst``
    a timm .safetensors checkpoint + ``timm_model``      -> a zoo .safetensors file at ``dst``

An HF directory is what ``save_pretrained`` writes: ``config.json`` and ``model.safetensors``, or
shards and their ``model.safetensors.index.json``. Between zoo files and HF directories nothing is
loaded whole: both models are built on the meta device and the tensors converted one at a time
(:mod:`zoo.interop.hf.stream`), so a checkpoint converts in a fraction of its size in memory; a
written file larger than ``max_shard_size`` is sharded (zoo: ``m-00001-of-0000n.safetensors`` and
``m.safetensors.index.json``; HF: as ``save_pretrained``). A directory converts as the
class its ``config.json`` names in ``architectures`` where that converts (a backbone such as
``LlamaModel`` becomes a zoo model with ``head: none``), else as its ``model_type``'s class with the
head. A directory with only ``pytorch_model.bin`` is read whole, with ``from_pretrained(...,
local_files_only=True)``. A timm directory is what ``timm``'s ``save_for_hf`` writes
(``config.json`` with the model name and its ``model_args``, weights in ``model.safetensors``);
``timm.create_model("local-dir:DIR", pretrained=True)`` reads the ones written here. Nothing is
ever downloaded. An HF checkpoint that lacks a tensor of the reference class (a ``BertModel``
whose config names no class, read as ``BertForMaskedLM``) is refused rather than completed with random values; tensors the
class does not read (BERT's pooler and next-sentence head) are left out and listed in ``ignored``;
a multi-token-prediction module (DeepSeek-V3's layer past the last) is refused by name unless the
caller passes ``skip_mtp``, then listed there too. A multimodal directory (Llama 4's ``Llama4ForConditionalGeneration``: Scout, Maverick) is refused
unless ``architecture`` names its text model's class (``Llama4ForCausalLM``): then the text model
(``language_model.*``, its config ``text_config``) converts, its vision tower and projector are
listed in ``ignored``, and the zoo file converts back to a ``Llama4ForCausalLM`` directory. gpt-oss's
MXFP4 release weights are read dequantized (:mod:`zoo.interop.hf.mxfp4`); any other
``quantization_config`` is refused by name.

A sentence-transformers directory (``modules.json``: a transformer, its pooling, perhaps a
normalisation) converts as its transformer, and the zoo file keeps how it embeds in its metadata
(:mod:`zoo.interop.sentence`, ``zoo.embedding``), which ``zoo embed`` reads; a text tower's (CLIP's,
SigLIP's) records its own pooled output (pooling ``pooler``). An HF directory's
tokenizer and generation files (``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, ``generation_config.json``, ``chat_template.jinja``) are copied beside
the zoo file, where ``zoo generate``, ``zoo embed`` and the recipes read them
(:class:`zoo.tokens.ModelTokenizer`; one already there that differs is kept, and said so in
``notes``), and from beside a zoo file into the HF directory written from it, so that HF's
``AutoTokenizer`` reads the folder.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from zoo.build import count_parameters
from zoo.embed import Settings
from zoo.interop.claims import claims_family
from zoo.interop.common import ConversionError, check_counted, check_mtp
from zoo.interop.hf import ARCHS, TEXT_MODELS, by_model_type, from_hf
from zoo.interop.hf.mxfp4 import quantization
from zoo.interop.hf.stream import NotStreamable, hf_dir_to_zoo, zoo_to_hf_dir
from zoo.interop.sentence import read_sentence_transformers
from zoo.interop.timm import ARCHS as TIMM_ARCHS
from zoo.interop.timm import arch_for_spec as timm_arch_for_spec
from zoo.interop.timm import from_timm, to_timm
from zoo.io import load, read_header, read_spec, save
from zoo.shards import DEFAULT_MAX_SHARD_SIZE, parse_size, resolve
from zoo.tokens import SIDECARS, TOKENIZER

__all__ = ["Converted", "convert", "copy_sidecars", "TIMM_LAYERNORM_EPS"]

TIMM_LAYERNORM_EPS = 1e-6  # timm's ViT builds its LayerNorms with this eps when the config names none
TIMM_WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Converted:
    """What :func:`convert` wrote: ``kind`` 'zoo', 'hf' or 'timm', the class converted, the path."""

    kind: str
    reference: str
    path: Path
    parameters: int
    ignored: tuple[str, ...] = ()  # source tensors the reference class does not read (another task's head)
    notes: tuple[str, ...] = ()  # what else was read or written (a tokenizer copied, embedding settings)


def _is_zoo_file(path: Path) -> bool:
    return "zoo.spec" in read_header(path).metadata


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: not a JSON object")
    return data


def _fresh_dir(dst: Path) -> None:
    if dst.suffix == ".safetensors":
        raise ConversionError(f"cannot write {str(dst)!r}: a zoo file converts to a directory (config.json + model.safetensors); "
                              f"name a directory")
    if dst.exists() and not dst.is_dir():
        raise ConversionError(f"cannot write the directory {str(dst)!r}: a file of that name exists")
    if dst.is_dir() and any(dst.iterdir()):
        raise ConversionError(f"cannot write into {str(dst)!r}: the directory is not empty (its files would mix with the new ones)")
    if not dst.parent.is_dir():
        raise ConversionError(f"cannot write {str(dst)!r}: no directory {str(dst.parent)!r}")


# ------------------------------------------------------------------------------------- zoo -> reference
def timm_model_args(spec, architecture: str | None = None) -> tuple[str, dict]:
    """The timm model name (the class's ``base_model``) and JSON-able ``model_args`` that rebuild,
    with ``timm.create_model``, the model :func:`to_timm` builds of the class ``architecture`` names
    (default: the first that expresses ``spec``)."""
    arch = timm_arch_for_spec(spec, architecture)
    kwargs = arch.express(spec)
    if spec.block.norm.kind != "layernorm":
        raise ConversionError(f"zoo -> timm directory: block.norm.kind={spec.block.norm.kind!r} is not supported: timm's "
                              f"saved-model config records no norm layer (convert in Python with zoo.interop.to_timm instead)")
    eps = spec.block.norm.eps
    if eps != TIMM_LAYERNORM_EPS:
        raise ConversionError(
            f"zoo -> timm directory: block.norm.eps={eps!r} is not supported: timm's saved-model config cannot "
            f"record a LayerNorm eps, and timm builds its ViT with {TIMM_LAYERNORM_EPS} "
            f"(convert in Python with zoo.interop.to_timm instead)"
        )
    del kwargs["norm_layer"]
    for key in [k for k, v in kwargs.items() if callable(v)]:  # a class (mlp_layer=SwiGLU) is no JSON
        raise ConversionError(f"zoo -> timm directory: timm's {key} cannot be recorded in its saved-model config "
                              f"(convert in Python with zoo.interop.to_timm instead)")
    if "class_token" in kwargs:  # Beit always has one and takes no such argument
        kwargs["class_token"] = bool(kwargs["class_token"])
    return arch.base_model, kwargs


def _to_timm_dir(model: nn.Module, dst: Path, dtype: torch.dtype | None, architecture: str | None) -> Converted:
    from safetensors.torch import save_file

    _fresh_dir(dst)
    name, args = timm_model_args(model.spec, architecture)  # refuse before any work
    ref = to_timm(model, architecture)
    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous() for k, v in ref.state_dict().items()}
    s = model.spec
    config = {
        "architecture": name,
        "num_classes": s.num_classes,
        "num_features": s.d_model,
        "global_pool": args["global_pool"],
        "model_args": args,
        "pretrained_cfg": {
            "input_size": [s.in_channels, s.image_size, s.image_size], "fixed_input_size": not s.dynamic_size,
            "num_classes": s.num_classes, "first_conv": timm_arch_for_spec(s, architecture).first_conv, "classifier": "head",
        },
    }
    dst.mkdir(exist_ok=True)
    save_file(state, str(dst / TIMM_WEIGHTS), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return Converted("timm", type(ref).__name__, dst, count_parameters(ref))


# ------------------------------------------------------------------------------------- reference -> zoo
def _hf_arch(src: Path, config: dict, architecture: str | None = None):
    model_type = config.get("model_type")
    multimodal = {t: (name, text) for name, (t, text, _) in TEXT_MODELS.items()}
    if model_type in multimodal:  # the text model alone, asked for by name (its vision tower is not converted)
        name, text = multimodal[model_type]
        if architecture != text:
            raise ConversionError(f"{src}: {name} holds a vision tower and a projector, which zoo does not convert; "
                                  f"architecture={text!r} (--architecture {text}) converts its text model alone")
        return ARCHS[text]
    if architecture is not None:
        raise ConversionError(f"{src} is not a zoo file, so it converts to zoo; --to and --architecture apply to zoo files "
                              f"(and --architecture to a multimodal HF directory's text model)")
    arch = by_model_type(model_type, config.get("architectures"))  # LlamaModel named: the backbone, else the LM
    if arch is None:
        named = ", ".join(config.get("architectures") or []) or "no architectures listed"
        raise ConversionError(f"{src}: model_type {model_type!r} ({named}) does not convert; supported: {', '.join(ARCHS)}")
    return arch


def _saved_names(src: Path) -> list[str]:
    """The tensor names an HF directory's weights hold (an index's, a safetensors file's, a pytorch_model.bin's)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (src / index).is_file():
            return list(_read_json(src / index).get("weight_map", {}))
    if (src / "model.safetensors").is_file():
        from safetensors import safe_open

        with safe_open(str(src / "model.safetensors"), "pt") as f:
            return list(f.keys())
    if (src / "pytorch_model.bin").is_file():
        return list(torch.load(src / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True))
    return []


def _load_hf_dir(src: Path, skip_mtp: bool = False) -> nn.Module:
    """An HF directory read whole (weights only in ``pytorch_model.bin``)."""
    import transformers

    config = _read_json(src / "config.json")
    arch = _hf_arch(src, config)
    cls = getattr(transformers, arch.name)
    mxfp4 = quantization(config, config.get("model_type"), str(src))  # any other packed format refused

    def read(**kwargs):
        try:
            return cls.from_pretrained(str(src), local_files_only=True, output_loading_info=True, **kwargs)
        except OSError as e:
            raise ConversionError(f"{src}: cannot read the model: {str(e).splitlines()[0]}") from None
        except RuntimeError as e:  # tensors of other shapes than config.json's; transformers' report is logged, not raised
            if "ignore_mismatched_sizes" not in str(e) or kwargs.get("ignore_mismatched_sizes"):
                raise
            reason = str(e).splitlines()[0]
        model, info = read(**kwargs, ignore_mismatched_sizes=True)
        unexpected = info.get("unexpected_keys") or []
        check_counted(set(model.state_dict()) - set(info.get("missing_keys") or []), unexpected, config, str(src))
        wrong = [f"{key} is {list(disk)}, config.json makes {list(made)}" for key, disk, made in sorted(info.get("mismatched_keys") or [])]
        shown = ", ".join(wrong[:3]) + (f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else "")
        raise ConversionError(f"{src}: the checkpoint's tensors do not fit its config.json ({arch.name}): {shown or reason}; "
                              f"is config.json the one these weights were saved with?")

    model, info = read(**({"quantization_config": transformers.Mxfp4Config(dequantize=True)} if mxfp4 else {}))
    mtp = arch.mtp_names(model.config, _saved_names(src))  # from_pretrained leaves some out of unexpected_keys
    check_mtp(mtp, skip_mtp, arch.name, str(src))
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(set(info.get("unexpected_keys") or []) - set(mtp))
    check_counted(set(model.state_dict()) - set(missing), unexpected, config, str(src))
    saved = arch.saved_init_kwargs((set(model.state_dict()) - set(missing)) | set(unexpected))
    if missing and saved and saved != arch.saved_init_kwargs(model.state_dict()):  # saved without a part (BertModel's pooler)
        model, info = read(**saved)
        missing, unexpected = sorted(info.get("missing_keys") or []), sorted(info.get("unexpected_keys") or [])
    if missing:  # from_pretrained fills missing tensors with random values; never convert those
        shown = ", ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
        raise ConversionError(f"{src}: the weights do not fit {arch.name}: it has no {shown} "
                              f"(the directory holds {', '.join(config.get('architectures') or ['another model'])})")
    return model.eval(), [*unexpected, *sorted(mtp)]  # other heads (BERT's pooler, NSP), a skipped MTP module


def _timm_from_state(name: str, args: dict, weights: Path, where: str) -> nn.Module:
    import timm
    from safetensors.torch import load_file

    try:
        model = timm.create_model(name, pretrained=False, **args)
    except RuntimeError as e:  # timm's 'Unknown model (...)'
        raise ConversionError(f"{where}: {e}") from None
    state = load_file(str(weights))
    want = {key: tuple(t.shape) for key, t in model.state_dict().items()}
    missing, unexpected = sorted(want.keys() - state.keys()), sorted(state.keys() - want.keys())
    if missing or unexpected:
        raise ConversionError(f"{where}: the weights do not fit timm's {name!r}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    wrong = [n for n in want if tuple(state[n].shape) != want[n]]
    if wrong:
        key = wrong[0]
        raise ConversionError(f"{where}: the weights do not fit timm's {name!r}: {key} is {tuple(state[key].shape)} in the file, "
                              f"{want[key]} in the model ({len(wrong)} tensors differ; a timm directory's config.json "
                              f"can give the sizes as model_args)")
    model.load_state_dict(state)
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    return model.to(dtypes.pop() if len(dtypes) == 1 else torch.float32).eval()


def _load_timm_dir(src: Path) -> nn.Module:
    config = _read_json(src / "config.json")
    weights = src / TIMM_WEIGHTS
    if not weights.is_file():
        raise ConversionError(f"{src}: a timm directory needs its weights in {TIMM_WEIGHTS}")
    return _timm_from_state(config["architecture"], dict(config.get("model_args") or {}), weights, str(src))


# ---------------------------------------------------------------------------------------------- public
def convert(src: str | Path, dst: str | Path, *, to: str | None = None, dtype: torch.dtype | None = None,
            architecture: str | None = None, timm_model: str | None = None,
            max_shard_size: int | str | None = DEFAULT_MAX_SHARD_SIZE, skip_mtp: bool = False) -> Converted:
    """Convert the model in ``src`` and write it to ``dst`` (see the module's docstring).

    ``to`` ('hf' or 'timm') picks the target of a zoo file (default: timm for a family a timm class
    claims, a ViT, else HF), ``architecture`` the HF or timm class (default: the first that expresses
    the spec, as :func:`zoo.interop.to_hf` and :func:`zoo.interop.to_timm`; a timm class means a
    timm target; of an HF directory holding a multimodal model, the class of its text model, which
    alone converts: ``Llama4ForCausalLM`` for a ``Llama4ForConditionalGeneration``), ``dtype`` casts
    the written floating-point tensors, ``timm_model`` names the timm model a bare timm
    checkpoint holds (``vit_tiny_patch16_224``), and ``max_shard_size`` (bytes, or "5GB", "500MB";
    None: no limit) is the size above which a written zoo file or HF checkpoint is sharded.
    ``skip_mtp`` converts an HF checkpoint without its multi-token-prediction module (DeepSeek-V3's
    ``model.layers.61.*`` with ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head``; Qwen3-Next's
    ``mtp.*``), which neither HF's class nor zoo holds: without it such a checkpoint is refused,
    naming the tensors; with it they are left out and listed in ``ignored``.
    """
    src, dst, ignored = resolve(src), Path(dst), []
    if to not in (None, "hf", "timm"):
        raise ConversionError(f"unknown target {to!r}; choose hf or timm")
    if not src.exists():
        raise ConversionError(f"{str(src)!r}: no such file or directory")
    parse_size(max_shard_size)  # a bad size fails before any work
    if src.is_file() and _is_zoo_file(src):
        if timm_model is not None:
            raise ConversionError(f"{src} is a zoo file; --timm-model names the model of a timm checkpoint being read")
        family = read_spec(src).family
        timm_family = any(claims_family(a.claims, family) for a in TIMM_ARCHS.values())
        target = to or ("timm" if architecture in TIMM_ARCHS or (architecture is None and timm_family) else "hf")
        if target == "timm":
            if architecture is not None and architecture not in TIMM_ARCHS:
                raise ConversionError(f"{architecture!r} is not a timm class; a timm target takes {', '.join(TIMM_ARCHS)}")
            return _to_timm_dir(load(src).eval(), dst, dtype, architecture)
        if architecture in TIMM_ARCHS:
            raise ConversionError(f"{architecture!r} is a timm class; an HF target takes an HF class")
        _fresh_dir(dst)
        done = zoo_to_hf_dir(src, dst, architecture=architecture, dtype=dtype, max_shard_size=max_shard_size)
        return Converted("hf", done.reference, done.path, done.parameters, notes=copy_sidecars(src.parent, dst, replace=True))

    if to is not None or (architecture is not None and not src.is_dir()):  # a directory's: _hf_arch
        raise ConversionError(f"{src} is not a zoo file, so it converts to zoo; --to and --architecture apply to zoo files")
    if not dst.parent.is_dir():  # before reading: a big model takes a while
        raise ConversionError(f"cannot write {str(dst)!r}: no directory {str(dst.parent)!r}")
    metadata, notes, hf_read = None, (), False
    if src.is_dir():
        sentence = read_sentence_transformers(src)
        if sentence is not None:
            src, metadata = sentence.transformer, sentence.settings.metadata()
            notes = (f"embeds with {sentence.settings.describe()} (from modules.json; zoo embed reads it)",)
        if not (src / "config.json").is_file():
            raise ConversionError(f"{src}: not a model directory (no config.json)")
        config = _read_json(src / "config.json")
        if "model_type" in config:
            arch = _hf_arch(src, config, architecture)
            if metadata is None and getattr(arch, "pooled", False):  # a text tower: zoo embed gives its pooled output
                metadata = Settings(pooling="pooler").metadata()
                notes = ("embeds with its pooled output (pooler pooling; zoo embed reads it)",)
            try:
                done = hf_dir_to_zoo(src, dst, arch, dtype=dtype, max_shard_size=max_shard_size,
                                     metadata=metadata, skip_mtp=skip_mtp)
                return Converted("zoo", done.reference, done.path, done.parameters, done.ignored,
                                 notes + copy_sidecars(src, done.path.parent))
            except NotStreamable:
                ref, ignored = _load_hf_dir(src, skip_mtp)
                model, hf_read = from_hf(ref), True
        elif "architecture" in config:
            if architecture is not None:
                raise ConversionError(f"{src} is not a zoo file, so it converts to zoo; --to and --architecture apply to zoo files")
            ref = _load_timm_dir(src)
            model = from_timm(ref)
        else:
            raise ConversionError(f"{src}/config.json names neither an HF model_type nor a timm architecture")
    elif timm_model is not None:
        ref = _timm_from_state(timm_model, {}, src, str(src))
        model = from_timm(ref)
    else:
        raise ConversionError(f"{src} has no zoo spec; for a timm checkpoint name its model with --timm-model NAME, "
                              f"or pass an HF model directory")
    path = save(model, dst, dtype=dtype, max_shard_size=max_shard_size, metadata=metadata)
    copied = copy_sidecars(src, Path(path).parent) if hf_read else ()
    return Converted("zoo", type(ref).__name__, Path(path), count_parameters(model), tuple(ignored), notes + copied)


def copy_sidecars(src: Path, dst: Path, *, replace: bool = False) -> tuple[str, ...]:
    """The tokenizer's and generation's files in the folder ``src`` (:data:`zoo.tokens.SIDECARS`) copied
    into the folder ``dst``; what was done, as notes (none without such files). A file already in
    ``dst`` that differs is another model's and kept, unless ``replace`` (a new HF folder: its
    ``generation_config.json``, written from the spec, gives way to the model's own, with its eos ids)."""
    copied, notes = [], []
    for name in SIDECARS:
        found, target = src / name, dst / name
        if not found.is_file() or found.resolve() == target.resolve():
            continue
        if target.exists() and target.read_bytes() == found.read_bytes():
            notes.append(f"{target} is already the model's {'tokenizer' if name == TOKENIZER else name}")
            continue
        if target.exists() and not replace:
            what = "another tokenizer" if name == TOKENIZER else f"another {name}"
            notes.append(f"kept {target}, which is {what}; the model's is {found}"
                         + (" (zoo embed --tokenizer)" if name == TOKENIZER else ""))
            continue
        shutil.copyfile(found, target)
        copied.append(name)
    if copied:
        notes.insert(0, f"copied {', '.join(copied)} from {src} to {dst}")
    return tuple(notes)
