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

import heapq

from provisioner.cloud.base import CloudFailure
from provisioner.config import ClusterConfig, SessionsConfig
from provisioner.config.policy import AbuseConfig, PriorityConfig
from provisioner.decide import events as ev
from provisioner.decide.abuse import AbuseWatch, Watched
from provisioner.decide.budgets import Budgets
from provisioner.decide.commands import (Command, Delete, Launch, Pull, Start, StartNotebook, Step, Stop,
                                         StopNotebook, Wipe)
from provisioner.decide.deadlines import Limits
from provisioner.decide.eventlog import EventLog
from provisioner.decide.ids import IdSource
from provisioner.model.images import ImageCatalog
from provisioner.decide.notebooks import NotebookSteps
from provisioner.decide.pools import Pools, PoolState
from provisioner.decide.preemption import Preemption
from provisioner.decide.sessions import Sessions
from provisioner.model.states import SessionState, VmState
from provisioner.decide.vms import VmLifecycle
from provisioner.decide.zone_memory import ProjectQuota, told
from provisioner.model.records import Session, Vm

S, V = SessionState, VmState
# A VM leaving for good takes its other work with it: answers to that work no longer apply.
_GONE = frozenset({V.DELETING, V.FAILED, V.DELETED})


class ClusterCore(Sessions, VmLifecycle, NotebookSteps, Pools, Budgets, Preemption, AbuseWatch):
    def __init__(self, cluster: ClusterConfig, catalog: ImageCatalog, sessions: SessionsConfig,
                 ids: IdSource | None = None, event_log: EventLog | None = None,
                 priority: PriorityConfig | None = None, abuse: AbuseConfig | None = None):
        self.config = cluster
        self.name = cluster.name
        self.catalog = catalog
        self.sessions_config = sessions
        self.priority = priority or PriorityConfig()  # the fleet's classes and shares (decide/preempt.py)
        self._ranks = {name: c.rank for name, c in self.priority.classes.items()}  # the queue's order
        self.abuse = abuse or AbuseConfig()  # the fleet's abuse thresholds (provisioner/rules/abuse.py)
        self.ids = ids or IdSource(cluster.name)
        self.event_log = event_log
        self.limits = Limits(cluster)
        self.pools = {p.name: PoolState(p, p) for p in cluster.pools}
        self.sessions: dict[str, Session] = {}
        self.by_request: dict[str, str] = {}  # request key (SessionSpec.key) -> session id
        self.vms: dict[str, Vm] = {}
        self.draining = False
        self.dropped = 0  # answers to commands no longer in flight
        # (time, session id) when a running session may need culling; checked lazily by the tick.
        self._cull_due: list[tuple[float, str]] = []
        self._queue_due: list[tuple[float, str]] = []  # (time, session id) when a queued session times out
        self._forget_due: list[tuple[float, str]] = []  # (time, session id) when an ended one leaves memory
        self._failed_tries: dict[str, int] = {}  # session id -> its VMs that failed before it ran
        self._age = {v: i for i, v in enumerate(catalog.newest(len(catalog)))}
        # vm id -> (ranking_gen, position in the ranking up to which the VM holds every image).
        self._filled: dict[str, tuple[int, int]] = {}
        self._next_command = 1
        self._in_flight: dict[int, Command] = {}
        self._vm_commands: dict[str, dict[int, None]] = {}  # vm id -> its commands in flight
        self._command_due: list[tuple[float, int]] = []  # (deadline, command id), checked by the tick
        self._budget_due: list[tuple[float, str]] = []  # (next budget warning or stop, session id)
        self._preempt_due: list[tuple[float, str]] = []  # (end of a grace period, preempted session id)
        self._preempting: dict[str, str] = {}  # preempted session in its grace period -> whom it makes room for
        self._claims: set[str] = set()  # queued sessions that preempted others, until they leave the queue
        self.blocked_users: frozenset[str] = frozenset()  # as the front last told (none requeued)
        self.project_quota: ProjectQuota | None = None  # the project's GPU quota, last found exhausted
        self._held: dict[str, dict[str, int]] = {}  # pool -> user -> sessions holding (or getting) a VM there
        self._borrowable: dict[str, dict[str, None]] = {}  # pool -> those sessions of preemptible classes
        self._watched: dict[str, Watched] = {}  # running session id -> what abuse detection still needs
        self._commands: list[Command] = []  # issued by the events being handled
        self._changed_sessions: dict[str, Session] = {}
        self._changed_vms: dict[str, Vm] = {}
        self._moved: dict[str, Session] = {}  # queued sessions whose place alone changed

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
        sessions, vms, moved = self._changed_sessions, self._changed_vms, self._moved
        step = Step(self._commands, list(sessions.values()) if sessions else [],
                    list(vms.values()) if vms else [], reply,
                    [s for sid, s in moved.items() if sid not in sessions] if moved else [])
        self._commands = []
        if moved:
            self._moved = {}
        if sessions:
            self._changed_sessions = {}
        if vms:
            self._changed_vms = {}
        return step

    def _apply(self, event: ev.Event) -> object:
        now = event.at
        match event:
            case ev.Tick():
                if self._command_due and self._command_due[0][0] <= now:
                    self._expire(now)
                if self._cull_due and self._cull_due[0][0] <= now:
                    self._cull(now)
                if self._queue_due and self._queue_due[0][0] <= now:
                    self._expire_queue(now)
                if self._forget_due and self._forget_due[0][0] <= now:
                    self._forget_ended(now)
                if self._budget_due and self._budget_due[0][0] <= now:
                    self._enforce_budgets(now)
                if self._preempt_due and self._preempt_due[0][0] <= now:
                    self._enforce_preemptions(now)
                self._tick_pools(now)
            case ev.VmCreated() | ev.VmReady() | ev.PullProgress() | ev.PullDone() | ev.WipeDone() \
                    | ev.VmDeleted() | ev.VmStopped() | ev.VmStarted() | ev.NotebookStarted() \
                    | ev.NotebookStopped() | ev.CommandFailed():
                self._answer(event)
            case ev.SessionRequested():
                return self._allocate(event.spec, now, event.trace_context)
            case ev.SessionTouched():
                s = self._touch(event.session_id, now, event.user_id)
                self._abuse_touch(s, now)
                return s
            case ev.BudgetSet():
                return self._set_budget(event.session_id, event.ends_at, now)
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
                self._usage_reported(event.vm_id, event.report.usage, now)
            case ev.Reconciled():
                self._reconciled(event.plan, now)
            case ev.DrainSet():
                self.draining = event.draining
            case ev.PolicySet():
                return self._set_policy(event.pool, event.policy)
            case ev.CatalogChanged():
                self._set_catalog(event.catalog, now)
            case ev.PrewarmRequested():
                return self._prewarm_request(event.pool, event.image, event.count, now)
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
            self._settle(cmd)
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
        # Command ids go on from the restore's time (in microseconds), past any the previous
        # process issued unless it issued more than a million a second: an id in a log or a
        # trace names one command only.
        self._next_command = max(self._next_command, int(now * 1e6))
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
                self._watch_cull(s)
                self._watch_budget(s, now)
            if not s.terminal:
                self._holding_changes(s, None)
                self._restore_preemption(s)
        for pool in self.pools.values():
            if pool.queue:  # places are not written as they move: numbered again
                self._renumber_queue(pool)
        for vm in restored:
            self._reissue(vm, now)

    # ---- commands in flight --------------------------------------------------------------

    def _issue(self, kind: type, now: float, *args) -> Command:
        cmd = kind(self._next_command, *args)
        self._next_command += 1
        self._in_flight[cmd.id] = cmd
        self._vm_commands.setdefault(cmd.vm_id, {})[cmd.id] = None
        heapq.heappush(self._command_due, (now + self._limit_s(cmd), cmd.id))
        self._commands.append(cmd)
        return cmd

    def _set_catalog(self, catalog: ImageCatalog, now: float) -> None:
        """Takes a new catalog, keeping from the old one any version a live session, a pull or a
        pool's demand still names (a tag deleted from the registry must not orphan them)."""
        in_use = {s.image for s in self.sessions.values() if not s.terminal}
        in_use.update(vm.pulling for vm in self.vms.values() if vm.pulling)
        for pool in self.pools.values():
            in_use.update(pool.demand.decayed(now), pool.ranking)
        self.catalog = catalog.keeping(self.catalog, in_use)
        self._age = {v: i for i, v in enumerate(self.catalog.newest(len(self.catalog)))}
        for pool in self.pools.values():
            self._refresh_ranking(pool, now)  # new releases get their baseline demand now

    def _pull(self, now: float, vm: Vm, image: str, layers: tuple, session_id: str = "") -> Command:
        """Pulls `image` onto the VM: for a session, the digest it was pinned to at creation."""
        s = self.sessions.get(session_id) if session_id else None
        digest = s.image_digest if s is not None and s.image == image and s.image_digest else self.catalog.digest(image)
        return self._issue(Pull, now, vm.id, vm.zone, image, layers, session_id, digest, self.catalog.repository)

    def _limit_s(self, cmd: Command) -> float:
        match cmd:
            case Launch():
                return self.limits.launch_s
            case Pull():
                return self.limits.pull_s(sum(layer.size_bytes for layer in cmd.layers))
            case Wipe():
                return self.limits.wipe_s
            case Delete():
                return self.limits.delete_s
            case Stop():
                return self.limits.stop_s
            case Start():
                return self.limits.start_s
            case StartNotebook():
                return self.limits.notebook_start_s
            case StopNotebook():
                return self.limits.notebook_stop_s
        raise TypeError(cmd)

    def _settle(self, cmd: Command) -> None:
        del self._in_flight[cmd.id]
        mine = self._vm_commands[cmd.vm_id]
        del mine[cmd.id]
        if not mine:
            del self._vm_commands[cmd.vm_id]

    def _expire(self, now: float) -> None:
        """Commands past their deadline fail: nothing waits for an answer that may never come."""
        due = self._command_due
        while due and due[0][0] <= now:
            _, cid = heapq.heappop(due)
            cmd = self._in_flight.get(cid)
            if cmd is None:
                continue
            self._settle(cmd)
            name = type(cmd).__name__.lower()
            failure = CloudFailure("deadline_exceeded", f"no answer to the {name} within {self._limit_s(cmd):.0f}s")
            self._failed(cmd, failure, now, expired=True)

    def in_flight(self) -> list[Command]:
        return list(self._in_flight.values())

    # ---- changes -------------------------------------------------------------------------

    def _session_changed(self, s: Session) -> None:
        s.revision += 1
        self._changed_sessions[s.id] = s

    def _vm_changed(self, vm: Vm) -> None:
        vm.revision += 1
        self._changed_vms[vm.id] = vm

    def _set_session(self, s: Session, state: SessionState, reason: str, now: float) -> None:
        self._holding_changes(s, state)
        s.to(state, reason, now)
        self._session_changed(s)
        if state is not S.RUNNING:
            self._watched.pop(s.id, None)
        if s.terminal:
            self._retain(s, now)

    def _set_vm(self, vm: Vm, state: VmState, reason: str, now: float) -> None:
        pool = self.pools[vm.pool]
        if vm.state is not None:
            pool.count_out(vm)
        vm.to(state, reason, now)
        self._vm_changed(vm)
        if state in _GONE:
            for cid in self._vm_commands.pop(vm.id, ()):
                del self._in_flight[cid]
        if state is V.DELETED:
            del self.vms[vm.id]
            self._filled.pop(vm.id, None)
        else:
            pool.count_in(vm)

