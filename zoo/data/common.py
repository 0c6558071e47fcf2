"""What every data module shares: one error type and a strict UTF-8 line reader."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DataError", "read_lines"]


class DataError(ValueError):
    """Unusable data; the message names the file, the line and the fix."""


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file; a missing file or an undecodable byte is a DataError naming
    the file (and the line)."""
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{lineno}: not valid UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
    return text.splitlines()
