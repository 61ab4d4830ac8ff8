"""The store: one engine (transactions alone or grouped into one commit, reads off the event
loop, schema upgrades, the SQL helpers) and the repositories composed over it, one per aggregate:
`sessions` (a cluster's sessions and VMs), `operator` (what operators set), `blocks` (blocked
users and the abuse detector's decisions) and `audit` (the audit log). The front's records
(requests, attempts, admissions) are its own repository over this engine, front/records.py, so
the store knows nothing of the front's protocol. Subclasses (store/databases.py) supply the
connection, the transactions and the placeholder.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from provisioner.store.audit_records import AuditRecords
from provisioner.store.group_commit import GroupCommit, WriterClosed
from provisioner.store.operator_records import OperatorRecords
from provisioner.store.schema import BACKFILLS, MIGRATIONS
from provisioner.store.session_records import SessionRecords
from provisioner.store.user_blocks import UserBlocks

T = TypeVar("T")


class StoreError(Exception):
    pass


class Store:
    """The engine and its repositories; subclasses supply a connection, transactions and the
    placeholder."""

    placeholder = "?"
    dialect = "sqlite"  # which of a migration's variants this database runs (store/schema.py)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch = threading.local()  # the writer thread's cursor while it runs a batch
        self._writer: GroupCommit | None = None
        self._writer_closed = False
        self._tx = threading.local()  # this thread's transaction: its after-commit actions
        self.sessions = SessionRecords(self)
        self.operator = OperatorRecords(self)
        self.blocks = UserBlocks(self)
        self.audit = AuditRecords(self)

    # ---- what subclasses provide ----------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A cursor in one transaction, committed on exit, rolled back on error."""
        raise NotImplementedError

    def _writer_transaction(self) -> Callable[[], Any]:
        """What group commit writes through: `_transaction` on a connection of its own, so the
        event loop's reads never wait for a commit."""
        raise NotImplementedError

    @contextmanager
    def reading(self) -> Iterator[Any]:
        """A cursor for one read: no transaction, so no write lock taken and no extra round trips."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # ---- transactions, alone or grouped -----------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor in one transaction, committed on exit, rolled back on error. Within a write
        given to `commit`, the cursor of its group's transaction."""
        batch = getattr(self._batch, "cursor", None)
        if batch is not None:
            yield batch
            return
        with self._after_commit() as after:
            with self._transaction() as cur:
                self._tx.after = after
                yield cur

    @contextmanager
    def _after_commit(self) -> Iterator[list[Callable[[], None]]]:
        """Collects what `on_commit` asks within a transaction and runs it once the transaction
        has committed (not if it rolled back)."""
        after: list[Callable[[], None]] = []
        try:
            yield after
        finally:
            self._tx.after = None
        for action in after:
            action()

    def on_commit(self, action: Callable[[], None]) -> None:
        """Runs `action` once the current transaction has committed (never if it rolls back)."""
        self._tx.after.append(action)

    @property
    def writer(self) -> GroupCommit:
        """The group committer, made with the first grouped write."""
        with self._lock:
            if self._writer_closed:
                raise WriterClosed("the store is closed")
            if self._writer is None:
                transient, ride_out_s = self._rides_out()
                self._writer = GroupCommit(self._grouped(self._writer_transaction()),
                                           transient=transient, ride_out_s=ride_out_s)
            return self._writer

    def _rides_out(self) -> tuple[Callable[[BaseException], bool], float]:
        """Which failures of a grouped batch are the database's, the batch tried again whole, and
        for how long: none here (a database on this machine is not away for a moment)."""
        return (lambda e: False), 0.0

    def _grouped(self, transaction: Callable[[], Any]) -> Callable[[], Any]:
        @contextmanager
        def grouped():
            with self._after_commit() as after:
                with transaction() as cur:
                    self._batch.cursor, self._tx.after = cur, after
                    try:
                        yield cur
                    finally:
                        self._batch.cursor = None
        return grouped

    async def commit(self, write: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs `write(*args, **kwargs)` (a write method of one of the repositories) in the writer thread,
        in one transaction with other callers' writes, and returns its result once that
        transaction is durable. A write that fails fails alone (see group_commit). The writer
        reads `args` when it runs: pass values, and sessions and VMs through `sessions.commit_save`."""
        return await self.writer.submit_async(lambda _cur: write(*args, **kwargs))

    async def read(self, read: Callable[..., T], *args: Any) -> T:
        """Runs `read(*args)` (a read of one of the repositories) without holding up the event loop for
        longer than the read itself costs. SQLite's run here: an indexed read of pages in memory
        takes tens of microseconds, less than a hand-off to a thread."""
        return read(*args)

    def _close_writer(self) -> None:
        """Commits the grouped writes still queued; a write after this raises WriterClosed."""
        with self._lock:
            self._writer_closed = True
            writer = self._writer
        if writer is not None:
            writer.close()

    def sql(self, statement: str) -> str:
        """`statement`, written with `?` placeholders, in this database's placeholder style."""
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    def rows(self, statement: str, args: tuple = ()) -> list[tuple]:
        """The rows of one read (one snapshot)."""
        with self.reading() as cur:
            cur.execute(self.sql(statement), args)
            return list(cur.fetchall())

    # ---- schema ---------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self.transaction() as cur:
            self._lock_schema(cur)
            cur.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            cur.execute("SELECT max(version) FROM schema_version")
            current = cur.fetchone()[0] or 0
            if current > len(MIGRATIONS):
                raise StoreError(f"the database has schema version {current}; this release knows up to "
                                 f"{len(MIGRATIONS)}: upgrade the provisioner")
            for version, sql in enumerate(MIGRATIONS[current:], start=current + 1):
                statements = sql[self.dialect] if isinstance(sql, dict) else filter(str.strip, sql.split(";"))
                for statement in statements:
                    cur.execute(statement)
                if version in BACKFILLS:
                    BACKFILLS[version](cur, self.sql)
                cur.execute(self.sql("INSERT INTO schema_version (version) VALUES (?)"), (version,))

    def _lock_schema(self, cur) -> None:
        """Only one process upgrades the schema at a time."""

    @property
    def schema_version(self) -> int:
        return self.rows("SELECT max(version) FROM schema_version")[0][0]

