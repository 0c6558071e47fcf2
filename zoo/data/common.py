"""What every data module shares: one error type and strict UTF-8 line readers (a file, stdin)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["DataError", "read_lines", "stdin_lines"]


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


def stdin_lines(stream: Any) -> Iterator[str]:
    """The lines of the text stream ``stream`` (stdin), their ends dropped, each checked to be UTF-8:
    bytes read from its ``buffer`` where it has one, else its text without the lone surrogates that
    stand for undecodable bytes (Python's ``surrogateescape``), which a tokenizer cannot take. An
    undecodable line is a DataError naming it, before anything is done with it."""
    raw = getattr(stream, "buffer", None)
    for n, line in enumerate(raw if raw is not None else stream, start=1):
        try:
            text = line.decode("utf-8") if isinstance(line, bytes) else line
            text.encode("utf-8")
        except UnicodeError as e:
            raise DataError(f"stdin:{n}: not valid UTF-8 (column {e.start + 1}); re-encode the input as UTF-8") from None
        yield text.rstrip("\r\n")
