"""Files written all at once: a crash or an error leaves the old file or the new one, never half of one.

    with atomic_write(path) as f:        # a binary file object ("w" for text)
        torch.save(obj, f)
    with atomic_path(path) as tmp:       # for writers that want a file name (safetensors' save_file)
        save_file(tensors, str(tmp))
    atomic_write_text(path, text)

The data goes to a temporary file in the target's folder, is flushed to disk, and is renamed over
the target only when writing succeeded; on any error the temporary file is removed and the target
is untouched. The result gets the permissions of the file it replaces, or of a new file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_path", "atomic_write", "atomic_write_text", "file_mode"]


def file_mode(path: Path) -> int:
    """The permissions a new file at ``path`` gets: an existing file's, else 0o666 less the umask
    (temporary files are created private; the renamed result should not be)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; when the block ends without an error, the file
    written there is flushed to disk and renamed over ``path``. The folder must exist."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None) -> Iterator[IO]:
    """A file object (``mode`` "wb" or "w") whose content replaces ``path`` when the block ends
    without an error; on an error ``path`` is left as it was."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write writes a whole new file: mode 'wb' or 'w', not {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding) as f:
        yield f


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text``, atomically; returns the path."""
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)
