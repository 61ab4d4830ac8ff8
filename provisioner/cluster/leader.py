"""Only one replica of a cluster provisioner acts: it holds the cluster's lease.

With PostgreSQL the lease is a session advisory lock on a connection of its own: the server
releases it the moment that connection ends, so when the leader dies a standby polling once a
second takes over within about a second. With SQLite (one machine) it is an exclusive lock on
a file next to the database. A leader that loses its lease (its connection broke) must stop
acting at once; a new leader waits out a grace period first, so the two never overlap.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import zlib
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

POLL_S = 1.0
# A new leader waits this long before acting: a deposed leader notices within one POLL_S.
GRACE_S = 2.0 * POLL_S
NAMESPACE = 0x70726F7600000000  # the advisory lock keys of this system: "prov" in the high bytes


class Lease(Protocol):
    # Whether a new holder must wait before acting: a lease freed by the database may belong to
    # a leader that is alive and has not yet noticed it lost it.
    grace: bool

    def try_acquire(self) -> bool: ...

    def held(self) -> bool:
        """Whether the lease is still ours (checked against the database)."""
        ...

    def release(self) -> None: ...


# Bounds how long a partition goes unnoticed on the lease's connection, on both ends: here, an
# unacknowledged SELECT 1 fails within 2 s (and the leader exits); at the server, keepalives
# end the session, freeing the lock, after about 4 s of silence. The leader so stops first.
PARTITION_BOUNDS = dict(keepalives=1, keepalives_idle=2, keepalives_interval=1, keepalives_count=2,
                        tcp_user_timeout=2000,
                        options="-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=2")


def lock_key(cluster: str) -> int:
    return (NAMESPACE | zlib.crc32(cluster.encode())) - (1 << 63)  # a signed 64-bit key


class PostgresLease:
    grace = True

    def __init__(self, url: str, cluster: str):
        import psycopg

        self._psycopg = psycopg
        self.url, self.key = url, lock_key(cluster)
        self._db = None

    def try_acquire(self) -> bool:
        try:
            if self._db is None or self._db.closed:
                self._db = self._psycopg.connect(self.url, autocommit=True, connect_timeout=5, **PARTITION_BOUNDS)
            return bool(self._db.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0])
        except self._psycopg.OperationalError as e:
            log.warning("lease: cannot reach the database: %s", e)
            self._db = None
            return False

    def held(self) -> bool:
        # A session-level advisory lock lasts as long as the session: alive means still ours.
        try:
            return self._db is not None and self._db.execute("SELECT 1").fetchone()[0] == 1
        except self._psycopg.Error:
            return False

    def release(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class FileLease:
    grace = False  # the kernel frees the lock only when its holder is dead

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def held(self) -> bool:
        return self._fd is not None  # the kernel keeps a file lock until the process ends

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def acquire(lease: Lease, cluster: str) -> None:
    """Waits until this process holds the lease, then out the grace period if the lease has one:
    even a lease taken at once may have been freed a moment ago."""
    if not lease.try_acquire():
        log.info("cluster %s: another replica leads; standing by", cluster)
        while not lease.try_acquire():
            await asyncio.sleep(POLL_S)
    if lease.grace:
        log.info("cluster %s: holding the lease; acting in %.0f s", cluster, GRACE_S)
        await asyncio.sleep(GRACE_S)


async def watch(lease: Lease, cluster: str) -> None:
    """Returns when the lease is lost."""
    while lease.held():
        await asyncio.sleep(POLL_S)
    log.critical("cluster %s: lost the lease; another replica may act now", cluster)
