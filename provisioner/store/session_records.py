"""A cluster's sessions and VMs, and a VM's layer and history rows.

A VM's disk cache and history are rows of their own, so a write carries the layers and state
changes that changed instead of the whole VM each time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from provisioner.model.records import Session, Vm, created_ns
from provisioner.model.states import SESSION_TERMINAL, SessionState, VmState
from provisioner.store.sql import marks, values

if TYPE_CHECKING:
    from provisioner.store.engine import Store

_LIVE = frozenset(SessionState) - SESSION_TERMINAL  # sessions not ended


@dataclass(frozen=True)
class _VmRows:
    """What the database holds of one VM's layers and history, as of the last commit."""

    layers: dict[str, tuple[int, float]]  # layer id -> (size, last use)
    history: int  # state changes written
    last: tuple | None  # the last one written: a history rewritten since no longer ends with it


_NO_ROWS = _VmRows({}, 0, None)


class SessionRecords:
    """A cluster's sessions and VMs, over the store's engine. It remembers what the database holds
    of each VM's layers and history, so a save writes only the rows that changed."""

    def __init__(self, db: Store):
        self._db = db
        self._vm_rows: dict[str, _VmRows] = {}

    def save(self, sessions: Iterable[Session], vms: Iterable[Vm]) -> None:
        """Writes a batch of changed objects in one transaction. Sessions are never erased: an
        ended one keeps its reason and GPU time for billing and quotas."""
        self._save_rows(sessions, vms)()

    async def commit_save(self, sessions: Iterable[Session], vms: Iterable[Vm]) -> None:
        """`save`, group-committed. The objects are read now, on the caller's thread (the
        writer thread must not read objects the event loop goes on changing)."""
        await self._db.commit(self._save_rows(sessions, vms))

    def _save_rows(self, sessions: Iterable[Session], vms: Iterable[Vm]) -> Callable[[], None]:
        """The rows of a save, made now; the returned function writes them."""
        # The request_id column holds the user-scoped request key, unique within the cluster.
        s_rows = [(s.id, s.cluster, s.spec.key, s.spec.user_id, s.state.value, s.revision, s.ended_at,
                   created_ns(s.created_at), json.dumps(s.to_dict())) for s in sessions]
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
        with self._db.transaction() as cur:
            self._db.on_commit(lambda: self._remember_vm_rows(written))
            if rewritten:
                cur.executemany(self._db.sql("DELETE FROM vm_history WHERE vm_id = ?"), rewritten)
            if history:
                cur.executemany(self._db.sql("INSERT INTO vm_history (vm_id, seq, state, reason, at) "
                                          "VALUES (?, ?, ?, ?, ?) ON CONFLICT (vm_id, seq) DO NOTHING"), history)
            if gone:
                cur.executemany(self._db.sql("DELETE FROM vm_layers WHERE vm_id = ? AND layer_id = ?"), gone)
            if layers:
                cur.executemany(self._db.sql(
                    "INSERT INTO vm_layers (vm_id, layer_id, size_bytes, used_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (vm_id, layer_id) DO UPDATE SET size_bytes = excluded.size_bytes, "
                    "used_at = excluded.used_at"), layers)
            if s_rows:
                cur.executemany(self._db.sql(
                    "INSERT INTO sessions (id, cluster, request_id, user_id, state, revision, ended_at, created_ns, "
                    "body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
                    "revision = excluded.revision, ended_at = excluded.ended_at, body = excluded.body"), s_rows)
            if v_rows:
                cur.executemany(self._db.sql(
                    "INSERT INTO vms (id, cluster, pool, state, revision, body) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, revision = excluded.revision, "
                    "body = excluded.body"), v_rows)

    def load_sessions(self, cluster: str, ended_since: float | None = None) -> list[Session]:
        """The cluster's sessions; given `ended_since`, only those not ended and those ended since."""
        if ended_since is None:
            rows = self._db.rows("SELECT body FROM sessions WHERE cluster = ?", (cluster,))
        else:
            rows = self._db.rows(f"SELECT body FROM sessions WHERE cluster = ? AND state IN ({marks(_LIVE)}) "
                              "UNION ALL SELECT body FROM sessions WHERE cluster = ? AND ended_at >= ? "
                              f"AND state NOT IN ({marks(_LIVE)})",
                              (cluster, *values(_LIVE), cluster, ended_since, *values(_LIVE)))
        return sorted((Session.from_dict(json.loads(body)) for (body,) in rows), key=lambda s: (s.created_at, s.id))

    def load_session(self, cluster: str, session_id: str) -> Session | None:
        rows = self._db.rows("SELECT body FROM sessions WHERE id = ? AND cluster = ?", (session_id, cluster))
        return Session.from_dict(json.loads(rows[0][0])) if rows else None

    def load_session_by_request(self, cluster: str, key: str) -> Session | None:
        rows = self._db.rows("SELECT body FROM sessions WHERE cluster = ? AND request_id = ?", (cluster, key))
        return Session.from_dict(json.loads(rows[0][0])) if rows else None

    def load_user_ended_sessions(self, cluster: str, user_id: str, ended_after: float | None,
                                 ended_before: float) -> list[Session]:
        """The user's ended sessions ("": every user's) that ended in [ended_after, ended_before]
        (from the start without `ended_after`)."""
        mine = "AND user_id = ? " if user_id else ""
        rows = self._db.rows(f"SELECT body FROM sessions WHERE cluster = ? {mine}AND state NOT IN "
                          f"({marks(_LIVE)}) AND ended_at >= ? AND ended_at <= ?",
                          (cluster, *([user_id] if user_id else []), *values(_LIVE),
                           ended_after if ended_after is not None else 0.0, ended_before))
        return [Session.from_dict(json.loads(body)) for (body,) in rows]

    def user_sessions_page(self, cluster: str, user_id: str, position: tuple[int, str] | None,
                           created_after_ns: int | None, created_before_ns: int, limit: int) -> list[Session]:
        """Up to `limit` of the user's ended sessions made before `created_before_ns` (and at or
        after `created_after_ns`), after `position` (creation ns, id), newest first: a range of
        the index sessions_user_created."""
        bound = position if position is not None and position < (created_before_ns, "") else (created_before_ns, "")
        since = "AND created_ns >= ? " if created_after_ns is not None else ""
        rows = self._db.rows(f"SELECT body FROM sessions WHERE cluster = ? AND user_id = ? AND (created_ns, id) < (?, ?) "
                             f"{since}AND state NOT IN ({marks(_LIVE)}) ORDER BY created_ns DESC, id DESC LIMIT ?",
                             (cluster, user_id, *bound, *([created_after_ns] if since else []), *values(_LIVE), limit))
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
        bodies = {vm_id: json.loads(body) for vm_id, body in self._db.rows(
            "SELECT id, body FROM vms WHERE cluster = ? AND state <> 'deleted'", (cluster,))}
        layers: dict[str, list] = {}
        for vm_id, lid, size, used_at in self._db.rows(
                f"SELECT vm_id, layer_id, size_bytes, used_at FROM vm_layers WHERE vm_id IN ({live})", (cluster,)):
            layers.setdefault(vm_id, []).append([lid, size, used_at])
        history: dict[str, list] = {}
        for vm_id, state, reason, at in self._db.rows(
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
