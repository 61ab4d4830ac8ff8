"""One cluster's logic: sessions, VMs, queue, culling, autoscaling. No I/O, no clock, no asyncio.

`ClusterCore.handle(*events) -> Step` is the only way in: typed events (provisioner.decide.events)
with the time they happened go in; the commands for the cloud, the records to persist and the
answer to a request come out. A thin shell carries the commands out and feeds the answers back
as events: the live cluster runtime with real RPCs and a cloud backend, the simulator's engine
on a virtual clock, the tests' driver. All three run exactly this code. (A shell may carry out a
Tick that changes nothing with `tick_quietly` instead, as the replay engine does.)

Each command has an id, and stays in flight until its final answer, its failure or its deadline
(provisioner.decide.deadlines). An answer to a command no longer in flight (late, duplicated, for
a VM since deleted, or from before a restart) is dropped here, and nowhere else.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

from provisioner.cloud.base import CloudFailure
from provisioner.config import ClusterConfig, SessionsConfig
from provisioner.config.policy import AbuseConfig, PriorityConfig
from provisioner.decide import events as ev
from provisioner.decide.abuse_watch import AbuseWatch
from provisioner.decide.autoscale import PoolSnapshot
from provisioner.decide.budgets import Budgets
from provisioner.decide.changes import Changes
from provisioner.decide.commands import Command, Step
from provisioner.decide.culling import Culling
from provisioner.decide.deadlines import Limits
from provisioner.decide.eventlog import EventLog
from provisioner.decide.holdings import Holdings
from provisioner.decide.ids import IdSource
from provisioner.decide.in_flight import InFlight
from provisioner.decide.notebooks import Notebooks
from provisioner.decide.pools import PoolState
from provisioner.decide.preemption import Preemption
from provisioner.decide.prewarming import Prewarming
from provisioner.decide.sessions import Sessions, find, tick_due as sessions_tick_due
from provisioner.decide.sizing import Sizing
from provisioner.decide.vms import Vms
from provisioner.decide.zone_memory import ProjectQuota, told
from provisioner.model.errors import NotFound
from provisioner.model.images import ImageCatalog
from provisioner.model.records import Session, Vm
from provisioner.model.states import SessionState
from provisioner.rules.validation import validate_spec

S = SessionState


class ClusterCore:
    """One cluster's parts, composed: each owns its records or state, reads the others' through
    read-only views, and asks them to act through their methods (docs/architecture.md: the core's
    parts)."""

    def __init__(self, cluster: ClusterConfig, catalog: ImageCatalog, sessions: SessionsConfig,
                 ids: IdSource | None = None, event_log: EventLog | None = None,
                 priority: PriorityConfig | None = None, abuse: AbuseConfig | None = None,
                 live_records: bool = False):
        """`live_records`: steps, reads and replies give the core's records themselves, not frozen
        values, for a shell that reads them at once and keeps none (decide/changes.py)."""
        self.config = cluster
        self.name = cluster.name
        self.catalog = catalog  # the images sessions may ask for; replaced by CatalogChanged
        self.sessions_config = sessions
        self.priority = priority or PriorityConfig()  # the fleet's classes and shares (decide/preemption_rules.py)
        self.ids = ids or IdSource(cluster.name)
        self.event_log = event_log
        self.dropped = 0  # answers to commands no longer in flight
        current = lambda: self.catalog  # noqa: E731 - the parts read the catalog as it is now
        self._in_flight = InFlight(cluster)
        self._changes = Changes(live_records)
        # The parts, each owning its state. The records' owners first: pools, VMs, sessions.
        self._sizing = Sizing(cluster, current)
        self._vms = Vms(self.name, self.ids, current, self._sizing, self._in_flight, self._changes)
        self._sessions = Sessions(self.name, sessions, current, self.ids, self.priority, self._sizing, self._changes)
        self._notebooks = Notebooks(cluster.sim.notebook_start_s, current, self._in_flight)
        # The reads: each record's frozen value as of the last step (decide/changes.py), never a
        # record the core goes on changing; and the pools (decide/pools.py).
        self.sessions: Mapping[str, Session] = MappingProxyType(self._changes.sessions)
        self.vms: Mapping[str, Vm] = MappingProxyType(self._changes.vms)
        self.by_request: Mapping[str, str] = MappingProxyType(self._sessions.by_request)
        self.pools: Mapping[str, PoolState] = MappingProxyType(self._sizing.pools)
        # The other parts read the records themselves (read only) and ask their owners to act.
        records, machines, pools = self._sessions.sessions, self._vms.vms, self._sizing.pools
        stop, note = self._sessions.stop, self._sessions.note
        self.culling = Culling(records, stop)
        self.prewarming = Prewarming(self.name, pools, current, self._vms.prewarm, self._sizing.demanded)
        self.holdings = Holdings(pools, records, self.priority)
        self.preemption = Preemption(records, pools, self.priority, self.holdings, self.holdings.at_ceiling,
                                     note, stop, self._sessions.requeue)
        self.budgets = Budgets(records, sessions.budget_warnings_s, note, stop)
        # Judges running sessions' usage by the fleet's abuse thresholds (provisioner/rules/abuse.py).
        self.abuse_watch = AbuseWatch(abuse or AbuseConfig(), records, machines, note, stop)
        self._sizing.connect(self._vms, self.prewarming, self.holdings.queued_demand, self._sessions.dispatch)
        self._vms.connect(self._sessions, self._notebooks, self.prewarming)
        self._sessions.connect(self._vms, self._notebooks, self.holdings, self.preemption, self.culling,
                               self.abuse_watch.left_running)
        self._notebooks.connect(self._sessions, self._vms)
        self._by_type = self._frequent()

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

    def tick_quietly(self, now: float) -> bool:
        """Carries out a Tick at `now` when it changes no record and issues no command: nothing is
        due, or only looks at quiet pools that ask for nothing (decide/sizing.py: look_quietly).
        Whether it did; if not, the Tick must be handled (what was done stands, and the rest is
        done as the Tick's own order has it). Exactly as handle(Tick(now)) would, only without a
        step: most of a replay's ticks are such, and the replay engine hands in only the others."""
        if (self._in_flight.due(now) or self.culling.due(now) or sessions_tick_due(self._sessions, now)
                or self.budgets.due(now) or self.preemption.due(now) or not self._sizing.look_quietly(now)):
            return False
        if self.event_log is not None:  # the looks made here, replayed
            self.event_log.record(ev.Tick(now))
        return True

    def _frequent(self) -> dict[type, Callable[[ev.Event], object]]:
        """The events a replay hands in by the hundred thousand, looked up by type (a match tries
        its cases in turn); the others go through _apply's match."""
        answer = self._answer
        return {ev.Tick: self._tick, ev.SessionRequested: self._requested, ev.SessionTouched: self._touched,
                ev.StopRequested: self._stop_requested, ev.SessionForgotten: self._forget,
                **{kind: answer for kind in (ev.VmCreated, ev.VmReady, ev.PullProgress, ev.PullDone, ev.WipeDone,
                                             ev.VmDeleted, ev.VmStopped, ev.VmStarted, ev.NotebookStarted,
                                             ev.NotebookStopped, ev.CommandFailed)}}

    def _tick(self, event: ev.Tick) -> None:
        now = event.at
        if self._in_flight.due(now):
            self._expire(now)
        if self.culling.due(now):
            self.culling.cull(now)
        self._sessions.tick(now)
        if self.budgets.due(now):
            self.budgets.enforce(now)
        if self.preemption.due(now):
            self.preemption.enforce(now)
        self._sizing.tick(now)

    def _requested(self, event: ev.SessionRequested) -> Session:
        return self._sessions.allocate(event.spec, event.at, event.trace_context)

    def _touched(self, event: ev.SessionTouched) -> Session:
        s = self._sessions.touch(event.session_id, event.at, event.user_id)
        self.abuse_watch.touched(s, event.at)
        return s

    def _stop_requested(self, event: ev.StopRequested) -> Session:
        return self._sessions.stop(event.session_id, event.reason, event.at, event.user_id)

    def _forget(self, event: ev.SessionForgotten) -> None:
        self._sessions.forget(event.session_id)

    def _apply(self, event: ev.Event) -> object:
        if (frequent := self._by_type.get(type(event))) is not None:
            return frequent(event)
        now = event.at
        match event:
            case ev.BudgetSet():
                return self.budgets.set(event.session_id, event.ends_at, now)
            case ev.BlockedUsersSet():
                self._sessions.blocked_users = event.user_ids
            case ev.ProjectQuotaTold():
                return self._sizing.hold_project_quota(told(event.quota, now))
            case ev.DiscardRequested():
                return self._sessions.discard(event.key, event.reason, now)
            case ev.HealthReported():
                self._vms.health(event.vm_id, event.report, now)
                self.abuse_watch.reported(event.vm_id, event.report.usage, now)
            case ev.Reconciled():
                self._vms.reconciled(event.plan, now)
            case ev.DrainSet():
                self._sessions.draining = event.draining
            case ev.PolicySet():
                return self._sizing.set_policy(event.pool, event.policy)
            case ev.CatalogChanged():
                self._set_catalog(event.catalog, now)
            case ev.PrewarmRequested():
                return self.prewarming.request(event.pool, event.image, event.count, now)
            case ev.EvictRequested():
                return self._vms.evict(event.vm_id, event.reason, now)
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
            case ev.NotebookStarted():
                self._notebooks.started(cmd, event.endpoint, now)
            case ev.NotebookStopped():
                self._notebooks.stopped(cmd, now)
            case ev.CommandFailed():
                self._vms.failed(cmd, event.failure, now)
            case _:
                self._vms.answer(cmd, event, now)

    def _restore(self, sessions, vms, now: float) -> None:
        """Rebuilds state from the store and re-issues the cloud work that was under way."""
        self._in_flight.restart_ids(now)
        restored = self._vms.restore(vms)

        def each(s: Session) -> None:
            if s.state is S.RUNNING:
                self.culling.watch(s)
                self.budgets.watch(s, now)
            if not s.terminal:
                self.holdings.change(s, None)
                self.preemption.restore(s)

        self._changes.restored(self._sessions.restore(sessions, each), restored)
        for vm in restored:
            self._vms.reissue(vm, now)

    def _set_catalog(self, catalog: ImageCatalog, now: float) -> None:
        """Takes a new catalog, keeping from the old one any version a live session, a pull or a
        pool's demand still names (a tag deleted from the registry must not orphan them)."""
        in_use = {s.image for s in self._sessions.sessions.values() if not s.terminal}
        in_use.update(vm.pulling for vm in self._vms.vms.values() if vm.pulling)
        for pool in self.pools.values():
            in_use.update(pool.demand.decayed(now), pool.ranking)
        self.catalog = catalog.keeping(self.catalog, in_use)
        self.prewarming.catalog_changed()
        for pool in self.pools.values():
            self.prewarming.refresh_ranking(pool, now)  # new releases get their baseline demand now

    def _expire(self, now: float) -> None:
        """Commands past their deadline fail: nothing waits for an answer that may never come."""
        while (cmd := self._in_flight.next_expired(now)) is not None:
            name = type(cmd).__name__.lower()
            limit = self._in_flight.limit_s(cmd)
            self._vms.failed(cmd, CloudFailure("deadline_exceeded", f"no answer to the {name} within {limit:.0f}s"),
                             now, expired=True)

    # ---- reads ---------------------------------------------------------------------------

    def get(self, session_id: str, user_id: str = "") -> Session:
        """The session; with `user_id`, only if it is that user's (see decide/sessions.py: find)."""
        return find(self.sessions, session_id, user_id)

    def get_by_request(self, key: str) -> Session:
        if sid := self.by_request.get(key):
            return self.sessions[sid]
        raise NotFound("no session for this request id", field="request_id")

    def validate(self, spec) -> str:
        """Checks a request against this cluster; returns the resolved image version."""
        return validate_spec(spec, self.pools, self.catalog, self.sessions_config.max_runtime_limit_s)

    def pool(self, name: str) -> PoolState:
        return self._sizing.pool(name)

    def snapshot(self, pool: PoolState) -> PoolSnapshot:
        return self._sizing.snapshot(pool)

    def assignable(self, pool: PoolState) -> list[Vm]:
        """Assignable VMs, as values: warm and healthy, even while a prewarm pull runs (a session
        beats it)."""
        vms = self._changes.vms
        return [vms[vm_id] for vm_id in pool.ready]

    def cold_start_s(self) -> float:
        return self._sizing.cold_start_s(self.catalog.latest)

    def failed_tries(self) -> Mapping[str, int]:
        """Session id -> its VMs that failed before it ran (none once it runs or ends)."""
        return MappingProxyType(self._sessions.failed_tries)

    @property
    def draining(self) -> bool:
        return self._sessions.draining

    @property
    def blocked_users(self) -> frozenset[str]:
        return self._sessions.blocked_users

    @property
    def project_quota(self) -> ProjectQuota | None:
        return self._sizing.project_quota

    def in_flight(self) -> list[Command]:
        return self._in_flight.all()

    @property
    def limits(self) -> Limits:
        return self._in_flight.limits
