"""How long the test suite and its fast lane take on this machine: each tier run once, in a child
process, as a newcomer types it; the wall time, the tests' counts and the machine written to a JSON
file that the README's testing section is generated from (docs/make_docs.py, ``suite-times``).

    python -m bench.suite                         # both tiers, each on every core (pyproject's -n auto)
    python -m bench.suite --tiers fast -o /tmp/t.json

Time it on an idle machine: other processes on the cores slow both tiers alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.common import machine

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"fast": ["-m", "not slow"], "full": []}


def cpu_family_model() -> str:
    """``family F model M`` from /proc/cpuinfo (the CPU's generation, which its name may not say)."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if not line.strip():
                break
    except OSError:
        return "unknown"
    return f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


def counts(summary: str) -> dict[str, int]:
    """pytest's last line (``2895 passed, 29 skipped in 579.12s``) as numbers by outcome."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed)", summary)}


def run_tier(name: str, log: Path) -> dict:
    """One tier's wall time and counts; a failing tier's whole pytest output goes to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TIERS[name]]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    failed = [line.split()[1] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    if proc.returncode != 0:
        log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return {"command": "python -m pytest -q " + " ".join(f'"{a}"' if " " in a else a for a in TIERS[name]),
            "seconds": round(seconds, 1), "returncode": proc.returncode, **counts(lines[-1] if lines else ""),
            **({"not_passed": failed} if failed else {}), **({"log": str(log)} if proc.returncode != 0 else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", nargs="+", choices=list(TIERS), default=list(TIERS))
    parser.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "suite-times.json"))
    args = parser.parse_args(argv)
    info = {**machine(), "cpu_generation": cpu_family_model()}
    tiers = {}
    for name in args.tiers:
        tiers[name] = run_tier(name, Path(args.output).with_suffix(f".{name}.log"))
        print(f"{name}: {tiers[name]}", flush=True)
    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": info, "tiers": tiers}
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0 if all(t["returncode"] == 0 for t in tiers.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
