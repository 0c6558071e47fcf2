"""CPU kernel choices measured on the machine itself, once per shape class, and remembered.

Where two kernels compute the same thing and which one is faster depends on the CPU (MKL's fp32 GEMM
runs at half oneDNN's speed on AMD Zen 5 and at the same speed on Zen 4; on Intel CPUs it is MKL's own
home), a rule by vendor is wrong somewhere. :func:`pick` times each candidate the first time a shape
class is seen (best of a few runs, a few milliseconds to a second for the largest classes) and keeps
the faster, in memory and in a per-machine cache file, so later processes on the machine (and a
resumed run) make the same choice without timing anything.

The cache: the kernel policy's ``cache`` (``ZOO_KERNEL_CACHE``: a file path; ``off`` keeps choices in
memory only), by default ``<cache dir>/kernels-<machine>.json`` (``$ZOO_CACHE_DIR``, else
``~/.cache/zoo``), where ``<machine>`` hashes the CPU model, its flags, the torch version and the
thread count at the time (a choice made with 2 threads says nothing about 16). It is JSON,
``{"machine": ..., "choices": {"op/shape class": {"pick": name, "seconds": {name: s}}}}``, written
atomically; an unreadable file is set aside and measured afresh. Timing never touches torch's global
random generator (a resumed run draws what the uninterrupted one drew) and runs outside any
dispatch mode (a FLOP counter counts the model, not the timing) and without autocast. Processes of
a distributed run time nothing (ranks timing at once would disturb each other and could choose
apart): they use the cached choice where the machine has one, else the default. Callers ask
:func:`pick` on every call: a known choice is one dictionary lookup.

A training checkpoint records the choices its run used (:func:`record`) and a resume on the same
machine takes them back (:func:`adopt`) before its first step, so it computes exactly what the
uninterrupted run did even where the cache file changed in between (deleted, or re-measured by
another run). On another machine the choices are this machine's own: its kernels differ anyway.
The kernel policy (:mod:`zoo.kernels.policy`: ``ZOO_CPU_LINEAR`` / ``ZOO_CPU_ATTENTION``) pins the kernels outright.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import platform
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from zoo.dirs import cache_dir

__all__ = ["adopt", "cache_path", "choices", "forget", "known", "machine", "pick", "pow2", "record", "step"]

_MARGIN = 0.1
_memory: dict[str, dict] = {}  # the choices this process has made or used (what a checkpoint records)
_disk: dict[str, dict] = {}  # the cache file's, as last read
_loaded_from: Path | None = None


@functools.cache
def _cpu() -> str:
    """The CPU model and a digest of its flags (read once)."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f.read(1 << 16).splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = hashlib.sha256(" ".join(sorted(value.split())).encode()).hexdigest()[:8]
    except OSError:
        pass
    return f"{model} | flags {flags or '?'}"


def machine(threads: int | None = None) -> str:
    """The CPU model, a digest of its flags, the torch version and the thread count (now, or
    ``threads``): a choice made with 2 threads says nothing about 1, so a torchrun rank with fewer
    threads than its parent shell reads the file that ``zoo kernels --measure --threads N`` wrote."""
    return f"{_cpu()} | torch {torch.__version__} | {threads or torch.get_num_threads()} threads"


def cache_path() -> Path | None:
    """Where choices persist (None: the kernel policy's ``cache`` is ``off``, memory only): the
    policy's file (``ZOO_KERNEL_CACHE``), else ``kernels-<machine>.json`` in :func:`zoo.dirs.cache_dir`."""
    from zoo.kernels.policy import policy

    setting = policy().cache
    if setting.lower() == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    digest = hashlib.sha256(machine().encode()).hexdigest()[:16]
    return cache_dir() / f"kernels-{digest}.json"


def _entry_ok(entry: object) -> bool:
    """A cache entry as :func:`pick` writes it: the kernel's name and the seconds of each candidate."""
    if not isinstance(entry, dict) or not isinstance(entry.get("pick"), str):
        return False
    seconds = entry.get("seconds", {})
    return isinstance(seconds, dict) and all(isinstance(k, str) and type(v) in (int, float) and math.isfinite(v) and v >= 0
                                             for k, v in seconds.items())


def _load(path: Path) -> dict[str, dict]:
    """The cache file's choices for this machine; a damaged file or entry is left out with a warning
    naming the file (the classes it held are measured afresh), never an error."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("machine") != machine() or not isinstance(data.get("choices"), dict):
            return {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"zoo kernel cache {path} unreadable ({e}); measuring afresh", stacklevel=3)
        return {}
    good = {k: v for k, v in data["choices"].items() if isinstance(k, str) and _entry_ok(v)}
    bad = [k for k in data["choices"] if k not in good]
    if bad:
        warnings.warn(f"zoo kernel cache {path}: {len(bad)} damaged entr{'y' if len(bad) == 1 else 'ies'} ignored "
                      f"({', '.join(map(str, bad[:3]))}{', ...' if len(bad) > 3 else ''}); measured afresh when needed",
                      stacklevel=3)
    return good


def _on_disk() -> dict[str, dict]:
    global _loaded_from
    path = cache_path()
    if path is not None and _loaded_from != path:
        _disk.clear()
        _disk.update(_load(path))
        _loaded_from = path
    return _disk


def choices() -> dict[str, dict]:
    """Every choice this process knows: the cache file's and those it made or took (these win)."""
    return {**_on_disk(), **_memory}


def forget() -> None:
    """Drop the choices in memory (the cache file stays): the next :func:`pick` reads it again."""
    global _loaded_from
    _memory.clear()
    _disk.clear()
    _loaded_from = None


def record() -> dict:
    """The choices this process has used, for a checkpoint: ``{"machine": ..., "picks": {key: name}}``."""
    return {"machine": machine(), "picks": {k: v["pick"] for k, v in sorted(_memory.items())}}


def adopt(saved: dict | None) -> bool:
    """Take back the choices a checkpoint recorded (:func:`record`) where it was written on this
    machine (True); elsewhere, or without a record (an older checkpoint), nothing changes (False).
    A recorded kernel that is not a candidate any more is measured afresh when its class comes up."""
    if not isinstance(saved, dict) or saved.get("machine") != machine() or not isinstance(saved.get("picks"), dict):
        return False
    for key, name in saved["picks"].items():
        if isinstance(name, str):
            _memory[key] = {"pick": name, "seconds": {}, "from": "checkpoint"}
    return True


def _save(key: str, entry: dict) -> None:
    path = cache_path()
    if path is None:
        return
    from zoo.atomic import atomic_write_text

    merged = _load(path)  # another process may have added classes since this one read the file
    merged[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"machine": machine(), "choices": merged}, indent=1, sort_keys=True) + "\n")
    except OSError as e:  # a read-only home: the choice still holds for this process
        warnings.warn(f"zoo kernel cache {path} not written ({e}); choices stay in memory", stacklevel=3)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm: first-call setup (oneDNN primitives, allocations) is not the kernel's speed
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def step(fn: Callable[..., object], inputs: Callable[[], tuple[tuple, torch.Tensor]], training: bool) -> Callable[[], None]:
    """A candidate for :func:`pick`: ``fn(*args)`` on the ``(args, grad)`` that ``inputs()`` gives, and
    with ``training`` the backward pass of its output with ``grad`` (pick times under no_grad)."""

    def call() -> None:
        args, grad = inputs()
        with torch.enable_grad() if training else torch.no_grad():
            out = fn(*args)
            if training:
                out.backward(grad)

    return call


def pow2(n: int) -> int:
    """``n`` rounded up to a power of two: how shape classes round their sizes."""
    return 1 << max(0, (n - 1).bit_length())


def known(op: str, shape_class: str) -> str | None:
    """The kernel this process already uses for ``op`` at ``shape_class``, or None (then :func:`pick`)."""
    entry = _memory.get(f"{op}/{shape_class}")
    return None if entry is None else entry["pick"]


def pick(op: str, shape_class: str, candidates: dict[str, Callable[[], object]], *, repeats: int = 3) -> str:
    """The name of the fastest of ``candidates`` (each a call that runs that kernel on inputs of the
    shape class) for ``op`` at ``shape_class``: remembered, else measured now and remembered. The first
    candidate is the default: another replaces it only when at least ``_MARGIN`` faster (best-of-3
    timings on a 2-core machine swing by ~10%; the choices this exists for differ by 2x)."""
    key = f"{op}/{shape_class}"
    known = _memory.get(key)
    if known is None and (known := _on_disk().get(key)) is not None and known["pick"] in candidates:
        _memory[key] = known
    if known is not None and known["pick"] in candidates:
        return known["pick"]
    if _distributed():  # ranks timing at once would disturb each other and might choose apart: the default
        _memory[key] = {"pick": next(iter(candidates)), "seconds": {}}  # this process only, never saved
        return _memory[key]["pick"]
    from torch.utils._python_dispatch import _disable_current_modes

    # as the kernels run in a model (a timed call may come from inside an autocast region, whose casts
    # would change what is timed and reach the backward pass, which autocast never covers)
    with torch.no_grad(), _disable_current_modes(), torch.autocast("cpu", enabled=False):
        seconds = {name: _time(fn, repeats) for name, fn in candidates.items()}
    first = next(iter(candidates))
    best = min(seconds, key=seconds.get)
    winner = best if seconds[best] < (1 - _MARGIN) * seconds[first] else first
    entry = {"pick": winner, "seconds": {k: round(v, 7) for k, v in seconds.items()}}
    _memory[key] = entry
    _save(key, entry)
    return winner
