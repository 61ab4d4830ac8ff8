"""The cluster's writer: every step's changed sessions and VMs, group-committed to the store off the
event loop, and what follows from a step held back until they are durable.

The changes of the steps made while one transaction commits go together in the next, in the order
the core made them (the latest object of each id), and each step's follow-up waits for its
transaction. A failed write's changes go again with the next ones.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from provisioner.decide.commands import Step
from provisioner.model.records import Session, Vm
from provisioner.store import Store

log = logging.getLogger(__name__)

WRITE_RETRY_S = 1.0  # wall time between attempts at a write that failed


class StepWriter:
    def __init__(self, store: Store | None, cluster: str):
        self._store = store
        self._cluster = cluster
        # Changes not yet written (the latest object of each id), the future that resolves once
        # they are durable, the one of the transaction committing now, and the task writing.
        self._unsaved: tuple[dict[str, Session], dict[str, Vm]] = ({}, {})
        self._collecting: asyncio.Future | None = None
        self._writing: asyncio.Future | None = None
        self._writing_ids: frozenset[str] = frozenset()
        self._writer: asyncio.Task | None = None

    def write(self, step: Step, then: Callable[[Step], None]) -> None:
        """Queues the step's changes for writing and calls `then(step)` once they are durable
        (and after the steps before it, whose transactions commit first); at once without a store."""
        if self._store is None:
            then(step)
            return
        if step.sessions or step.vms:
            sessions, vms = self._unsaved
            sessions.update((s.id, s) for s in step.sessions)
            vms.update((v.id, v) for v in step.vms)
            if self._collecting is None:
                self._collecting = asyncio.get_running_loop().create_future()
            if self._writer is None:
                self._writer = asyncio.create_task(self._write())
        pending = self._collecting or self._writing
        if pending is None:
            then(step)
        else:
            pending.add_done_callback(lambda f: f.cancelled() or f.exception() or then(step))

    async def durable(self, *session_ids: str) -> None:
        """Returns once every change made so far is durable, or, given sessions, theirs (a read
        that tells of a few sessions does not wait for the writes of others)."""
        unsaved = self._unsaved[0]
        if not session_ids or any(sid in unsaved for sid in session_ids):
            pending = self._collecting or self._writing
        else:
            writing = self._writing_ids
            pending = self._writing if any(sid in writing for sid in session_ids) else None
        if pending is not None:
            await asyncio.shield(pending)

    async def _write(self) -> None:
        """Writes the changes queued while the last transaction committed, one transaction a
        time, until none are left. A failed write's changes go again with the next ones."""
        try:
            while (done := self._collecting) is not None:
                (sessions, vms), self._unsaved, self._collecting = self._unsaved, ({}, {}), None
                self._writing, self._writing_ids = done, frozenset(sessions)
                try:
                    await self._store.sessions.commit_save(sessions.values(), vms.values())
                except Exception as e:
                    log.exception("cluster %s: writing %d sessions and %d VMs failed", self._cluster,
                                  len(sessions), len(vms))
                    for pending, failed in zip(self._unsaved, (sessions, vms)):
                        for key, obj in failed.items():
                            pending.setdefault(key, obj)
                    done.set_exception(e)
                    self._collecting = self._collecting or asyncio.get_running_loop().create_future()
                    await asyncio.sleep(WRITE_RETRY_S)  # wall time on purpose: the database's, not the model's
                else:
                    done.set_result(None)
        finally:
            self._writing, self._writing_ids, self._writer = None, frozenset(), None

    def save_operator_state(self, pool_name: str, body: dict, now: float) -> None:
        """Written through the group commit, in order with the steps' writes, and waited for
        here: an operator's change is rare, and durable when the call returns."""
        if self._store is not None:
            store = self._store
            store.writer.submit(
                lambda _cur: store.operator.save_operator_state(self._cluster, pool_name, body, now)).result()

    async def close(self) -> None:
        """Waits for what was queued to be written (before the store closes)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
