"""The live shell around ClusterCore: turns requests, ticks, health checks, reconciler passes and
the cloud's answers into events, and carries out each Step the core returns. No gRPC here.

Order after every step: write the changes, wake watchers, then start the cloud work. So nothing
is acknowledged or acted on before it is durable. The writes are group-committed off the event
loop: the changes of the steps made while one transaction commits go together in the next, in the
order the core made them, and each step's watchers and commands wait for its transaction. A
caller answering a request awaits `durable()` first. Every command runs as a
task whose outcome, whatever it is (an answer, a failure, an exception), goes back to the core
as an event naming the command.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from typing import AsyncIterator, Awaitable, Callable, Iterable

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from provisioner.observability import telemetry
from provisioner.api.keyset import Key, Part, merge
from provisioner.common.clock import Clock
from provisioner.cluster.capacity import CapacityCounts
from provisioner.cluster.listing import Filter, SessionIndex, session_key
from provisioner.cloud.base import (
    LABEL_CLUSTER,
    LABEL_POOL,
    LABEL_REQUEST,
    LABEL_SESSION,
    CloudBackend,
    CloudFailure,
    LaunchSpec,
    NotebookRequest,
)
from provisioner.config import PoolConfig
from provisioner.decide import events as ev
from provisioner.decide.commands import (Command, Delete, Launch, Pull, Start, StartNotebook, Step, Stop,
                                         StopNotebook, Wipe)
from provisioner.decide.core import ClusterCore
from provisioner.decide.pools import PoolState
from provisioner.decide.policy import FIELDS, merge_policy
from provisioner.decide.reconcile import Plan, reconcile
from provisioner.model.states import SessionState, VmState
from provisioner.decide.zone_memory import ProjectQuota
from provisioner.model.errors import ProvisionerError, Unavailable
from provisioner.observability.logs import SessionLog
from provisioner.model.records import Session, SessionSpec, Vm, created_ns
from provisioner.store import SqliteStore

log = logging.getLogger(__name__)

HEALTH_CHECK_S = 60.0  # each warm and assigned VM's health is read once in this
HEALTH_SLICE_S = 1.0  # a slice of them is read this often, so the reads spread over the period
HEALTH_CHUNK = 200  # VMs checked between two yields to the event loop (and written as one step)
RECONCILE_S = 300.0
WRITE_RETRY_S = 1.0  # wall time between attempts at a write that failed
MOVE_REPORT_S = 2.0  # wall time between two reports to a watcher of its session moving up the queue


class ClusterRuntime:
    def __init__(self, core: ClusterCore, backend: CloudBackend, clock: Clock, store: SqliteStore | None = None,
                 tracer_provider: trace.TracerProvider | None = None, move_report_s: float = MOVE_REPORT_S):
        self.core = core
        self.move_report_s = move_report_s  # least wall time between two reports of a watch's moves
        self.tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self.backend = backend
        self.clock = clock
        self.store = store
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self._watchers: dict[str, set[_Watch]] = {}
        self._unclaimed: dict[str, float] = {}  # VMs seen in the cloud with no record, since when
        # Replaced on every notice, so each capacity stream sees every change (none clears it for others).
        self._capacity_changed = asyncio.Event()
        self.capacity = CapacityCounts(core)
        # Each user's sessions in memory in list order, so a user's List (every create's quota
        # check, a page of ListSessions) reads theirs only, not every session in memory.
        self.index = SessionIndex(core.sessions)
        # Flagged sessions in memory (provisioner/decide/abuse_watch.py), each with the number it was
        # noted as, in order, so a capacity stream sends each once, and once durable.
        self._flags: dict[str, tuple[int, Session]] = {}
        self._flags_noted = 0
        # Set when draining: open streams end instead of holding the shutdown.
        self.streams_closed = False
        # The VMs whose health is still to be read this period, how many are read a slice, and when
        # the next period starts.
        self._health_due: list[Vm] = []
        self._health_slice = 0
        self._health_round_at = float("-inf")
        # pool -> the policy fields operators set that differ from the config file (also in the store).
        self.overrides: dict[str, dict] = {}
        # Told of the changed sessions after each event (restored ones once, flagged): logs, metrics.
        self.observers: list[Callable[[list[Session], bool], None]] = [SessionLog(core.name).changed]
        # Changes not yet written (the latest object of each id), the future that resolves once
        # they are durable, the one of the transaction committing now, and the task writing.
        self._unsaved: tuple[dict[str, Session], dict[str, Vm]] = ({}, {})
        self._collecting: asyncio.Future | None = None
        self._writing: asyncio.Future | None = None
        self._writing_ids: frozenset[str] = frozenset()
        self._writer: asyncio.Task | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Restores from the store, reconciles with the cloud, then runs the control loops."""
        if self.store is not None:
            name = self.core.name
            retention = self.core.sessions_config.retention_s
            ended_since = self.clock.now() - retention if retention else None  # older ones stay in the store
            sessions, vms = self.store.load_sessions(name, ended_since), self.store.load_vms(name)
            step = self.core.handle(ev.Restored(self.clock.now(), tuple(sessions), tuple(vms)))
            self.capacity.recount()
            self.index.note(self.core.sessions.values())
            for observe in self.observers:
                observe(list(self.core.sessions.values()), True)
            self._note_flags(self.core.sessions.values())  # what the fronts may not have heard
            self._apply(step)
            self._restore_operator_state(self.store.load_operator_state(name))
            await self.durable()
        try:
            await self.reconcile()
        except Exception:
            log.exception("cluster %s: reconciling with the cloud at start failed; the loop retries", self.core.name)
        self._loops = [
            asyncio.create_task(self._supervise("tick", self.core.config.tick_s, self._tick)),
            asyncio.create_task(self._supervise("health", HEALTH_SLICE_S, self._check_health_slice)),
            asyncio.create_task(self._supervise("reconcile", RECONCILE_S, self.reconcile)),
        ]

    def handle(self, *events: ev.Event) -> Step:
        """The core handles the events; its step is persisted, told and started here."""
        step = self.core.handle(*events)
        self._apply(step)
        return step

    def set_catalog(self, catalog) -> None:
        """A refreshed image catalog (provisioner/registry/catalog.py: CatalogFeed)."""
        self.handle(ev.CatalogChanged(self.clock.now(), catalog))

    async def reconcile(self) -> Plan:
        """Compares the records with the cloud's inventory and settles the differences."""
        cloud = await self.backend.list_vms(self.core.name)
        now = self.clock.now()
        plan = reconcile(self.core.vms.values(), cloud, now, self._unclaimed)
        self._unclaimed = plan.unclaimed_since
        self.handle(ev.Reconciled(now, plan))
        for vm in plan.strays:
            log.warning("cluster %s: deleting VM %s in %s, which no record claims", self.core.name, vm.vm_id, vm.zone,
                        extra={"cluster": self.core.name, "vm_id": vm.vm_id})
            self._spawn(self._delete_stray(vm.vm_id, vm.zone))
        if plan.changes:
            log.info("cluster %s reconciled: %d lost, %d deleted, %d deletes retried, %d strays",
                     self.core.name, len(plan.lost), len(plan.deleted), len(plan.retry_delete), len(plan.strays))
        return plan

    async def _delete_stray(self, vm_id: str, zone: str) -> None:
        failure = await self.backend.delete(vm_id, zone)
        if failure is not None:
            log.warning("cluster %s: deleting stray VM %s failed (%s); the next pass retries",
                        self.core.name, vm_id, failure.code)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def end_streams(self) -> None:
        """Ends every Watch and WatchCapacity stream (their clients resume where they were)."""
        self.streams_closed = True
        for watches in self._watchers.values():
            for w in watches:
                w.end()
        self._notify_capacity()

    async def close(self) -> None:
        self.end_streams()
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)
        if self._writer is not None:  # what was made is written before the store closes
            await asyncio.gather(self._writer, return_exceptions=True)
        await self.backend.close()

    async def _supervise(self, name: str, period_s: float, step: Callable[[], Awaitable[None]]) -> None:
        """Runs `step` every period; an escaped exception is logged and the loop goes on.

        Steps never overlap: the next one starts a full period after the last one ended.
        """
        while True:
            await self.clock.sleep(period_s)
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s loop of cluster %s failed; continuing", name, self.core.name)

    async def _tick(self) -> None:
        self.handle(ev.Tick(self.clock.now()))

    async def _check_health_slice(self) -> None:
        """Reads the health of the next slice of the warm and assigned VMs, so that each is read
        once a HEALTH_CHECK_S and the reads are spread evenly over it: at x30, a pass over 8,000
        VMs at once held up every call in flight for about a tenth of a second."""
        if not self._health_due:
            if self.clock.now() < self._health_round_at:  # the last round was quicker than a period
                return
            self._health_round_at = self.clock.now() + HEALTH_CHECK_S
            self._health_due = self._checkable()
            self._health_slice = math.ceil(len(self._health_due) * HEALTH_SLICE_S / HEALTH_CHECK_S)
        batch, self._health_due = self._health_due[:self._health_slice], self._health_due[self._health_slice:]
        await self._check(batch)

    def _checkable(self) -> list[Vm]:
        return [vm for vm in self.core.vms.values() if vm.state in (VmState.WARM, VmState.ASSIGNED)]

    async def _check(self, vms: list[Vm]) -> None:
        """Checks `vms` in chunks, yielding between them; each chunk's reports are one step. A VM
        that left the warm and assigned states, or turned unhealthy, since it was listed is left."""
        for start in range(0, len(vms), HEALTH_CHUNK):
            reports = []
            for vm in vms[start:start + HEALTH_CHUNK]:
                if vm.state in (VmState.WARM, VmState.ASSIGNED) and vm.healthy:
                    report = await self.backend.health(vm.id, vm.zone)
                    reports.append(ev.HealthReported(self.clock.now(), vm.id, report))
            self.handle(*reports)
            await asyncio.sleep(0)

    # ---- requests (called by the gRPC services) -------------------------------------------

    def allocate(self, spec: SessionSpec) -> Session:
        if (old := self._stored_for_request(spec.key)) is not None:  # made long ago: the same answer
            return old
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return self.handle(ev.SessionRequested(self.clock.now(), spec, carrier)).reply

    def touch(self, session_id: str, user_id: str = "") -> Session:
        if (old := self._stored(session_id, user_id)) is not None:  # ended long ago: nothing to do
            return old
        return self.handle(ev.SessionTouched(self.clock.now(), session_id, user_id)).reply

    def stop(self, session_id: str, reason: str, user_id: str = "") -> Session:
        if (old := self._stored(session_id, user_id)) is not None:
            return old
        return self.handle(ev.StopRequested(self.clock.now(), session_id, reason, user_id)).reply

    def set_budget_end(self, session_id: str, ends_at: float) -> Session:
        """NotFound if the session is unknown; an ended one is returned as it is."""
        if (old := self._stored(session_id)) is not None:
            return old
        self.core.get(session_id)  # NotFound, with the core's wording
        return self.handle(ev.BudgetSet(self.clock.now(), session_id, ends_at)).reply

    def set_blocked_users(self, user_ids: frozenset[str]) -> None:
        self.handle(ev.BlockedUsersSet(self.clock.now(), user_ids))

    def tell_project_quota(self, quota: ProjectQuota) -> None:
        """A front relays the project-wide GPU quota another cluster found exhausted."""
        if self.handle(ev.ProjectQuotaTold(self.clock.now(), quota)).reply:
            log.warning("cluster %s: the project's %s quota is exhausted (found by %s): no GPU VM is inserted or "
                        "started until it may have been freed", self.core.name, quota.metric, quota.cluster,
                        extra={"cluster": self.core.name})
            self._notify_capacity()  # the fronts hear this cluster holds it, even from a quiet cluster

    def discard(self, key: str, reason: str) -> bool:
        return self.handle(ev.DiscardRequested(self.clock.now(), key, reason)).reply is not None

    def prewarm(self, pool: str, image: str, count: int) -> list[str]:
        return self.handle(ev.PrewarmRequested(self.clock.now(), pool, image, count)).reply

    def evict(self, vm_id: str, reason: str) -> Vm:
        return self.handle(ev.EvictRequested(self.clock.now(), vm_id, reason)).reply

    # ---- reads (for the gRPC services) -----------------------------------------------------

    @property
    def name(self) -> str:
        return self.core.name

    @property
    def region(self) -> str:
        return self.core.config.region

    @property
    def draining(self) -> bool:
        return self.core.draining

    @property
    def catalog(self):
        return self.core.catalog

    # Sessions ended longer ago than sessions.retention_s are no longer in memory: the store has them.

    def get(self, session_id: str, user_id: str = "") -> Session:
        return self._stored(session_id, user_id) or self.core.get(session_id, user_id)

    def get_by_request(self, key: str) -> Session:
        return self._stored_for_request(key) or self.core.get_by_request(key)

    def knows_request(self, key: str) -> bool:
        return key in self.core.by_request or self._stored_for_request(key) is not None

    def sessions(self, user_id: str = "", ended_after: float | None = None) -> list[Session]:
        """The sessions in memory and those ended long ago (since `ended_after`), of a user or, for
        "", of every user (an operator's list; with `ended_after`, as the budget enforcer asks,
        memory only: it asks after recent ends)."""
        if self.store is None or (not user_id and ended_after is not None):
            return list(self.core.sessions.values())
        if not user_id:
            return self._with_older(dict(self.core.sessions), "", None)
        ids = self.index.user_ids(user_id)
        return self._with_older({sid: self.core.sessions[sid] for sid in ids}, user_id, ended_after)

    def list_page(self, user_id: str, want: Filter, position: Key | None,
                  limit: int) -> tuple[list[Session], Key | None]:
        """A page of the user's sessions after `position`, newest first, and the position of the
        next (None: the last page): from memory, and from the store for those that ended before
        the retention period (each source read from the position for a page at most)."""
        parts = [held := self.index.page(user_id, want, position, limit)]
        retention = self.core.sessions_config.retention_s
        if self.store is not None and retention and not want.live_only:
            cutoff = created_ns(self.clock.now() - retention)  # an older ended one was made before it
            end = cutoff if want.created_before is None else min(cutoff, want.created_before)
            if held.more_after is not None and held.more_after >= (end, ""):
                return held.rows, held.more_after  # the store's sessions all come after this page
            older = self.store.user_sessions_page(self.core.name, user_id, position, want.created_after, end, limit)
            more = session_key(older[-1]) if len(older) == limit else None
            self.index.rows_read += len(older)
            parts.append(Part([s for s in older if s.id not in self.core.sessions and want.matches(s, session_key(s))],
                              more))
        rows, positions = merge(parts, session_key, limit)
        going_on = [p for p in positions if p is not None]
        return rows, (max(going_on) if going_on else None)

    def _with_older(self, held: dict[str, Session], user_id: str, ended_after: float | None) -> list[Session]:
        # Memory holds every live session and every one that ended within the retention period
        # (restored at start, forgotten only once past it): the store is read for older ones only.
        retention = self.core.sessions_config.retention_s
        cutoff = self.clock.now() - retention
        if not retention or (ended_after is not None and ended_after > cutoff):
            return list(held.values())
        older = self.store.load_user_ended_sessions(self.core.name, user_id, ended_after, cutoff)
        return [*held.values(), *(s for s in older if s.id not in held)]

    def _stored(self, session_id: str, user_id: str = "") -> Session | None:
        """A session no longer in memory, from the store (None if it is in memory, or nowhere)."""
        if session_id in self.core.sessions or self.store is None:
            return None
        s = self.store.load_session(self.core.name, session_id)
        return s if s is not None and (not user_id or s.spec.user_id == user_id) else None

    def _stored_for_request(self, key: str) -> Session | None:
        if key in self.core.by_request or self.store is None:
            return None
        return self.store.load_session_by_request(self.core.name, key)

    def pools(self) -> list[PoolState]:
        return list(self.core.pools.values())

    def pool(self, name: str) -> PoolState:
        return self.core.pool(name)

    def snapshot(self, pool: PoolState):
        return self.core.snapshot(pool)

    def cold_start_s(self) -> float:
        return self.core.cold_start_s()

    # ---- operator state: durable before it takes effect ----------------------------------

    def set_draining(self, draining: bool) -> None:
        self._save_operator_state("", {"draining": True} if draining else {})
        self.handle(ev.DrainSet(self.clock.now(), draining))
        self._notify_capacity()  # the front hears it at once, even from a quiet cluster

    def set_policy(self, pool_name: str, changes: dict, reset: bool = False) -> PoolConfig:
        """Applies `changes` (None: unchanged) to a pool's policy within its bounds; `reset` first
        drops what operators set before, back to the config file. The pool's overrides are
        written before they take effect."""
        merged, overrides = self._overridden(pool_name, changes, reset)
        self._save_operator_state(pool_name, overrides)
        return self._set_policy(pool_name, merged, overrides)

    def _save_operator_state(self, pool_name: str, body: dict) -> None:
        """Written through the group commit, in order with the steps' writes, and waited for
        here: an operator's change is rare, and durable when the call returns."""
        if self.store is not None:
            now = self.clock.now()
            self.store.writer.submit(
                lambda _cur: self.store.save_operator_state(self.core.name, pool_name, body, now)).result()

    def _overridden(self, pool_name: str, changes: dict, reset: bool) -> tuple[PoolConfig, dict]:
        """The pool's whole policy after `changes` (the config model, validated as the file is),
        and the part of it that differs from the file."""
        pool = self.core.pool(pool_name)
        file = {f: getattr(pool.config, f) for f in FIELDS}
        earlier = {} if reset else self.overrides.get(pool_name, {})
        merged = merge_policy({**file, **earlier}, changes, pool.config.vm_ceiling)
        policy = PoolConfig.model_validate({**pool.config.model_dump(), **merged})
        return policy, {f: merged[f] for f in FIELDS if merged[f] != file[f]}

    def _set_policy(self, pool_name: str, policy: PoolConfig, overrides: dict) -> PoolConfig:
        self.overrides[pool_name] = overrides
        return self.handle(ev.PolicySet(self.clock.now(), pool_name, policy)).reply

    def _restore_operator_state(self, state: dict[str, dict]) -> None:
        """Drain and policy overrides as operators left them. An override the config file no
        longer allows (a pool removed, a lower max_vms_limit) is skipped, with a warning."""
        self.handle(ev.DrainSet(self.clock.now(), bool(state.get("", {}).get("draining"))))
        for pool_name, overrides in state.items():
            if not pool_name:
                continue
            try:
                merged, kept = self._overridden(pool_name, {f: v for f, v in overrides.items() if f in FIELDS}, True)
            except ProvisionerError as e:
                log.warning("cluster %s: the policy operators set on pool %s no longer applies (%s); the pool "
                            "follows its config file", self.core.name, pool_name, e.message)
                continue
            self._set_policy(pool_name, merged, kept)
        if self.core.draining:
            log.info("cluster %s is draining, as an operator left it (undo: provisioner admin undrain %s)",
                     self.core.name, self.core.name)

    async def watch(self, session_id: str, after_revision: int = 0, user_id: str = "") -> AsyncIterator[Session]:
        """The session now (if newer than after_revision, or queued: its place may have moved),
        then each change, and its moves in the queue (at most one report per `move_report_s`, of
        the latest place), until it ends."""
        current = self.get(session_id, user_id)
        if self.streams_closed:
            raise Unavailable("the cluster is shutting down")
        watch = _Watch(asyncio.get_running_loop(), self.move_report_s)
        self._watchers.setdefault(session_id, set()).add(watch)
        try:
            place = None  # the queue position last told
            if current.revision > after_revision or current.state is SessionState.QUEUED:
                after_revision, place = current.revision, current.queue_position
                yield _snapshot(current)
            if current.terminal:
                return
            while (s := await watch.reports.get()) is not None:
                if s.revision > after_revision or (s.revision == after_revision and s.queue_position != place):
                    after_revision, place = s.revision, s.queue_position
                    yield s
                if s.terminal:
                    return
        finally:
            watch.end()
            self._watchers[session_id].discard(watch)
            if not self._watchers[session_id]:
                del self._watchers[session_id]

    def flagged(self, after: int = 0) -> tuple[int, list[Session]]:
        """The flagged sessions in memory noted after number `after`, and the last number noted."""
        for gone in [sid for sid in self._flags if sid not in self.core.sessions]:
            del self._flags[gone]
        return self._flags_noted, [s for n, s in self._flags.values() if n > after]

    def _note_flags(self, sessions: Iterable[Session]) -> None:
        for s in sessions:
            if s.abuse is not None and s.id not in self._flags:
                self._flags_noted += 1
                self._flags[s.id] = (self._flags_noted, s)

    def capacity_notice(self) -> asyncio.Event:
        """Set at the next change of capacity (or when the streams end): taken before a push, so
        a change made while a stream waits out its interval is not missed."""
        return self._capacity_changed

    def _notify_capacity(self) -> None:
        self._capacity_changed.set()
        self._capacity_changed = asyncio.Event()

    # ---- carrying out a step -------------------------------------------------------------

    def _apply(self, step: Step) -> None:
        """Queues the step's changes for writing; what follows from them waits until they are
        durable (and after the steps before it, whose transactions commit first)."""
        self.capacity.changed(step.vms)
        self.index.note(step.sessions)
        if self.store is None:
            self._carry_out(step)
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
            self._carry_out(step)
        else:
            pending.add_done_callback(lambda f: f.cancelled() or f.exception() or self._carry_out(step))

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
                    await self.store.commit_save(sessions.values(), vms.values())
                except Exception as e:
                    log.exception("cluster %s: writing %d sessions and %d VMs failed", self.core.name,
                                  len(sessions), len(vms))
                    for pending, failed in zip(self._unsaved, (sessions, vms)):
                        for key, obj in failed.items():
                            pending.setdefault(key, obj)
                    done.set_exception(e)
                    self._collecting = self._collecting or asyncio.get_running_loop().create_future()
                    await asyncio.sleep(WRITE_RETRY_S)
                else:
                    done.set_result(None)
        finally:
            self._writing, self._writing_ids, self._writer = None, frozenset(), None

    def _carry_out(self, step: Step) -> None:
        """Tells observers and watchers of a durable step, and starts its commands."""
        sessions, vms = step.sessions, step.vms
        for observe in self.observers:
            observe(sessions, False)
        for s in sessions:
            for w in self._watchers.get(s.id, ()):
                w.changed(s)
        for s in step.moved:
            for w in self._watchers.get(s.id, ()):
                w.moved(s)
        self._note_flags(sessions)
        if sessions or vms:  # a new flag is a changed session: the streams send it at once
            self._notify_capacity()
        for cmd in step.commands:
            self._spawn(self._run(cmd))

    async def _run(self, cmd: Command) -> None:
        """Carries out one command inside the trace of the session it serves. An exception is
        the command's failure: the core hears of it like any other."""
        session = self.core.sessions.get(cmd.session_id) if cmd.session_id else None
        parent = propagate.extract(session.trace_context) if session else otel_context.Context()
        name = f"cluster.{type(cmd).__name__.lower()}"
        attrs = {telemetry.ATTR_CLUSTER: self.core.name, telemetry.ATTR_VM_ID: cmd.vm_id}
        if session is not None:
            attrs |= {telemetry.ATTR_SESSION_ID: session.id, telemetry.ATTR_POOL: session.pool,
                      telemetry.ATTR_IMAGE: session.image}
        with self.tracer.start_as_current_span(name, context=parent, attributes=attrs):
            try:
                match cmd:
                    case Launch():
                        await self._launch(cmd)
                    case Pull():
                        await self._pull(cmd)
                    case Wipe():
                        self._answered(cmd, await self.backend.wipe(cmd.vm_id, cmd.zone), ev.WipeDone)
                    case Delete():
                        self._answered(cmd, await self.backend.delete(cmd.vm_id, cmd.zone), ev.VmDeleted)
                    case Stop():
                        self._answered(cmd, await self.backend.stop(cmd.vm_id, cmd.zone), ev.VmStopped)
                    case Start():
                        await self._start(cmd)
                    case StartNotebook():
                        await self._start_notebook(cmd)
                    case StopNotebook():
                        self._answered(cmd, await self.backend.stop_notebook(cmd.vm_id, cmd.zone, cmd.session_id),
                                       ev.NotebookStopped)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("command %s failed in cluster %s", cmd, self.core.name, exc_info=True,
                            extra={"cluster": self.core.name, "vm_id": cmd.vm_id, "session_id": cmd.session_id})
                failure = CloudFailure("internal", f"{type(e).__name__}: {e}"[:500], cmd.zone)
                self.handle(ev.CommandFailed(self.clock.now(), cmd.id, failure))

    def _answered(self, cmd: Command, failure: CloudFailure | None, done: type) -> None:
        now = self.clock.now()
        self.handle(done(now, cmd.id) if failure is None else ev.CommandFailed(now, cmd.id, failure))

    async def _launch(self, cmd: Launch) -> None:
        pool = self.core.pools[cmd.pool].config
        labels = {LABEL_CLUSTER: self.core.name, LABEL_POOL: cmd.pool, LABEL_REQUEST: cmd.vm_id}
        if cmd.session_id:
            labels[LABEL_SESSION] = cmd.session_id.replace(".", "_")
        spec = LaunchSpec(vm_id=cmd.vm_id, cluster=self.core.name, pool=cmd.pool, zone=cmd.zone,
                          machine_type=pool.machine_type, accelerator=pool.accelerator,
                          accelerator_count=pool.accelerator_count, labels=labels, images=cmd.images)
        created = await self.backend.create(spec)
        if isinstance(created, CloudFailure):
            self.handle(ev.CommandFailed(self.clock.now(), cmd.id, created))
            return
        self.handle(ev.VmCreated(self.clock.now(), cmd.id, created.endpoint))
        ready = await self.backend.wait_ready(cmd.vm_id, cmd.zone)
        if isinstance(ready, CloudFailure):
            self.handle(ev.CommandFailed(self.clock.now(), cmd.id, ready))
        else:
            self.handle(ev.VmReady(self.clock.now(), cmd.id, ready.endpoint))

    async def _start_notebook(self, cmd: StartNotebook) -> None:
        vm, s = self.core.vms.get(cmd.vm_id), self.core.sessions.get(cmd.session_id)
        pool = self.core.pools[vm.pool].config if vm is not None else None
        # The secret is read here, not carried in the command (commands are logged).
        request = NotebookRequest(cmd.session_id, cmd.user, self.core.name, cmd.image,
                                  pool.accelerator_count if pool else 0, cmd.repository, cmd.digest,
                                  s.access_token if s is not None else "", pool.notebook_cpus if pool else 0.0,
                                  int(pool.notebook_memory_gb * 2**30) if pool else 0)
        started = await self.backend.start_notebook(cmd.vm_id, cmd.zone, request)
        if isinstance(started, CloudFailure):
            self.handle(ev.CommandFailed(self.clock.now(), cmd.id, started))
        else:
            self.handle(ev.NotebookStarted(self.clock.now(), cmd.id, started))

    async def _start(self, cmd: Start) -> None:
        started = await self.backend.start(cmd.vm_id, cmd.zone)
        if not isinstance(started, CloudFailure):
            started = await self.backend.wait_ready(cmd.vm_id, cmd.zone)
        if isinstance(started, CloudFailure):
            self.handle(ev.CommandFailed(self.clock.now(), cmd.id, started))
        else:
            self.handle(ev.VmStarted(self.clock.now(), cmd.id, started.endpoint))

    async def _pull(self, cmd: Pull) -> None:
        def progress(done: int) -> None:
            self.handle(ev.PullProgress(self.clock.now(), cmd.id, done))

        self._answered(cmd, await self.backend.pull(cmd.vm_id, cmd.zone, cmd.layers, progress, cmd.repository,
                                                    cmd.digest), ev.PullDone)

    def vms(self) -> list[Vm]:
        return list(self.core.vms.values())


class _Watch:
    """One watch's reports: each change of its session, in order, and its moves in the queue at
    most one report per `interval_s`, of the latest place. In a long queue every departure from
    its head moves every session behind it: a report per move to every watcher would cost the
    cluster, the front and each client more than the moves cost the core."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float):
        self.reports: asyncio.Queue[Session | None] = asyncio.Queue()
        self._loop, self._interval_s = loop, interval_s
        self._move_told_at = -math.inf  # the loop's time of the last move reported
        self._held: Session | None = None  # moved since then: reported when the interval is over
        self._timer: asyncio.TimerHandle | None = None

    def changed(self, s: Session) -> None:
        self._drop_held()  # the change's report carries the place too
        self.reports.put_nowait(_snapshot(s))

    def moved(self, s: Session) -> None:
        now = self._loop.time()
        if self._timer is not None:
            self._held = s
        elif now - self._move_told_at >= self._interval_s:
            self._tell_move(s)
        else:
            self._held = s
            self._timer = self._loop.call_at(self._move_told_at + self._interval_s, self._release)

    def end(self) -> None:
        self._drop_held()
        self.reports.put_nowait(None)

    def _release(self) -> None:
        self._timer = None
        held, self._held = self._held, None
        if held is not None:
            self._tell_move(held)  # as it stands now: the latest place

    def _tell_move(self, s: Session) -> None:
        self._move_told_at = self._loop.time()
        self.reports.put_nowait(_snapshot(s))

    def _drop_held(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held = None


def _snapshot(s: Session) -> Session:
    """A copy that later changes do not reach (watchers may read it after the next event)."""
    return dataclasses.replace(s, history=list(s.history))
