"""Durable state: sessions, VMs and the front's idempotency keys, in SQLite (WAL).

Every batch of changes is written in one transaction before the shell acts on it, so a session
is durable before its creation is acknowledged and a VM's record exists before the cloud call
that makes it. Rows keep a few indexed columns plus the full object as JSON.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Iterable

from provisioner.model import Session, Vm

# Append only: each entry upgrades the schema by one version.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        request_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        state TEXT NOT NULL,
        revision INTEGER NOT NULL,
        body TEXT NOT NULL,
        UNIQUE (cluster, request_id)
    );
    CREATE INDEX sessions_user ON sessions (cluster, user_id);
    CREATE TABLE vms (
        id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        pool TEXT NOT NULL,
        state TEXT NOT NULL,
        revision INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX vms_cluster ON vms (cluster, state);
    CREATE TABLE front_requests (
        request_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        cluster TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """,
]


class SqliteStore:
    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._migrate()

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self._db.execute("SELECT max(version) FROM schema_version").fetchone()
            current = row[0] or 0
            for version, sql in enumerate(MIGRATIONS[current:], start=current + 1):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in filter(str.strip, sql.split(";")):
                        self._db.execute(statement)
                    self._db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise

    @property
    def schema_version(self) -> int:
        return self._db.execute("SELECT max(version) FROM schema_version").fetchone()[0]

    def save(self, sessions: Iterable[Session], vms: Iterable[Vm]) -> None:
        """Writes a batch of changed objects in one transaction."""
        s_rows = [(s.id, s.cluster, s.spec.request_id, s.spec.user_id, s.state.value, s.revision,
                   json.dumps(s.to_dict())) for s in sessions]
        v_rows = [(v.id, v.cluster, v.pool, v.state.value, v.revision, json.dumps(v.to_dict())) for v in vms]
        if not s_rows and not v_rows:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO sessions (id, cluster, request_id, user_id, state, revision, body) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
                    "revision = excluded.revision, body = excluded.body", s_rows)
                self._db.executemany(
                    "INSERT INTO vms (id, cluster, pool, state, revision, body) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, revision = excluded.revision, "
                    "body = excluded.body", v_rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def load_sessions(self, cluster: str) -> list[Session]:
        rows = self._db.execute("SELECT body FROM sessions WHERE cluster = ? ORDER BY rowid", (cluster,))
        return [Session.from_dict(json.loads(body)) for (body,) in rows]

    def load_vms(self, cluster: str) -> list[Vm]:
        rows = self._db.execute("SELECT body FROM vms WHERE cluster = ? AND state != 'deleted' ORDER BY rowid",
                                (cluster,))
        return [Vm.from_dict(json.loads(body)) for (body,) in rows]

    # The front's idempotency keys: request id -> the session it created.
    def remember_request(self, request_id: str, session_id: str, cluster: str, now: float) -> str:
        """Records the first session for a request id; returns whichever session id won."""
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO front_requests VALUES (?, ?, ?, ?)",
                             (request_id, session_id, cluster, now))
            return self._db.execute("SELECT session_id FROM front_requests WHERE request_id = ?",
                                    (request_id,)).fetchone()[0]

    def session_for_request(self, request_id: str) -> str | None:
        row = self._db.execute("SELECT session_id FROM front_requests WHERE request_id = ?",
                               (request_id,)).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
