"""A database that is away for seconds (a restart, a failover, a short partition) is ridden out.

The store turns a lost connection into StoreUnavailable: retryable, answered UNAVAILABLE with
RetryInfo at the servicer edge, its message naming no host, user or database (the details go to
the server's log, without credentials). Reads and grouped writes are tried again on it, with a
backoff, until RIDE_OUT_S has passed; the next try reconnects. Only what is safe to run again is:
a read, or a whole transaction that rolled back (the group committer's batches; see
group_commit.py for a batch whose commit's outcome is unknown).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from provisioner.model.errors import Unavailable
from provisioner.store.engine import StoreError
from provisioner.store.group_commit import backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long a store call goes on trying before it fails: a PostgreSQL restart takes a few seconds.
# Kept below the cluster lease's term (cluster/leader.py), so a leader's writes give up while it
# still leads.
RIDE_OUT_S = 6.0
PUBLIC_MESSAGE = "the database is unreachable for the moment; try again"
# SQLSTATE classes of a connection that is gone: connection exceptions, operator intervention
# (the server shutting down or starting up).
LOST_CLASSES = ("08", "57")


class StoreUnavailable(StoreError, Unavailable):
    """The database cannot be reached now. `str()` is for callers; `detail` for the log."""

    def __init__(self, detail: str):
        super().__init__(PUBLIC_MESSAGE, retry_after_s=1.0)
        self.detail = detail


def connection_lost(err: BaseException) -> bool:
    """Whether a psycopg error means the connection (or the server) is gone, rather than that
    the statement was wrong."""
    import psycopg

    if isinstance(err, psycopg.InterfaceError):
        return True
    if not isinstance(err, psycopg.OperationalError):
        return False
    sqlstate = getattr(err, "sqlstate", None)
    return sqlstate is None or sqlstate[:2] in LOST_CLASSES


def ride_out(fn: Callable[[], T], sleep: Callable[[float], None] = time.sleep) -> T:
    """`fn()`, tried again on StoreUnavailable until RIDE_OUT_S (wall time on purpose: a database's
    restart takes real seconds) has passed. Called in a store
    thread (a reader or the writer), never on the event loop: its waits block that thread only,
    and every call it holds up would fail the same way meanwhile."""
    for wait in backoff(RIDE_OUT_S):  # a database back is used within half a second
        try:
            return fn()
        except StoreUnavailable as e:
            log.warning("the database is unreachable; trying again in %.2f s: %s", wait, e.detail)
            sleep(wait)
    return fn()
