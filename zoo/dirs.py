"""Where zoo keeps what it makes once and reads again: one cache directory."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """``$ZOO_CACHE_DIR``, else ``$XDG_CACHE_HOME/zoo``, else ``~/.cache/zoo``: the data caches' and
    the measured kernel choices' directory."""
    if os.environ.get("ZOO_CACHE_DIR"):
        return Path(os.environ["ZOO_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zoo"
