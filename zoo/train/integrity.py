"""Whether a checkpoint is whole before anything reads it: a ``ckpt-<step>.pt`` file or a sharded
``ckpt-<step>.dcp`` folder (zoo.train.checkpoint).

    problem = checkpoint_problem(path)     # None, or what is missing: ".metadata", "__1_0.distcp", ...
    check_checkpoint(path)                 # raises CheckpointError naming the checkpoint and what is missing

Checkpoints are written under a temporary name and renamed, so a crash never leaves a half one under
a checkpoint's name; what these checks find is damage after the fact (a partial copy, a deleted or
cut file). They read no tensors: a ``.pt`` file (a ``torch.save`` zip archive) is whole when its
central directory, written last at its end, is there; a folder when it holds ``train_state.pt``
(whole), DCP's ``.metadata`` (readable) and every shard file ``.metadata`` names, each as long as
the bytes ``.metadata`` records in it.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from zoo.train.errors import CheckpointError

__all__ = ["TRAIN_STATE", "check_checkpoint", "checkpoint_problem"]

TRAIN_STATE = "train_state.pt"  # a sharded checkpoint's step, counters, RNG, schedule, config and spec


def _archive_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist()):
                return f"{path.name} is a zip archive but not a torch.save file"
    except (zipfile.BadZipFile, OSError, EOFError):
        size = path.stat().st_size if path.exists() else 0
        return f"{path.name} is cut short or not a torch.save file ({size:,} bytes, no zip directory at its end)"
    return None


def _shards_problem(path: Path) -> str | None:
    import torch.distributed.checkpoint as dcp

    try:
        storage = dcp.FileSystemReader(str(path)).read_metadata().storage_data
    except Exception as e:  # noqa: BLE001 - a cut or foreign .metadata fails in pickle's own ways
        return f"its .metadata cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'cut short'})"
    ends: dict[str, int] = {}
    for info in (storage or {}).values():
        name = getattr(info, "relative_path", None)
        if name is not None:
            ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
    missing = sorted(name for name in ends if not (path / name).is_file())
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        return f"it is incomplete: shard file{'s' * (len(missing) > 1)} {', '.join(missing[:3])}{more} missing"
    for name, end in sorted(ends.items()):
        size = os.path.getsize(path / name)
        if size < end:
            return f"it is incomplete: shard file {name} is cut short ({size:,} of {end:,} bytes)"
    return None


def _is_safetensors(path: Path) -> bool:
    """Whether ``path`` starts as a safetensors file does: an 8-byte header length, then a JSON object."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") <= path.stat().st_size


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """What keeps ``path`` from being a whole checkpoint (a phrase naming the missing or cut part:
    ``it is incomplete: no .metadata in the folder``), or None when it is whole. A folder is a sharded checkpoint, anything else a ``.pt`` file."""
    path = Path(path)
    if not path.exists():
        return "it does not exist"
    if not path.is_dir():
        return _archive_problem(path)
    missing = [name for name in (".metadata", TRAIN_STATE) if not (path / name).is_file()]
    if missing:
        return f"it is incomplete: no {' and no '.join(missing)} in the folder"
    return _archive_problem(path / TRAIN_STATE) or _shards_problem(path)


def check_checkpoint(path: str | os.PathLike) -> Path:
    """``path``, after :func:`checkpoint_problem` finds it whole; else a :class:`CheckpointError` that
    names it and what is missing."""
    path = Path(path)
    problem = checkpoint_problem(path)
    if problem == "it does not exist":
        raise CheckpointError(f"no checkpoint at {str(path)!r}")
    if problem is not None and _is_safetensors(path):  # a good file of another kind: never advise deleting it
        raise CheckpointError(f"{str(path)!r} is a model file (safetensors, as zoo.save writes): weights only, no optimizer "
                              "state or step, so a run cannot continue from it; resume from a training checkpoint "
                              "(a ckpt-*.pt file or ckpt-*.dcp folder in run.out_dir)")
    if problem is not None:
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {problem}; delete it, or use another checkpoint")
    return path
