"""One cluster's logic: sessions, VMs, queue, culling, autoscaling. No I/O, no clock, no asyncio.

`ClusterCore.handle(*events) -> Step` is the only way in: typed events (provisioner.decide.events)
with the time they happened go in; the commands for the cloud, the records to persist and the
answer to a request come out. A thin shell carries the commands out and feeds the answers back
as events: the live cluster runtime with real RPCs and a cloud backend, the simulator's engine
on a virtual clock, the tests' driver. All three run exactly this code.

Each command has an id, and stays in flight until its final answer, its failure or its deadline
(provisioner.decide.deadlines). An answer to a command no longer in flight (late, duplicated, for
a VM since deleted, or from before a restart) is dropped here, and nowhere else.
"""

from __future__ import annotations

from provisioner.cloud.base import CloudFailure
from provisioner.config import ClusterConfig, SessionsConfig
from provisioner.config.policy import AbuseConfig, PriorityConfig
from provisioner.decide import events as ev
from provisioner.decide.abuse_watch import AbuseWatch
from provisioner.decide.budgets import Budgets
from provisioner.decide.changes import Changes
from provisioner.decide.culling import Culling
from provisioner.decide.commands import Command, Pull, Step
from provisioner.decide.deadlines import Limits
from provisioner.decide.eventlog import EventLog
from provisioner.decide.holdings import Holdings
from provisioner.decide.ids import IdSource
from provisioner.decide.in_flight import InFlight
from provisioner.model.images import ImageCatalog
from provisioner.decide.notebooks import NotebookSteps
from provisioner.decide.pools import Pools, PoolState
from provisioner.decide.prewarming import Prewarming
from provisioner.decide.preemption import Preemption
from provisioner.decide.sessions import Sessions
from provisioner.model.states import SessionState, VmState
from provisioner.decide.vms import VmLifecycle
from provisioner.decide.zone_memory import ProjectQuota, told
from provisioner.model.records import Session, Vm

S, V = SessionState, VmState
# A VM leaving for good takes its other work with it: answers to that work no longer apply.
_GONE = frozenset({V.DELETING, V.FAILED, V.DELETED})


class ClusterCore(Sessions, VmLifecycle, NotebookSteps, Pools):
    def __init__(self, cluster: ClusterConfig, catalog: ImageCatalog, sessions: SessionsConfig,
                 ids: IdSource | None = None, event_log: EventLog | None = None,
                 priority: PriorityConfig | None = None, abuse: AbuseConfig | None = None):
        self.config = cluster
        self.name = cluster.name
        self.catalog = catalog
        self.sessions_config = sessions
        self.priority = priority or PriorityConfig()  # the fleet's classes and shares (decide/preemption_rules.py)
        self._ranks = {name: c.rank for name, c in self.priority.classes.items()}  # the queue's order
        self.ids = ids or IdSource(cluster.name)
        self.event_log = event_log
        # The records: what the shells read through the core (get, get_by_request, sessions, vms, pools).
        self.pools = {p.name: PoolState(p, p) for p in cluster.pools}
        self.sessions: dict[str, Session] = {}
        self.by_request: dict[str, str] = {}  # request key (SessionSpec.key) -> session id
        self.vms: dict[str, Vm] = {}
        self.draining = False
        self.blocked_users: frozenset[str] = frozenset()  # as the front last told (none requeued)
        self.project_quota: ProjectQuota | None = None  # the project's GPU quota, last found exhausted
        self.dropped = 0  # answers to commands no longer in flight
        self._queue_due: list[tuple[float, str]] = []  # (time, session id) when a queued session times out
        self._forget_due: list[tuple[float, str]] = []  # (time, session id) when an ended one leaves memory
        self._failed_tries: dict[str, int] = {}  # session id -> its VMs that failed before it ran
        # The parts, each owning its state: given the records it reads and the acts it may ask for.
        self._in_flight = InFlight(cluster)
        self._changes = Changes()
        self.culling = Culling(self.sessions, self._stop)
        self.prewarming = Prewarming(self.name, self.pools, lambda: self.catalog, self._changes, self._pull)
        self.holdings = Holdings(self.pools, self.priority)
        self.preemption = Preemption(self.sessions, self.pools, self.priority, self.holdings, self._at_user_ceiling,
                                     self._changes.session, self._stop, self._requeue)
        self.budgets = Budgets(self.sessions, sessions.budget_warnings_s, self._changes.session, self._stop)
        # Judges running sessions' usage by the fleet's abuse thresholds (provisioner/rules/abuse.py).
        self.abuse_watch = AbuseWatch(abuse or AbuseConfig(), self.sessions, self.vms, self._changes.session,
                                      self._stop)

    # ---- the way in ----------------------------------------------------------------------

    def handle(self, *events: ev.Event) -> Step:
        """Applies the events in order; returns what to persist and run, and the last event's reply.

        A refused request (a ProvisionerError) raises after the events before it were applied;
        their output comes with the next step."""
        log, reply = self.event_log, None
        for event in events:
            if log is not None:
                log.record(event)
            reply = self._apply(event)
        return self._changes.step(self._in_flight.take_issued(), reply)

    def _apply(self, event: ev.Event) -> object:
        now = event.at
        match event:
            case ev.Tick():
                if self._in_flight.due(now):
                    self._expire(now)
                if self.culling.due(now):
                    self.culling.cull(now)
                if self._queue_due and self._queue_due[0][0] <= now:
                    self._expire_queue(now)
                if self._forget_due and self._forget_due[0][0] <= now:
                    self._forget_ended(now)
                if self.budgets.due(now):
                    self.budgets.enforce(now)
                if self.preemption.due(now):
                    self.preemption.enforce(now)
                self._tick_pools(now)
            case ev.VmCreated() | ev.VmReady() | ev.PullProgress() | ev.PullDone() | ev.WipeDone() \
                    | ev.VmDeleted() | ev.VmStopped() | ev.VmStarted() | ev.NotebookStarted() \
                    | ev.NotebookStopped() | ev.CommandFailed():
                self._answer(event)
            case ev.SessionRequested():
                return self._allocate(event.spec, now, event.trace_context)
            case ev.SessionTouched():
                s = self._touch(event.session_id, now, event.user_id)
                self.abuse_watch.touched(s, now)
                return s
            case ev.BudgetSet():
                return self.budgets.set(event.session_id, event.ends_at, now)
            case ev.BlockedUsersSet():
                self.blocked_users = event.user_ids
            case ev.ProjectQuotaTold():
                return self._hold_project_quota(told(event.quota, now))
            case ev.StopRequested():
                return self._stop(event.session_id, event.reason, now, event.user_id)
            case ev.DiscardRequested():
                return self._discard(event.key, event.reason, now)
            case ev.SessionForgotten():
                self._forget(event.session_id)
            case ev.HealthReported():
                self._vm_health(event.vm_id, event.report, now)
                self.abuse_watch.reported(event.vm_id, event.report.usage, now)
            case ev.Reconciled():
                self._reconciled(event.plan, now)
            case ev.DrainSet():
                self.draining = event.draining
            case ev.PolicySet():
                return self._set_policy(event.pool, event.policy)
            case ev.CatalogChanged():
                self._set_catalog(event.catalog, now)
            case ev.PrewarmRequested():
                return self.prewarming.request(event.pool, event.image, event.count, now)
            case ev.EvictRequested():
                return self._evict(event.vm_id, event.reason, now)
            case ev.Restored():
                self._restore(event.sessions, event.vms, now)
            case _:
                raise TypeError(f"not an event: {event!r}")
        return None

    def _answer(self, event) -> None:
        final = not isinstance(event, (ev.VmCreated, ev.PullProgress))
        cmd = self._in_flight.get(event.answering)
        if cmd is None:
            self.dropped += 1
            return
        if final:
            self._in_flight.settle(cmd)
        now = event.at
        match event:
            case ev.VmCreated():
                self._vm_created(cmd, event.endpoint, now)
            case ev.VmReady():
                self._vm_ready(cmd, event.endpoint, now)
            case ev.PullProgress():
                self._pull_progress(cmd, event.bytes_done, now)
            case ev.PullDone():
                self._pull_done(cmd, now)
            case ev.WipeDone():
                self._wipe_done(cmd, now)
            case ev.VmDeleted():
                self._vm_deleted(self.vms[cmd.vm_id], now)
            case ev.VmStopped():
                self._vm_stopped(cmd, now)
            case ev.VmStarted():
                self._vm_started(cmd, event.endpoint, now)
            case ev.NotebookStarted():
                self._notebook_started(cmd, event.endpoint, now)
            case ev.NotebookStopped():
                self._notebook_stopped(cmd, now)
            case ev.CommandFailed():
                self._failed(cmd, event.failure, now)

    def _restore(self, sessions, vms, now: float) -> None:
        """Rebuilds state from the store and re-issues the cloud work that was under way."""
        self._in_flight.restart_ids(now)
        restored = []
        for vm in vms:
            if vm.pool not in self.pools:
                continue
            self.vms[vm.id] = vm
            self.pools[vm.pool].count_in(vm)
            restored.append(vm)
        for s in sessions:
            self.sessions[s.id] = s
            if s.priority_class not in self.priority.classes:  # an older record, or a class since removed
                s.priority_class = self.priority.class_of(s.spec.kind.value)
            self.by_request[s.spec.key] = s.id
            if s.terminal:
                self._retain(s, s.ended_at or s.history[-1].time)
            elif s.state is S.QUEUED:
                self.pools[s.pool].queue[s.id] = None
                self.pools[s.pool].order.stale()
                self._watch_queue(s, s.history[-1].time)
            elif s.state is S.RUNNING:
                self.culling.watch(s)
                self.budgets.watch(s, now)
            if not s.terminal:
                self.holdings.change(s, None)
                self.preemption.restore(s)
        for pool in self.pools.values():
            if pool.queue:  # places are not written as they move: numbered again
                self._renumber_queue(pool)
        for vm in restored:
            self._reissue(vm, now)

    # ---- commands in flight --------------------------------------------------------------

    def _set_catalog(self, catalog: ImageCatalog, now: float) -> None:
        """Takes a new catalog, keeping from the old one any version a live session, a pull or a
        pool's demand still names (a tag deleted from the registry must not orphan them)."""
        in_use = {s.image for s in self.sessions.values() if not s.terminal}
        in_use.update(vm.pulling for vm in self.vms.values() if vm.pulling)
        for pool in self.pools.values():
            in_use.update(pool.demand.decayed(now), pool.ranking)
        self.catalog = catalog.keeping(self.catalog, in_use)
        self.prewarming.catalog_changed()
        for pool in self.pools.values():
            self.prewarming.refresh_ranking(pool, now)  # new releases get their baseline demand now

    def _pull(self, now: float, vm: Vm, image: str, layers: tuple, session_id: str = "") -> Command:
        """Pulls `image` onto the VM: for a session, the digest it was pinned to at creation."""
        s = self.sessions.get(session_id) if session_id else None
        digest = s.image_digest if s is not None and s.image == image and s.image_digest else self.catalog.digest(image)
        return self._in_flight.issue(Pull, now, vm.id, vm.zone, image, layers, session_id, digest, self.catalog.repository)

    def _expire(self, now: float) -> None:
        """Commands past their deadline fail: nothing waits for an answer that may never come."""
        while (cmd := self._in_flight.next_expired(now)) is not None:
            name = type(cmd).__name__.lower()
            limit = self._in_flight.limit_s(cmd)
            self._failed(cmd, CloudFailure("deadline_exceeded", f"no answer to the {name} within {limit:.0f}s"), now,
                         expired=True)

    def in_flight(self) -> list[Command]:
        return self._in_flight.all()

    @property
    def limits(self) -> Limits:
        return self._in_flight.limits

    # ---- changes -------------------------------------------------------------------------

    def _set_session(self, s: Session, state: SessionState, reason: str, now: float) -> None:
        self.holdings.change(s, state)
        s.to(state, reason, now)
        self._changes.session(s)
        if state is not S.RUNNING:
            self.abuse_watch.left_running(s.id)
        if s.terminal:
            self._retain(s, now)

    def _set_vm(self, vm: Vm, state: VmState, reason: str, now: float) -> None:
        pool = self.pools[vm.pool]
        if vm.state is not None:
            pool.count_out(vm)
        vm.to(state, reason, now)
        self._changes.vm(vm)
        if state in _GONE:
            self._in_flight.settle_vm(vm.id)
        if state is V.DELETED:
            del self.vms[vm.id]
            self.prewarming.forget(vm.id)
        else:
            pool.count_in(vm)

