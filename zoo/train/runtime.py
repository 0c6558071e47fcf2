"""Process-level settings that make CPU training fast and steady.

glibc's default malloc hands large freed blocks back to the OS and maps every big tensor afresh,
so each training step pays page faults for its activations (10-40% slower on CPU, noisy).
:func:`tune_malloc` keeps freed memory in the process, as
``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736`` would, but at
run time; it is a no-op on other C libraries and platforms.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

__all__ = ["tune_malloc", "attention_kernels"]

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameter numbers


def tune_malloc(trim_threshold: int = 64 << 30) -> bool:
    """Never trim the heap below ``trim_threshold`` bytes and never mmap big blocks. True if applied."""
    if not sys.platform.startswith("linux") or os.environ.get("ZOO_NO_MALLOC_TUNING"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    threshold = min(trim_threshold, 2**31 - 1)  # an int in mallopt's signature
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, threshold))


def attention_kernels(choice: str = "default") -> contextlib.AbstractContextManager:
    """A context choosing how attention is computed (``run.attention``), through the kernel policy
    (:mod:`zoo.kernels.policy`): ``default`` leaves it as the policy has it (the structured masks'
    ``auto``: blocked on CPU and FlexAttention on CUDA where a window or packed documents bound the
    keys enough, else SDPA); ``dense``, ``blocked``, ``flex`` force that backend for the structured
    masks (``zoo.kernels.use(attention=...)``); ``math``, ``flash``, ``efficient`` force one SDPA
    kernel on dense masks, zoo's own CPU attention included (``attention=dense`` and
    ``cpu_attention=sdpa``, with torch's ``sdpa_kernel``)."""
    from zoo.kernels import use

    if choice == "default":
        return contextlib.nullcontext()
    if choice in ("dense", "blocked", "flex"):
        return use(attention=choice)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    if choice not in backends:
        raise ValueError(f"attention kernel {choice!r}: use default, dense, blocked, flex, {', '.join(backends)}")
    stack = contextlib.ExitStack()
    stack.enter_context(use(attention="dense", cpu_attention="sdpa"))
    stack.enter_context(sdpa_kernel(backends[choice]))
    return stack
