"""Only one replica of a cluster provisioner acts: it holds the cluster's lease.

With PostgreSQL the lease is a session advisory lock on a connection of its own: the server
releases it the moment that connection ends, so when the leader dies a standby polling once a
second takes it. With SQLite (one machine) it is an exclusive lock on a file next to the
database.

A lease held in a database has a term: the leader may act for TERM_S after the last moment it
confirmed holding the lock (the moment it sent a check that the server answered). A check that
fails (the database restarting, a moment of partition) is not a loss while the term lasts: the
leader reconnects and takes the lock again, and carries on if it has it before the term ends.
It stops (the process exits) once its term has run out without that. A new holder waits
GRACE_S after taking the lock before it acts. Why the two never overlap:

- The lock was confirmed ours at some moment after the check was sent (c), so the server freed
  it after c, and another replica took it at some t > c; it acts from t + GRACE_S.
- We act until at most c + TERM_S plus how late the watch notices (bounded by WATCH_LATE_S).
  With TERM_S + WATCH_LATE_S <= GRACE_S, c + TERM_S + WATCH_LATE_S < t + GRACE_S.
- Taking the lock again within the term: whoever took it meanwhile (at t > c) let it go again
  before we had it, at a time before c + TERM_S < t + GRACE_S, so before it would have acted.

Both durations are measured on monotonic clocks of different machines, whose rates differ by
parts per million. The cost: a standby takes over a dead leader GRACE_S after the lock is freed.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
import zlib
from pathlib import Path
from typing import Callable, Protocol

log = logging.getLogger(__name__)

POLL_S = 1.0
# While the lease is unconfirmed, checks come this often: a database back is noticed at once.
RECHECK_S = 0.25
# How long a leader acts on since its last confirmed check: a PostgreSQL restart (a few seconds)
# and the reconnect after it fit in it. Longer than the store's ride-out (store/outage.py).
TERM_S = 8.0
# How late the watch may notice the term's end: it waits for no check past the term, but the
# event loop may be busy for a moment.
WATCH_LATE_S = 1.0
# A new leader waits this long before acting (see the module's docstring).
GRACE_S = TERM_S + WATCH_LATE_S
NAMESPACE = 0x70726F7600000000  # the advisory lock keys of this system: "prov" in the high bytes


class Lease(Protocol):
    # Whether a new holder must wait before acting: a lease freed by the database may belong to
    # a leader that is alive and has not yet noticed it lost it.
    grace: bool

    def try_acquire(self) -> bool: ...

    def held(self) -> bool:
        """Whether the lease is still ours (checked against the database, which may block for
        a network round trip: called in a thread). A lease that can be taken again is."""
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
        self._locked = False  # whether this session took the lock

    def try_acquire(self) -> bool:
        try:
            if self._db is None or self._db.closed:
                self._db = self._psycopg.connect(self.url, autocommit=True, connect_timeout=5, **PARTITION_BOUNDS)
            self._locked = bool(self._db.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0])
            return self._locked
        except self._psycopg.OperationalError as e:
            log.warning("lease: cannot reach the database: %s", e)
            self.release()
            return False

    def held(self) -> bool:
        # A session-level advisory lock lasts as long as the session: alive means still ours.
        # A session lost (a database restart) is reopened and the lock taken again, if it is free.
        try:
            if self._locked and self._db is not None and not self._db.closed:
                return self._db.execute("SELECT 1").fetchone()[0] == 1
        except self._psycopg.Error as e:
            log.warning("lease: the check failed: %s", e)
            self.release()
        return self.try_acquire()

    def release(self) -> None:
        self._locked = False
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
            # Wall time on purpose, as every wait and term here: the database frees the lock in real time.
            await asyncio.sleep(POLL_S)
    if lease.grace:
        log.info("cluster %s: holding the lease; acting in %.0f s", cluster, GRACE_S)
        await asyncio.sleep(GRACE_S)


async def watch(lease: Lease, cluster: str, now: Callable[[], float] = time.monotonic) -> None:
    """Returns when the lease is lost: its term has run out since the last confirmed check
    (module docstring). `now`: a monotonic clock, in seconds: wall time on purpose, as the term is
    measured against the database's session, never model time."""
    confirmed = now()
    while True:
        sent = now()
        left = confirmed + TERM_S - sent
        try:  # no wait past the term: a check that hangs (a partition) does not stretch it
            held = left > 0 and await asyncio.wait_for(asyncio.to_thread(lease.held), left)
        except asyncio.TimeoutError:
            held = False
        if held:
            if sent - confirmed > POLL_S + RECHECK_S:
                log.warning("cluster %s: the lease is confirmed again after %.1f s", cluster, sent - confirmed)
            confirmed = sent
        elif now() >= confirmed + TERM_S:
            break
        else:
            log.warning("cluster %s: cannot confirm the lease; leading for %.1f s more at most",
                        cluster, confirmed + TERM_S - now())
        await asyncio.sleep(POLL_S if held else min(RECHECK_S, max(0.0, confirmed + TERM_S - now())))
    log.critical("cluster %s: lost the lease; another replica may act now", cluster)
