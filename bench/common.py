"""Timing and FLOP counting shared by the benchmarks.

Every comparison times all sides in ONE process, alternating between them, after warm-up, and
reports medians over repeats: ratios from one run are the only numbers worth comparing.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from zoo.kernels.cpu.linear import onednn_available, onednn_linear

MALLOC = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"


@dataclass
class Side:
    """One contender: ``step()`` runs one unit of work (a training step, a forward, a generation)."""

    name: str
    step: Callable[[], object]


@dataclass
class Row:
    """A measured workload: seconds per step for each side, work per step, FLOPs per step."""

    workload: str
    precision: str
    unit: str  # what ``work`` counts: images, tokens, sentences
    work: float  # units per step
    seconds: dict[str, float] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)  # (max - min) / median over repeats
    flops: float | None = None  # per step, the same for every side (counted on zoo's model)
    extra: dict[str, object] = field(default_factory=dict)

    def throughput(self, side: str) -> float:
        return self.work / self.seconds[side]

    def ratio(self, side: str = "zoo", peer: str | None = None) -> float:
        """zoo's throughput over the peer's (> 1: zoo is faster)."""
        peer = peer or next(s for s in self.seconds if s != side)
        return self.seconds[peer] / self.seconds[side]

    def mfu(self, side: str, peak: float | None) -> float | None:
        if self.flops is None or not peak:
            return None
        return self.flops / self.seconds[side] / peak


def here() -> torch.device:
    """Where the workloads run: torch's default device (``python -m bench --device cuda`` sets it)."""
    return torch.get_default_device()


def sync(device: torch.device | str | None = None) -> None:
    if torch.device(device or here()).type == "cuda":
        torch.cuda.synchronize()


def compare(sides: list[Side], *, warmup: int = 2, repeats: int = 5, inner: int = 1,
            device: str | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per step of each side, timed alternately (the order rotates each repeat)."""
    for side in sides:
        for _ in range(warmup):
            side.step()
        sync(device)
    times: dict[str, list[float]] = {s.name: [] for s in sides}
    for r in range(repeats):
        order = sides[r % len(sides):] + sides[: r % len(sides)]
        for side in order:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                side.step()
            sync(device)
            times[side.name].append((time.perf_counter() - t0) / inner)
    medians = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: (max(v) - min(v)) / medians[k] for k, v in times.items()}
    return medians, spread


def count_flops(fn: Callable[[], object]) -> float:
    """FLOPs of one call of ``fn``, counted by torch's FlopCounterMode with SDPA on its math kernel
    (the counter does not see the CPU flash kernel; the math kernel's matmuls are the same work)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        fn()
    return float(counter.get_total_flops())


def matmul_peak(dtype: torch.dtype, n: int = 4096, repeats: int = 5, device: str | None = None) -> float:
    """Best-of-``repeats`` FLOP/s of an n x n x n matmul: the machine's ceiling for MFU. On CPU the best
    of torch's matmul (MKL for fp32) and oneDNN's, since either may be the faster GEMM there."""
    device = str(torch.device(device or here()).type)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    kernels = [lambda: a @ b]
    if device == "cpu" and onednn_available():
        kernels.append(lambda: onednn_linear(a, b))
    best = float("inf")
    for kernel in kernels:
        kernel()
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            kernel()
            sync(device)
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def machine() -> dict[str, object]:
    """What the numbers were measured on, and how busy it was."""
    info: dict[str, object] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "malloc": os.environ.get("GLIBC_TUNABLES", "default"),
    }
    try:
        info["loadavg_1min"] = os.getloadavg()[0]
    except OSError:  # pragma: no cover
        pass
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
