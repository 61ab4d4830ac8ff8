"""The live shell around ClusterCore: turns requests, ticks, health checks, reconciler passes and
the cloud's answers into events, and carries out each Step the core returns. No gRPC here.

It composes four parts, one job each: the writer (cluster/writer.py) makes each step's changes
durable, the watchers' hub (cluster/watchers.py) tells Watch and capacity streams, the command
runner (cluster/executor.py) makes the cloud calls, and the read side (cluster/reads.py) answers
the services' reads. Order after every step: write the changes, then tell observers and watchers
and start the cloud work. So nothing is acknowledged or acted on before it is durable; a caller
answering a request awaits `writer.durable()` first.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Awaitable, Callable

from opentelemetry import propagate, trace

from provisioner.common.clock import Clock
from provisioner.cloud.base import CloudBackend
from provisioner.cluster.capacity import CapacityCounts
from provisioner.cluster.executor import CommandRunner
from provisioner.cluster.reads import ClusterReads
from provisioner.cluster.watchers import MOVE_REPORT_S, Watchers
from provisioner.cluster.writer import StepWriter
from provisioner.config import PoolConfig
from provisioner.decide import events as ev
from provisioner.decide.commands import Step
from provisioner.decide.core import ClusterCore
from provisioner.decide.policy import FIELDS, merge_policy
from provisioner.decide.reconcile import Plan, reconcile
from provisioner.decide.zone_memory import ProjectQuota
from provisioner.model.errors import ProvisionerError
from provisioner.model.records import Session, SessionSpec, Vm
from provisioner.model.states import VmState
from provisioner.observability.logs import SessionLog
from provisioner.store import Store

log = logging.getLogger(__name__)

HEALTH_CHECK_S = 60.0  # each warm and assigned VM's health is read once in this
HEALTH_SLICE_S = 1.0  # a slice of them is read this often, so the reads spread over the period
HEALTH_CHUNK = 200  # VMs checked between two yields to the event loop (and written as one step)
RECONCILE_S = 300.0


class ClusterRuntime:
    def __init__(self, core: ClusterCore, backend: CloudBackend, clock: Clock, store: Store | None = None,
                 tracer_provider: trace.TracerProvider | None = None, move_report_s: float = MOVE_REPORT_S):
        self.core = core
        self.backend = backend
        self.clock = clock
        self.store = store
        self.reads = ClusterReads(core, clock, store)
        self.watchers = Watchers(self.reads, move_report_s)
        self.writer = StepWriter(store, core.name)
        self.commands = CommandRunner(core, backend, clock, self.handle,
                                      trace.get_tracer(__name__, tracer_provider=tracer_provider))
        self.capacity = CapacityCounts(core)
        self._loops: list[asyncio.Task] = []
        self._unclaimed: dict[str, float] = {}  # VMs seen in the cloud with no record, since when
        # The VMs whose health is still to be read this period, how many are read a slice, and when
        # the next period starts.
        self._health_due: list[Vm] = []
        self._health_slice = 0
        self._health_round_at = float("-inf")
        # pool -> the policy fields operators set that differ from the config file (also in the store).
        self.overrides: dict[str, dict] = {}
        # Told of the changed sessions after each event (restored ones once, flagged): logs, metrics.
        self.observers: list[Callable[[list[Session], bool], None]] = [SessionLog(core.name).changed]

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Restores from the store, reconciles with the cloud, then runs the control loops."""
        if self.store is not None:
            name = self.core.name
            retention = self.core.sessions_config.retention_s
            ended_since = self.clock.now() - retention if retention else None  # older ones stay in the store
            sessions, vms = self.store.sessions.load_sessions(name, ended_since), self.store.sessions.load_vms(name)
            step = self.core.handle(ev.Restored(self.clock.now(), tuple(sessions), tuple(vms)))
            self.capacity.recount()
            self.reads.index.note(self.core.sessions.values())
            for observe in self.observers:
                observe(list(self.core.sessions.values()), True)
            self.watchers.note_flags(self.core.sessions.values())  # what the fronts may not have heard
            self._apply(step)
            self._restore_operator_state(self.store.operator.load_operator_state(name))
            await self.writer.durable()
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
            self.commands.delete_stray(vm.vm_id, vm.zone)
        if plan.changes:
            log.info("cluster %s reconciled: %d lost, %d deleted, %d deletes retried, %d strays",
                     self.core.name, len(plan.lost), len(plan.deleted), len(plan.retry_delete), len(plan.strays))
        return plan

    async def close(self) -> None:
        self.watchers.end_streams()
        tasks = [*self._loops, *self.commands.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.writer.close()  # what was made is written before the store closes
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
        if (old := self.reads.stored_for_request(spec.key)) is not None:  # made long ago: the same answer
            return old
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return self.handle(ev.SessionRequested(self.clock.now(), spec, carrier)).reply

    def touch(self, session_id: str, user_id: str = "") -> Session:
        if (old := self.reads.stored(session_id, user_id)) is not None:  # ended long ago: nothing to do
            return old
        return self.handle(ev.SessionTouched(self.clock.now(), session_id, user_id)).reply

    def stop(self, session_id: str, reason: str, user_id: str = "") -> Session:
        if (old := self.reads.stored(session_id, user_id)) is not None:
            return old
        return self.handle(ev.StopRequested(self.clock.now(), session_id, reason, user_id)).reply

    def set_budget_end(self, session_id: str, ends_at: float) -> Session:
        """NotFound if the session is unknown; an ended one is returned as it is."""
        if (old := self.reads.stored(session_id)) is not None:
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
            self.watchers.notify_capacity()  # the fronts hear this cluster holds it, even from a quiet cluster

    def discard(self, key: str, reason: str) -> bool:
        return self.handle(ev.DiscardRequested(self.clock.now(), key, reason)).reply is not None

    def prewarm(self, pool: str, image: str, count: int) -> list[str]:
        return self.handle(ev.PrewarmRequested(self.clock.now(), pool, image, count)).reply

    def evict(self, vm_id: str, reason: str) -> Vm:
        return self.handle(ev.EvictRequested(self.clock.now(), vm_id, reason)).reply

    # ---- operator state: durable before it takes effect ----------------------------------

    def set_draining(self, draining: bool) -> None:
        self.writer.save_operator_state("", {"draining": True} if draining else {}, self.clock.now())
        self.handle(ev.DrainSet(self.clock.now(), draining))
        self.watchers.notify_capacity()  # the front hears it at once, even from a quiet cluster

    def set_policy(self, pool_name: str, changes: dict, reset: bool = False) -> PoolConfig:
        """Applies `changes` (None: unchanged) to a pool's policy within its bounds; `reset` first
        drops what operators set before, back to the config file. The pool's overrides are
        written before they take effect."""
        merged, overrides = self._overridden(pool_name, changes, reset)
        self.writer.save_operator_state(pool_name, overrides, self.clock.now())
        return self._set_policy(pool_name, merged, overrides)

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

    # ---- carrying out a step -------------------------------------------------------------

    def _apply(self, step: Step) -> None:
        """Queues the step's changes for writing; what follows from them waits until they are
        durable (and after the steps before it, whose transactions commit first)."""
        self.capacity.changed(step.vms)
        self.reads.index.note(step.sessions)
        self.writer.write(step, self._carry_out)

    def _carry_out(self, step: Step) -> None:
        """Tells observers and watchers of a durable step, and starts its commands."""
        for observe in self.observers:
            observe(step.sessions, False)
        self.watchers.tell(step)
        self.commands.start(step.commands)
