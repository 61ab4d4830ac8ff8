"""One local fleet per data dir: `provisioner up` holds an exclusive lock on a file in the data dir
for as long as it runs, with its pid and command line written in it, so that a second `up` on the
same data dir can say who runs it and exit (instead of standing by behind the first one's cluster
leases, as a `serve cluster` replica rightly does)."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

LOCK_FILE = "up.lock"


class DataDirTaken(Exception):
    pass


def lock_data_dir(data_dir: Path) -> int:
    """Takes the data dir's lock for this process (kept until it exits); raises DataDirTaken
    naming the holder if another process has it."""
    path = Path(data_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise DataDirTaken(f"the data dir {data_dir} is in use by {holder}: stop it first, "
                           "or give this fleet another --data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} ({' '.join(sys.argv)})\n".encode(), 0)
    return fd
