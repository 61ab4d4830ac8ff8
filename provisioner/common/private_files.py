"""Files only the service's own user may read.

A data dir holds the audit log, every session and user id, the spans of every request and the
local fleet's keys; other local users must not read any of it. New directories are 0700 and new
files 0600 whatever the process's umask, and a data dir found open is closed again.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | Path) -> Path:
    """Makes `path` (and missing parents, with the same mode) and leaves it 0700."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def create_private(path: str | Path) -> None:
    """Creates `path` empty and 0600 if it does not exist (a library then opens it by name:
    SQLite gives its journal files the database file's mode)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE))


def open_private(path: str | Path, mode: str = "ab"):
    """`open(path, mode)` for appending or writing, creating the file 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, FILE_MODE), mode)
