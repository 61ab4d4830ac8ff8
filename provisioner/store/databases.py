"""The store over SQLite (WAL) or PostgreSQL, and open_store to pick one from a database URL."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from provisioner.common.private_files import DIR_MODE, create_private
from provisioner.store import outage
from provisioner.store.engine import Store, StoreError, T
from provisioner.store.outage import StoreUnavailable, connection_lost, ride_out
from provisioner.store.schema import MIGRATION_LOCK


class SqliteStore(Store):
    def __init__(self, path: str | Path):
        super().__init__()
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            create_private(self.path)
        self._db = self._connect()
        self._writer_db: sqlite3.Connection | None = None
        self._migrate()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=5000")
        return db

    @contextmanager
    def _transaction(self, db: sqlite3.Connection | None = None,
                     lock: threading.Lock | None = None) -> Iterator[sqlite3.Cursor]:
        with lock or self._lock:
            cur = (db or self._db).cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def _writer_transaction(self):
        if self.path == ":memory:":  # a second connection would open another database
            return self._transaction
        db, lock = self._connect(), threading.Lock()
        self._writer_db = db
        return lambda: self._transaction(db, lock)

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            yield self._db.cursor()  # autocommit: the statement reads one snapshot

    def close(self) -> None:
        self._close_writer()
        with self._lock:
            self._db.close()
            if self._writer_db is not None:
                self._writer_db.close()


CONNECT_TIMEOUT_S = 5  # a server that does not answer at all is given up on within a ride-out


class PostgresStore(Store):
    placeholder = "%s"
    dialect = "postgres"

    def __init__(self, url: str):
        super().__init__()
        self.url = url
        self._db = None
        self._writer_db: list = []  # the writer's connection, once it has one
        # Reads from the event loop wait for a network round trip: they wait in this thread.
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="store-reader")
        try:  # a process starting while the database restarts waits for it, as a running one does
            ride_out(self._migrate)
        except StoreUnavailable as e:
            raise StoreError(f"cannot connect to the database {e.detail}") from None

    async def read(self, read: Callable[..., T], *args: Any) -> T:
        """As Store.read, and a database away for a moment is waited out (store/outage.py)."""
        return await asyncio.get_running_loop().run_in_executor(self._reader, ride_out, lambda: read(*args))

    def _connect(self):
        import psycopg  # only when PostgreSQL is asked for

        with self._lost():
            return psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)

    @contextmanager
    def _lost(self) -> Iterator[None]:
        """A lost connection (or none to be had) becomes StoreUnavailable, which tells callers no
        address; the log gets the details, the URL without its password."""
        try:
            yield
        except Exception as e:
            if not connection_lost(e):
                raise
            raise StoreUnavailable(f"{redact(self.url)}: {type(e).__name__}: {e}") from None

    @contextmanager
    def _transaction(self):
        with self._lock, self._lost():
            with self._connection().transaction(), self._db.cursor() as cur:
                yield cur

    def _writer_transaction(self):
        db = self._writer_db

        @contextmanager
        def transaction():
            with self._lost():
                if not db or db[0].closed:  # as _connection: the next batch reconnects
                    db[:] = [self._connect()]
                with db[0].transaction(), db[0].cursor() as cur:
                    yield cur
        return transaction

    @contextmanager
    def reading(self):
        with self._lock, self._lost():
            with self._connection().cursor() as cur:  # autocommit: one statement, one snapshot
                yield cur

    def _connection(self):
        if self._db is None or self._db.closed:  # lost with a server restart or failover: the next call reconnects
            self._db = self._connect()
        return self._db

    def _lock_schema(self, cur) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))

    def _rides_out(self):
        """A batch that lost the connection is tried again whole, for up to a ride-out (store/outage.py)."""
        return (lambda e: isinstance(e, StoreUnavailable)), outage.RIDE_OUT_S

    def close(self) -> None:
        self._close_writer()
        self._reader.shutdown()
        with self._lock:
            if self._db is not None:
                self._db.close()
            for db in self._writer_db:
                db.close()


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    creds, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***{at}{host}" if ":" in creds else url


def open_store(database_url: str | None, default_path: str | Path) -> Store:
    """PostgreSQL for a postgresql:// URL, else SQLite at the URL's path or `default_path`."""
    if database_url and database_url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(database_url)
    if database_url and database_url.startswith("sqlite:///"):
        return SqliteStore(database_url.removeprefix("sqlite:///"))
    if database_url:
        raise StoreError(f"unsupported database URL {redact(database_url)!r}: use postgresql://... or sqlite:///PATH")
    return SqliteStore(default_path)
