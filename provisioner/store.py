"""Durable state: sessions, VMs, the front's idempotency keys and attempts. SQLite (WAL) on a
laptop, PostgreSQL in production, behind one class and one schema.

Every batch of changes is written in one transaction before the shell acts on it, so a session
is durable before its creation is acknowledged and a VM's record exists before the cloud call
that makes it. Rows keep a few indexed columns plus the full object as JSON. The statements are
written once, in the SQL both databases accept; only the placeholder style differs. A VM's
disk cache and history are rows of their own, so a write carries the layers and state changes
that changed instead of the whole VM each time.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from provisioner.group_commit import GroupCommit, WriterClosed
from provisioner.decide.states import SESSION_TERMINAL, SessionState, VmState
from provisioner.front.attempts import SETTLED, UNSETTLED, Attempt, Event, check_change, sources
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
        created_at DOUBLE PRECISION NOT NULL
    );
    """,
    # Every attempt the front made at placing a request, so an outcome it never heard (a lost
    # reply, a crash) is looked up later instead of guessed.
    """
    CREATE TABLE front_attempts (
        request_id TEXT NOT NULL,
        cluster TEXT NOT NULL,
        commit_by DOUBLE PRECISION NOT NULL,
        outcome TEXT NOT NULL,
        PRIMARY KEY (request_id, cluster)
    );
    CREATE INDEX front_attempts_outcome ON front_attempts (outcome);
    """,
    # What operators set on a cluster, which outlives its processes: the drain flag (pool '') and
    # each pool's policy overrides, as JSON. And the audit log: who did what, when, with what
    # outcome (`source` tells apart the logs of processes sharing one database).
    """
    CREATE TABLE operator_state (
        cluster TEXT NOT NULL,
        pool TEXT NOT NULL,
        body TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (cluster, pool)
    );
    CREATE TABLE audit_log (
        id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        identity TEXT NOT NULL,
        roles TEXT NOT NULL,
        rpc TEXT NOT NULL,
        method TEXT NOT NULL,
        target TEXT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX audit_log_at ON audit_log (source, at, id);
    """,
    # Quotas across front replicas: a per-user lease that serializes check-and-place (wall-time
    # expiry, so a dead holder's lease lapses), and the per-user limits operators set, as JSON.
    """
    CREATE TABLE user_leases (
        user_id TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE quota_overrides (
        user_id TEXT PRIMARY KEY,
        body TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    """,
    # A VM's cached layers and its state changes, apart from its body: an assignment changes the
    # last-use time of a few layers and adds a state change, not the ~40 images a disk holds.
    # Bodies written before keep theirs inline until the VM is next written.
    """
    CREATE TABLE vm_layers (
        vm_id TEXT NOT NULL,
        layer_id TEXT NOT NULL,
        size_bytes BIGINT NOT NULL,
        used_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (vm_id, layer_id)
    );
    CREATE TABLE vm_history (
        vm_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (vm_id, seq)
    );
    """,
    # Users blocked from new GPU sessions (by an operator or the abuse detector), read on every
    # create; and every decision the detector made, with its evidence, one per flagged session
    # (`blocked` 0: a dry run's, recorded only).
    """
    CREATE TABLE user_blocks (
        user_id TEXT PRIMARY KEY,
        blocked_at DOUBLE PRECISION NOT NULL,
        blocked_by TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL
    );
    CREATE INDEX user_blocks_at ON user_blocks (blocked_at, user_id);
    CREATE TABLE abuse_decisions (
        session_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        rules TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL,
        blocked INTEGER NOT NULL
    );
    CREATE INDEX abuse_decisions_user ON abuse_decisions (user_id, at);
    """,
    # Blocks lifted, with who lifted them and when: an unblock does not erase why a user was blocked.
    """
    CREATE TABLE user_block_history (
        user_id TEXT NOT NULL,
        blocked_at DOUBLE PRECISION NOT NULL,
        blocked_by TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL,
        lifted_at DOUBLE PRECISION NOT NULL,
        lifted_by TEXT NOT NULL
    );
    CREATE INDEX user_block_history_user ON user_block_history (user_id, lifted_at);
    """,
    # A cluster restarts with its live sessions and the recently ended ones, however long its
    # history; an older one is read by its id, its request or its user.
    """
    ALTER TABLE sessions ADD COLUMN ended_at DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE INDEX sessions_state ON sessions (cluster, state);
    CREATE INDEX sessions_ended ON sessions (cluster, ended_at);
    """,
]

# The front's attempt states; their transitions are the table in front/attempts.py.
PENDING, UNRESOLVED, REFUSED, MADE, NONE = (Attempt.PENDING, Attempt.UNRESOLVED, Attempt.REFUSED, Attempt.MADE,
                                            Attempt.NONE)
# Serializes schema upgrades between replicas starting at once (PostgreSQL advisory lock key).
MIGRATION_LOCK = 0x70726F76

T = TypeVar("T")
_LIVE = frozenset(SessionState) - SESSION_TERMINAL  # sessions not ended


@dataclass(frozen=True)
class _VmRows:
    """What the database holds of one VM's layers and history, as of the last commit."""

    layers: dict[str, tuple[int, float]]  # layer id -> (size, last use)
    history: int  # state changes written
    last: tuple | None  # the last one written: a history rewritten since no longer ends with it


_NO_ROWS = _VmRows({}, 0, None)


class StoreError(Exception):
    pass


class Store:
    """The statements; subclasses supply a connection, transactions and the placeholder."""

    placeholder = "?"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch = threading.local()  # the writer thread's cursor while it runs a batch
        self._writer: GroupCommit | None = None
        self._writer_closed = False
        self._tx = threading.local()  # this thread's transaction: its after-commit actions
        self._vm_rows: dict[str, _VmRows] = {}

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
        """Collects what `_on_commit` asks within a transaction and runs it once the transaction
        has committed (not if it rolled back)."""
        after: list[Callable[[], None]] = []
        try:
            yield after
        finally:
            self._tx.after = None
        for action in after:
            action()

    def _on_commit(self, action: Callable[[], None]) -> None:
        self._tx.after.append(action)

    @property
    def writer(self) -> GroupCommit:
        """The group committer, made with the first grouped write."""
        with self._lock:
            if self._writer_closed:
                raise WriterClosed("the store is closed")
            if self._writer is None:
                self._writer = GroupCommit(self._grouped(self._writer_transaction()))
            return self._writer

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
        """Runs `write(*args, **kwargs)` (one of this store's write methods) in the writer thread,
        in one transaction with other callers' writes, and returns its result once that
        transaction is durable. A write that fails fails alone (see group_commit). The writer
        reads `args` when it runs: pass values, and sessions and VMs through `commit_save`."""
        return await asyncio.wrap_future(self.writer.submit(lambda _cur: write(*args, **kwargs)))

    async def read(self, read: Callable[..., T], *args: Any) -> T:
        """Runs `read(*args)` (one of this store's reads) without holding up the event loop for
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

    def _sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    def _rows(self, statement: str, args: tuple = ()) -> list[tuple]:
        with self.reading() as cur:
            cur.execute(self._sql(statement), args)
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
                for statement in filter(str.strip, sql.split(";")):
                    cur.execute(statement)
                cur.execute(self._sql("INSERT INTO schema_version (version) VALUES (?)"), (version,))

    def _lock_schema(self, cur) -> None:
        """Only one process upgrades the schema at a time."""

    @property
    def schema_version(self) -> int:
        return self._rows("SELECT max(version) FROM schema_version")[0][0]

    # ---- a cluster's sessions and VMs -----------------------------------------------------

    def save(self, sessions: Iterable[Session], vms: Iterable[Vm]) -> None:
        """Writes a batch of changed objects in one transaction. Sessions are never erased: an
        ended one keeps its reason and GPU time for billing and quotas."""
        self._save_rows(sessions, vms)()

    async def commit_save(self, sessions: Iterable[Session], vms: Iterable[Vm]) -> None:
        """`save`, group-committed. The objects are read now, on the caller's thread (the
        writer thread must not read objects the event loop goes on changing)."""
        await self.commit(self._save_rows(sessions, vms))

    def _save_rows(self, sessions: Iterable[Session], vms: Iterable[Vm]) -> Callable[[], None]:
        """The rows of a save, made now; the returned function writes them."""
        # The request_id column holds the user-scoped request key, unique within the cluster.
        s_rows = [(s.id, s.cluster, s.spec.key, s.spec.user_id, s.state.value, s.revision, s.ended_at,
                   json.dumps(s.to_dict())) for s in sessions]
        v_rows, layers, gone, history, rewritten, written = [], [], [], [], [], {}
        for v in vms:
            body = v.to_dict()
            before = self._vm_rows.get(v.id, _NO_ROWS)
            now = self._vm_layer_and_history_rows(v.id, body, before, layers, gone, history, rewritten)
            if v.state is VmState.DELETED:  # its disk is gone: its history stays, nothing to remember
                gone += [(v.id, lid) for lid in now.layers]
                now = None
            written[v.id] = now
            v_rows.append((v.id, v.cluster, v.pool, v.state.value, v.revision, json.dumps(body)))
        return lambda: self._write_rows(s_rows, v_rows, layers, gone, history, rewritten, written)

    def _write_rows(self, s_rows, v_rows, layers, gone, history, rewritten, written) -> None:
        if not s_rows and not v_rows:
            return
        with self.transaction() as cur:
            self._on_commit(lambda: self._remember_vm_rows(written))
            if rewritten:
                cur.executemany(self._sql("DELETE FROM vm_history WHERE vm_id = ?"), rewritten)
            if history:
                cur.executemany(self._sql("INSERT INTO vm_history (vm_id, seq, state, reason, at) "
                                          "VALUES (?, ?, ?, ?, ?) ON CONFLICT (vm_id, seq) DO NOTHING"), history)
            if gone:
                cur.executemany(self._sql("DELETE FROM vm_layers WHERE vm_id = ? AND layer_id = ?"), gone)
            if layers:
                cur.executemany(self._sql(
                    "INSERT INTO vm_layers (vm_id, layer_id, size_bytes, used_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (vm_id, layer_id) DO UPDATE SET size_bytes = excluded.size_bytes, "
                    "used_at = excluded.used_at"), layers)
            if s_rows:
                cur.executemany(self._sql(
                    "INSERT INTO sessions (id, cluster, request_id, user_id, state, revision, ended_at, body) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
                    "revision = excluded.revision, ended_at = excluded.ended_at, body = excluded.body"), s_rows)
            if v_rows:
                cur.executemany(self._sql(
                    "INSERT INTO vms (id, cluster, pool, state, revision, body) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, revision = excluded.revision, "
                    "body = excluded.body"), v_rows)

    def load_sessions(self, cluster: str, ended_since: float | None = None) -> list[Session]:
        """The cluster's sessions; given `ended_since`, only those not ended and those ended since."""
        if ended_since is None:
            rows = self._rows("SELECT body FROM sessions WHERE cluster = ?", (cluster,))
        else:
            rows = self._rows(f"SELECT body FROM sessions WHERE cluster = ? AND state IN ({_marks(_LIVE)}) "
                              "UNION ALL SELECT body FROM sessions WHERE cluster = ? AND ended_at >= ? "
                              f"AND state NOT IN ({_marks(_LIVE)})",
                              (cluster, *_values(_LIVE), cluster, ended_since, *_values(_LIVE)))
        return sorted((Session.from_dict(json.loads(body)) for (body,) in rows), key=lambda s: (s.created_at, s.id))

    def load_session(self, cluster: str, session_id: str) -> Session | None:
        rows = self._rows("SELECT body FROM sessions WHERE id = ? AND cluster = ?", (session_id, cluster))
        return Session.from_dict(json.loads(rows[0][0])) if rows else None

    def load_session_by_request(self, cluster: str, key: str) -> Session | None:
        rows = self._rows("SELECT body FROM sessions WHERE cluster = ? AND request_id = ?", (cluster, key))
        return Session.from_dict(json.loads(rows[0][0])) if rows else None

    def load_user_sessions(self, cluster: str, user_id: str) -> list[Session]:
        rows = self._rows("SELECT body FROM sessions WHERE cluster = ? AND user_id = ?", (cluster, user_id))
        return [Session.from_dict(json.loads(body)) for (body,) in rows]

    def _remember_vm_rows(self, written: dict[str, _VmRows | None]) -> None:
        for vm_id, rows in written.items():
            if rows is None:
                self._vm_rows.pop(vm_id, None)
            else:
                self._vm_rows[vm_id] = rows

    @staticmethod
    def _vm_layer_and_history_rows(vm_id: str, body: dict, before: _VmRows, layers: list, gone: list,
                                   history: list, rewritten: list) -> _VmRows:
        """Takes the layers and history out of a VM's body, adds the rows that differ from what
        the database holds (`before`) to the lists, and returns what it will hold after."""
        cached = {lid: (size, used_at) for lid, size, used_at in body["cache"].pop("layers")}
        layers += [(vm_id, lid, *row) for lid, row in cached.items() if before.layers.get(lid) != row]
        gone += [(vm_id, lid) for lid in before.layers if lid not in cached]
        changes = [tuple(h) for h in body.pop("history")]
        start = before.history
        if start > len(changes) or (start and changes[start - 1] != before.last):  # not an append
            rewritten.append((vm_id,))
            start = 0
        history += [(vm_id, seq, *changes[seq]) for seq in range(start, len(changes))]
        return _VmRows(cached, len(changes), changes[-1] if changes else None)

    def load_vms(self, cluster: str) -> list[Vm]:
        """The cluster's VMs that are not deleted, their layers and history from their rows (or
        from their body, if it was written before those had rows of their own)."""
        live = "SELECT id FROM vms WHERE cluster = ? AND state <> 'deleted'"
        bodies = {vm_id: json.loads(body) for vm_id, body in self._rows(
            "SELECT id, body FROM vms WHERE cluster = ? AND state <> 'deleted'", (cluster,))}
        layers: dict[str, list] = {}
        for vm_id, lid, size, used_at in self._rows(
                f"SELECT vm_id, layer_id, size_bytes, used_at FROM vm_layers WHERE vm_id IN ({live})", (cluster,)):
            layers.setdefault(vm_id, []).append([lid, size, used_at])
        history: dict[str, list] = {}
        for vm_id, state, reason, at in self._rows(
                f"SELECT vm_id, state, reason, at FROM vm_history WHERE vm_id IN ({live}) ORDER BY vm_id, seq",
                (cluster,)):
            history.setdefault(vm_id, []).append([state, reason, at])
        vms = []
        for vm_id, body in bodies.items():
            held = _VmRows({lid: (size, used_at) for lid, size, used_at in layers.get(vm_id, ())},
                           len(history.get(vm_id, ())), tuple(history[vm_id][-1]) if vm_id in history else None)
            self._vm_rows[vm_id] = held
            if "layers" not in body["cache"]:
                body["cache"]["layers"] = sorted(layers.get(vm_id, ()))
            if "history" not in body:
                body["history"] = history.get(vm_id, [])
            vms.append(Vm.from_dict(body))
        return sorted(vms, key=lambda v: (v.created_at, v.id))

    # ---- the front: request key -> the session it created ---------------------------------
    # The front_* tables' request_id columns hold request keys (model.request_key: user/request id).

    def remember_request(self, request_id: str, session_id: str, cluster: str, now: float) -> str:
        """Records the first session for a request key; returns whichever session id won. If this
        one won, its attempt takes the WON edge in the same transaction."""
        with self.transaction() as cur:
            cur.execute(self._sql("INSERT INTO front_requests VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"),
                        (request_id, session_id, cluster, now))
            cur.execute(self._sql("SELECT session_id FROM front_requests WHERE request_id = ?"), (request_id,))
            winner = cur.fetchone()[0]
            if winner == session_id:
                case, args = _edges(Event.WON)
                cur.execute(self._sql(f"UPDATE front_attempts SET outcome = {case} WHERE request_id = ? AND cluster = ? "
                                      f"AND outcome IN ({_marks(sources(Event.WON))})"),
                            (*args, request_id, cluster, *_values(sources(Event.WON))))
            return winner

    def session_for_request(self, request_id: str) -> str | None:
        rows = self._rows("SELECT session_id FROM front_requests WHERE request_id = ?", (request_id,))
        return rows[0][0] if rows else None

    def note_attempt(self, request_id: str, cluster: str, commit_by: float) -> Attempt:
        """The SENT edge: the attempt is pending, with the later commit_by of this one and any earlier
        one there. A made one stays made. Returns the state after."""
        edges = {b: a for b, a in sources(Event.SENT).items() if b is not None}
        case, args = _edges(Event.SENT, "front_attempts.outcome", edges)
        with self.transaction() as cur:
            cur.execute(self._sql(
                "INSERT INTO front_attempts VALUES (?, ?, ?, ?) ON CONFLICT (request_id, cluster) DO UPDATE "
                "SET commit_by = CASE WHEN excluded.commit_by > front_attempts.commit_by "
                f"THEN excluded.commit_by ELSE front_attempts.commit_by END, outcome = {case} "
                f"WHERE front_attempts.outcome IN ({_marks(edges)})"),
                (request_id, cluster, commit_by, sources(Event.SENT)[None].value, *args, *_values(edges)))
            cur.execute(self._sql("SELECT outcome FROM front_attempts WHERE request_id = ? AND cluster = ?"),
                        (request_id, cluster))
            return Attempt(cur.fetchone()[0])

    def settle_attempt(self, request_id: str, cluster: str, to: Attempt, expected: Attempt = PENDING,
                       commit_by: float | None = None) -> bool:
        """Applies a change the front's state machine chose, if the attempt is still as it decided
        on (`expected`, and `commit_by` when given); False if someone changed it first."""
        check_change(expected, to)
        where, args = "request_id = ? AND cluster = ? AND outcome = ?", [request_id, cluster, expected.value]
        if commit_by is not None:
            where += " AND commit_by = ?"
            args.append(commit_by)
        with self.transaction() as cur:
            cur.execute(self._sql(f"UPDATE front_attempts SET outcome = ? WHERE {where}"), (to.value, *args))
            return cur.rowcount == 1

    def prune_attempts(self, before: float) -> None:
        """Forgets settled attempts whose commit_by is older than `before`: their outcome is known."""
        with self.transaction() as cur:
            cur.execute(self._sql(f"DELETE FROM front_attempts WHERE outcome IN ({_marks(SETTLED)}) AND commit_by < ?"),
                        (*_values(SETTLED), before))

    def open_attempts(self, request_id: str | None = None) -> list[tuple[str, str, float]]:
        """(request id, cluster, commit_by) of attempts not settled yet, oldest first."""
        return [(r, c, by) for r, c, _, by in self.attempts_to_resolve(request_id)]

    def attempts_to_resolve(self, request_id: str | None = None) -> list[tuple[str, str, Attempt, float]]:
        """(request id, cluster, state, commit_by) of attempts not settled yet, oldest first."""
        where = f"outcome IN ({_marks(UNSETTLED)})" + (" AND request_id = ?" if request_id else "")
        args = (*_values(UNSETTLED), *((request_id,) if request_id else ()))
        return [(r, c, Attempt(state), by) for r, c, state, by in self._rows(
            f"SELECT request_id, cluster, outcome, commit_by FROM front_attempts WHERE {where} "
            "ORDER BY commit_by, request_id, cluster", args)]

    # ---- operator state: drain and pool policy overrides, per cluster -----------------------

    def save_operator_state(self, cluster: str, pool: str, body: dict[str, Any], now: float) -> None:
        """Sets what operators chose for the cluster (`pool` '') or one of its pools; an empty
        `body` removes it (back to the config file)."""
        with self.transaction() as cur:
            if body:
                cur.execute(self._sql(
                    "INSERT INTO operator_state (cluster, pool, body, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (cluster, pool) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"),
                    (cluster, pool, json.dumps(body, sort_keys=True), now))
            else:
                cur.execute(self._sql("DELETE FROM operator_state WHERE cluster = ? AND pool = ?"), (cluster, pool))

    def load_operator_state(self, cluster: str) -> dict[str, dict[str, Any]]:
        """pool -> what operators set on it ('' for the cluster itself)."""
        rows = self._rows("SELECT pool, body FROM operator_state WHERE cluster = ?", (cluster,))
        return {pool: json.loads(body) for pool, body in rows}

    # ---- quotas: per-user leases across front replicas, operator overrides ------------------

    def try_user_lease(self, user_id: str, holder: str, expires_at: float, now: float) -> bool:
        """Takes the user's lease for `holder` until `expires_at` if it is free or lapsed (its
        expiry before `now`); whether `holder` has it. Atomic across processes."""
        with self.transaction() as cur:
            cur.execute(self._sql(
                "INSERT INTO user_leases (user_id, holder, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (user_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
                "WHERE user_leases.expires_at < ?"), (user_id, holder, expires_at, now))
            cur.execute(self._sql("SELECT holder FROM user_leases WHERE user_id = ?"), (user_id,))
            return cur.fetchone()[0] == holder

    def renew_user_lease(self, user_id: str, holder: str, expires_at: float) -> bool:
        """Extends `holder`'s lease; False if it is no longer theirs."""
        with self.transaction() as cur:
            cur.execute(self._sql("UPDATE user_leases SET expires_at = ? WHERE user_id = ? AND holder = ?"),
                        (expires_at, user_id, holder))
            return cur.rowcount == 1

    def release_user_lease(self, user_id: str, holder: str) -> None:
        with self.transaction() as cur:
            cur.execute(self._sql("DELETE FROM user_leases WHERE user_id = ? AND holder = ?"), (user_id, holder))

    def save_quota_override(self, user_id: str, body: dict[str, Any], now: float) -> None:
        """Sets what operators chose for a user's quota; an empty `body` removes it (back to the config)."""
        with self.transaction() as cur:
            if body:
                cur.execute(self._sql(
                    "INSERT INTO quota_overrides (user_id, body, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (user_id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"),
                    (user_id, json.dumps(body, sort_keys=True), now))
            else:
                cur.execute(self._sql("DELETE FROM quota_overrides WHERE user_id = ?"), (user_id,))

    def quota_override(self, user_id: str) -> tuple[dict[str, Any], float | None]:
        """What operators set for the user and when ({} and None: nothing)."""
        rows = self._rows("SELECT body, updated_at FROM quota_overrides WHERE user_id = ?", (user_id,))
        return (json.loads(rows[0][0]), rows[0][1]) if rows else ({}, None)

    # ---- blocked users and the abuse detector's decisions -----------------------------------

    def block_user(self, user_id: str, at: float, by: str, reason: str, evidence: str) -> bool:
        """Blocks the user unless already blocked (the first block, its reason and evidence, stand);
        whether this call blocked them."""
        with self.transaction() as cur:
            return self._insert_block(cur, user_id, at, by, reason, evidence)

    def _insert_block(self, cur, user_id: str, at: float, by: str, reason: str, evidence: str) -> bool:
        cur.execute(self._sql(
            "INSERT INTO user_blocks (user_id, blocked_at, blocked_by, reason, evidence) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (user_id) DO NOTHING"), (user_id, at, by, reason, evidence))
        return cur.rowcount == 1

    def unblock_user(self, user_id: str, at: float, by: str) -> tuple | None:
        """Lifts the user's block, moved to the history with who lifted it and when; the block
        lifted (as `user_block` gives it), or None if the user was not blocked."""
        with self.transaction() as cur:
            cur.execute(self._sql("SELECT user_id, blocked_at, blocked_by, reason, evidence FROM user_blocks "
                                  "WHERE user_id = ?"), (user_id,))
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(self._sql("INSERT INTO user_block_history (user_id, blocked_at, blocked_by, reason, evidence, "
                                  "lifted_at, lifted_by) VALUES (?, ?, ?, ?, ?, ?, ?)"), (*row, at, by))
            cur.execute(self._sql("DELETE FROM user_blocks WHERE user_id = ?"), (user_id,))
            return tuple(row)

    def lifted_blocks(self, user_id: str, limit: int) -> list[tuple]:
        """The user's blocks lifted, newest lifting first: `user_block`'s columns, lifted at, lifted by."""
        return [tuple(r) for r in self._rows(
            "SELECT user_id, blocked_at, blocked_by, reason, evidence, lifted_at, lifted_by FROM user_block_history "
            "WHERE user_id = ? ORDER BY lifted_at DESC, blocked_at DESC LIMIT ?", (user_id, limit))]

    def user_block(self, user_id: str) -> tuple | None:
        """(user id, blocked at, by, reason, evidence), or None if the user is not blocked."""
        rows = self._rows("SELECT user_id, blocked_at, blocked_by, reason, evidence FROM user_blocks "
                          "WHERE user_id = ?", (user_id,))
        return tuple(rows[0]) if rows else None

    def blocked_users(self, limit: int, offset: int = 0) -> list[tuple]:
        """Blocks as `user_block` gives them, newest first."""
        return [tuple(r) for r in self._rows(
            "SELECT user_id, blocked_at, blocked_by, reason, evidence FROM user_blocks "
            "ORDER BY blocked_at DESC, user_id LIMIT ? OFFSET ?", (limit, offset))]

    def record_abuse_decision(self, session_id: str, user_id: str, at: float, rules: str, reason: str,
                              evidence: str, block: bool, by: str) -> bool:
        """The detector's decision on a session, and (`block`) the block of its user by `by`, in
        one transaction. A session's decision is recorded once: a repeat (the same flag delivered
        again) changes nothing, so it never blocks a user an operator has unblocked since. Whether
        the decision was new."""
        with self.transaction() as cur:
            cur.execute(self._sql(
                "INSERT INTO abuse_decisions (session_id, user_id, at, rules, reason, evidence, blocked) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO NOTHING"),
                (session_id, user_id, at, rules, reason, evidence, int(block)))
            if cur.rowcount != 1:
                return False
            if block:
                self._insert_block(cur, user_id, at, by, reason, evidence)
            return True

    def abuse_decisions(self, user_id: str, limit: int) -> list[tuple]:
        """(session id, at, rules, reason, evidence, blocked) of the user's flagged sessions, newest first."""
        return [(s, at, rules, reason, evidence, bool(blocked)) for s, at, rules, reason, evidence, blocked in self._rows(
            "SELECT session_id, at, rules, reason, evidence, blocked FROM abuse_decisions WHERE user_id = ? "
            "ORDER BY at DESC, session_id LIMIT ?", (user_id, limit))]

    # ---- the audit log ----------------------------------------------------------------------

    def append_audit(self, record_id: str, source: str, at: float, identity: str, roles: str, rpc: str,
                     method: str, target: str, outcome: str, detail: str) -> None:
        """One record; `method` is the RPC's last part (DrainCluster), for filtering by it."""
        with self.transaction() as cur:
            cur.execute(self._sql(
                "INSERT INTO audit_log (id, source, at, identity, roles, rpc, method, target, outcome, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                (record_id, source, at, identity, roles, rpc, method, target, outcome, detail))

    def audit_records(self, source: str, *, identity: str | None = None, rpc: str | None = None,
                      method: str | None = None, outcome: str | None = None, since: float | None = None, until: float | None = None,
                      before: tuple[float, str] | None = None, limit: int = 50) -> list[tuple]:
        """(id, at, identity, roles, rpc, target, outcome, detail) of one source's records, newest
        first: at >= since, at < until, and strictly older than `before` (at, id) when given."""
        where, args = ["source = ?"], [source]
        for column, value in (("identity", identity), ("rpc", rpc), ("method", method), ("outcome", outcome)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("at >= ?")
            args.append(since)
        if until is not None:
            where.append("at < ?")
            args.append(until)
        if before is not None:
            where.append("(at < ? OR (at = ? AND id < ?))")
            args += [before[0], before[0], before[1]]
        return [tuple(r) for r in self._rows(
            "SELECT id, at, identity, roles, rpc, target, outcome, detail FROM audit_log "
            f"WHERE {' AND '.join(where)} ORDER BY at DESC, id DESC LIMIT ?", (*args, limit))]


class SqliteStore(Store):
    def __init__(self, path: str | Path):
        super().__init__()
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
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


class PostgresStore(Store):
    placeholder = "%s"

    def __init__(self, url: str):
        super().__init__()
        self.url = url
        self._db = self._connect()
        self._writer_db: list = []  # the writer's connection, once it has one
        # Reads from the event loop wait for a network round trip: they wait in this thread.
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="store-reader")
        self._migrate()

    async def read(self, read: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._reader, lambda: read(*args))

    def _connect(self):
        import psycopg  # only when PostgreSQL is asked for

        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as e:
            raise StoreError(f"cannot connect to {redact(self.url)}: {e}") from None

    @contextmanager
    def _transaction(self):
        with self._lock:
            with self._connection().transaction(), self._db.cursor() as cur:
                yield cur

    def _writer_transaction(self):
        db = self._writer_db

        @contextmanager
        def transaction():
            if not db or db[0].closed:  # as _connection: the next batch reconnects
                db[:] = [self._connect()]
            with db[0].transaction(), db[0].cursor() as cur:
                yield cur
        return transaction

    @contextmanager
    def reading(self):
        with self._lock:
            with self._connection().cursor() as cur:  # autocommit: one statement, one snapshot
                yield cur

    def _connection(self):
        if self._db.closed:  # lost with a server restart or failover: the next call reconnects
            self._db = self._connect()
        return self._db

    def _lock_schema(self, cur) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))

    def close(self) -> None:
        self._close_writer()
        self._reader.shutdown()
        with self._lock:
            self._db.close()
            for db in self._writer_db:
                db.close()


def _values(states) -> list[str]:
    return sorted(s.value for s in states)


def _marks(states) -> str:
    return ", ".join("?" * len(states))


def _edges(event: Event, column: str = "outcome", edges: dict | None = None) -> tuple[str, list[str]]:
    """SQL for the state after `event` from the state in `column`, from the front's transition
    table (never a second copy of it), and its arguments."""
    edges = sources(event) if edges is None else edges
    pairs = sorted((b.value, a.value) for b, a in edges.items() if b is not None)
    return f"CASE {column} {' '.join('WHEN ? THEN ?' for _ in pairs)} END", [v for p in pairs for v in p]


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
