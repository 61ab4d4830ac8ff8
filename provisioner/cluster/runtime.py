"""The live shell around ClusterCore: persists its changes, runs its commands on the cloud backend,
feeds the results back, ticks it, and tells watchers. No gRPC here.

Order after every event: write the changes (one transaction), wake watchers, then start the
cloud work. So nothing is acknowledged or acted on before it is durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import AsyncIterator, Awaitable, Callable

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from provisioner import telemetry
from provisioner.clock import Clock
from provisioner.cloud.base import (
    LABEL_CLUSTER,
    LABEL_POOL,
    LABEL_REQUEST,
    LABEL_SESSION,
    CloudBackend,
    CloudFailure,
    LaunchSpec,
)
from provisioner.cluster.core import ClusterCore, Command, Delete, Launch, Pull, PoolPolicy, Wipe
from provisioner.decide.reconcile import Plan, reconcile
from provisioner.errors import ProvisionerError, Unavailable
from provisioner.logs import SessionLog
from provisioner.model import Session, SessionSpec, Vm
from provisioner.decide.policy import FIELDS, merge_policy
from provisioner.decide.states import VmState
from provisioner.store import SqliteStore

log = logging.getLogger(__name__)

HEALTH_CHECK_S = 60.0
RECONCILE_S = 300.0


class ClusterRuntime:
    def __init__(self, core: ClusterCore, backend: CloudBackend, clock: Clock, store: SqliteStore | None = None,
                 tracer_provider: trace.TracerProvider | None = None):
        self.core = core
        self.tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self.backend = backend
        self.clock = clock
        self.store = store
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self._watchers: dict[str, set[asyncio.Queue]] = {}
        self._unclaimed: dict[str, float] = {}  # VMs seen in the cloud with no record, since when
        # Replaced on every notice, so each capacity stream sees every change (none clears it for others).
        self._capacity_changed = asyncio.Event()
        # Set when draining: open streams end instead of holding the shutdown.
        self.streams_closed = False
        # pool -> the policy fields operators set that differ from the config file (also in the store).
        self.overrides: dict[str, dict] = {}
        # Told of the changed sessions after each event (restored ones once, flagged): logs, metrics.
        self.observers: list[Callable[[list[Session], bool], None]] = [SessionLog(core.name).changed]

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Restores from the store, reconciles with the cloud, then runs the control loops."""
        if self.store is not None:
            name = self.core.name
            self.core.restore(self.store.load_sessions(name), self.store.load_vms(name), self.clock.now())
            for observe in self.observers:
                observe(list(self.core.sessions.values()), True)
            self._restore_operator_state(self.store.load_operator_state(name))
        self._apply()
        try:
            await self.reconcile()
        except Exception:
            log.exception("cluster %s: reconciling with the cloud at start failed; the loop retries", self.core.name)
        self._loops = [
            asyncio.create_task(self._supervise("tick", self.core.config.tick_s, self._tick)),
            asyncio.create_task(self._supervise("health", HEALTH_CHECK_S, self._check_health)),
            asyncio.create_task(self._supervise("reconcile", RECONCILE_S, self.reconcile)),
        ]

    async def reconcile(self) -> Plan:
        """Compares the records with the cloud's inventory and settles the differences."""
        cloud = await self.backend.list_vms(self.core.name)
        now = self.clock.now()
        plan = reconcile(self.core.vms.values(), cloud, now, self._unclaimed)
        self._unclaimed = plan.unclaimed_since
        self.core.reconciled(plan, now)
        self._apply()
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
        for queues in self._watchers.values():
            for q in queues:
                q.put_nowait(None)
        self._notify_capacity()

    async def close(self) -> None:
        self.end_streams()
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)
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
        self.core.tick(self.clock.now())
        self._apply()

    async def _check_health(self) -> None:
        for vm in list(self.core.vms.values()):
            if vm.state in (VmState.WARM, VmState.ASSIGNED) and vm.healthy:
                report = await self.backend.health(vm.id, vm.zone)
                self.core.vm_health(vm.id, report, self.clock.now())
        self._apply()

    # ---- requests (called by the gRPC services) -------------------------------------------

    def allocate(self, spec: SessionSpec) -> Session:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        s = self.core.allocate(spec, self.clock.now(), carrier)
        self._apply()
        return s

    def touch(self, session_id: str, user_id: str = "") -> Session:
        s = self.core.touch(session_id, self.clock.now(), user_id)
        self._apply()
        return s

    def stop(self, session_id: str, reason: str, user_id: str = "") -> Session:
        s = self.core.stop(session_id, reason, self.clock.now(), user_id)
        self._apply()
        return s

    # ---- operator state: durable before it takes effect ----------------------------------

    def set_draining(self, draining: bool) -> None:
        if self.store is not None:
            self.store.save_operator_state(self.core.name, "", {"draining": True} if draining else {},
                                           self.clock.now())
        self.core.set_draining(draining)
        self._notify_capacity()  # the front hears it at once, even from a quiet cluster

    def set_policy(self, pool_name: str, changes: dict, reset: bool = False) -> PoolPolicy:
        """Applies `changes` (None: unchanged) to a pool's policy within its bounds; `reset` first
        drops what operators set before, back to the config file. The pool's overrides are
        written before they take effect."""
        merged, overrides = self._overridden(pool_name, changes, reset)
        if self.store is not None:
            self.store.save_operator_state(self.core.name, pool_name, overrides, self.clock.now())
        return self._set_policy(pool_name, merged, overrides)

    def _overridden(self, pool_name: str, changes: dict, reset: bool) -> tuple[dict, dict]:
        """The pool's whole policy after `changes`, and the part of it that differs from the file."""
        pool = self.core.pool(pool_name)
        file = {f: getattr(pool.config, f) for f in FIELDS}
        earlier = {} if reset else self.overrides.get(pool_name, {})
        merged = merge_policy({**file, **earlier}, changes, pool.config.vm_ceiling)
        return merged, {f: merged[f] for f in FIELDS if merged[f] != file[f]}

    def _set_policy(self, pool_name: str, merged: dict, overrides: dict) -> PoolPolicy:
        self.overrides[pool_name] = overrides
        policy = self.core.set_policy(pool_name, self.clock.now(), **merged)
        self._apply()
        return policy

    def _restore_operator_state(self, state: dict[str, dict]) -> None:
        """Drain and policy overrides as operators left them. An override the config file no
        longer allows (a pool removed, a lower max_vms_limit) is skipped, with a warning."""
        self.core.set_draining(bool(state.get("", {}).get("draining")))
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

    def admin(self, action: Callable[[float], object]) -> object:
        """Runs an operator action on the core (given `now`) and applies what it changed."""
        out = action(self.clock.now())
        self._apply()
        return out

    async def watch(self, session_id: str, after_revision: int = 0, user_id: str = "") -> AsyncIterator[Session]:
        """The session now (if newer than after_revision), then each change, until it ends."""
        current = self.core.get(session_id, user_id)
        if self.streams_closed:
            raise Unavailable("the cluster is shutting down")
        queue: asyncio.Queue[Session | None] = asyncio.Queue()
        self._watchers.setdefault(session_id, set()).add(queue)
        try:
            if current.revision > after_revision:
                after_revision = current.revision
                yield _snapshot(current)
            if current.terminal:
                return
            while (s := await queue.get()) is not None:
                if s.revision > after_revision:
                    after_revision = s.revision
                    yield s
                if s.terminal:
                    return
        finally:
            self._watchers[session_id].discard(queue)
            if not self._watchers[session_id]:
                del self._watchers[session_id]

    async def capacity_changed(self) -> None:
        if not self.streams_closed:
            await self._capacity_changed.wait()

    def _notify_capacity(self) -> None:
        self._capacity_changed.set()
        self._capacity_changed = asyncio.Event()

    # ---- applying the core's output ------------------------------------------------------

    def discard(self, key: str, reason: str) -> bool:
        discarded = self.core.discard(key, reason, self.clock.now()) is not None
        self._apply()
        return discarded

    def _apply(self) -> None:
        sessions, vms = self.core.take_changes()
        if self.store is not None:
            self.store.save(sessions, vms)
        for observe in self.observers:
            observe(sessions, False)
        for s in sessions:
            for q in self._watchers.get(s.id, ()):
                q.put_nowait(_snapshot(s))
        if sessions or vms:
            self._notify_capacity()
        for cmd in self.core.take_commands():
            self._spawn(self._run(cmd))

    async def _run(self, cmd: Command) -> None:
        """Carries out one command inside the trace of the session it serves."""
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
                        result = await self.backend.wipe(cmd.vm_id, cmd.zone)
                        self._feed(self.core.wipe_failed if result else self.core.wipe_done, cmd.vm_id, result)
                    case Delete():
                        result = await self.backend.delete(cmd.vm_id, cmd.zone)
                        self._feed(self.core.delete_failed if result else self.core.vm_deleted, cmd.vm_id, result)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("command %s failed in cluster %s", cmd, self.core.name,
                              extra={"cluster": self.core.name, "vm_id": cmd.vm_id, "session_id": cmd.session_id})

    def _feed(self, event: Callable, vm_id: str, failure: CloudFailure | None, *args) -> None:
        if failure is None:
            event(vm_id, *args, self.clock.now())
        else:
            event(vm_id, failure, self.clock.now())
        self._apply()

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
            self._feed(self.core.launch_failed, cmd.vm_id, created)
            return
        if self.core.vms[cmd.vm_id].state is VmState.CREATING:
            self.core.vm_created(cmd.vm_id, created.endpoint, self.clock.now())
            self._apply()
        ready = await self.backend.wait_ready(cmd.vm_id, cmd.zone)
        if isinstance(ready, CloudFailure):
            self._feed(self.core.launch_failed, cmd.vm_id, ready)
        else:
            self.core.vm_ready(cmd.vm_id, self.clock.now(), endpoint=ready.endpoint)
            self._apply()

    async def _pull(self, cmd: Pull) -> None:
        def progress(done: int) -> None:
            self.core.pull_progress(cmd.vm_id, cmd.image, done, self.clock.now())
            self._apply()

        result = await self.backend.pull(cmd.vm_id, cmd.zone, cmd.layers, progress)
        if result is None:
            self.core.pull_done(cmd.vm_id, cmd.image, self.clock.now())
        else:
            self.core.pull_failed(cmd.vm_id, cmd.image, result, self.clock.now())
        self._apply()

    def vms(self) -> list[Vm]:
        return list(self.core.vms.values())


def _snapshot(s: Session) -> Session:
    """A copy that later changes do not reach (watchers may read it after the next event)."""
    return dataclasses.replace(s, history=list(s.history))
