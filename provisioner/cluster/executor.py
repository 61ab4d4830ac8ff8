"""Carries out the core's commands against the cloud: each runs as a task, inside the trace of the
session it serves, and its outcome, whatever it is (an answer, a failure, an exception), goes
back to the core as an event naming the command."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from provisioner.common.clock import Clock
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
from provisioner.decide import events as ev
from provisioner.decide.commands import (Command, Delete, Launch, Pull, Start, StartNotebook, Step, Stop,
                                         StopNotebook, Wipe)
from provisioner.decide.core import ClusterCore
from provisioner.observability import telemetry

log = logging.getLogger(__name__)


class CommandRunner:
    def __init__(self, core: ClusterCore, backend: CloudBackend, clock: Clock, handle: Callable[..., Step],
                 tracer: trace.Tracer):
        """`handle` is the runtime's: the events it is given are the core's, and their steps carried out."""
        self._core = core
        self._backend = backend
        self._clock = clock
        self._handle = handle
        self._tracer = tracer
        self.tasks: set[asyncio.Task] = set()  # the commands (and stray deletes) under way

    def start(self, commands: Iterable[Command]) -> None:
        for cmd in commands:
            self.spawn(self._run(cmd))

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def delete_stray(self, vm_id: str, zone: str) -> None:
        """Deletes a VM the cloud has that no record claims; a failure is left to the next pass."""
        self.spawn(self._delete_stray(vm_id, zone))

    async def _delete_stray(self, vm_id: str, zone: str) -> None:
        failure = await self._backend.delete(vm_id, zone)
        if failure is not None:
            log.warning("cluster %s: deleting stray VM %s failed (%s); the next pass retries",
                        self._core.name, vm_id, failure.code)

    async def _run(self, cmd: Command) -> None:
        """Carries out one command inside the trace of the session it serves. An exception is
        the command's failure: the core hears of it like any other."""
        session = self._core.sessions.get(cmd.session_id) if cmd.session_id else None
        parent = propagate.extract(session.trace_context) if session else otel_context.Context()
        name = f"cluster.{type(cmd).__name__.lower()}"
        attrs = {telemetry.ATTR_CLUSTER: self._core.name, telemetry.ATTR_VM_ID: cmd.vm_id}
        if session is not None:
            attrs |= {telemetry.ATTR_SESSION_ID: session.id, telemetry.ATTR_POOL: session.pool,
                      telemetry.ATTR_IMAGE: session.image}
        with self._tracer.start_as_current_span(name, context=parent, attributes=attrs):
            try:
                match cmd:
                    case Launch():
                        await self._launch(cmd)
                    case Pull():
                        await self._pull(cmd)
                    case Wipe():
                        self._answered(cmd, await self._backend.wipe(cmd.vm_id, cmd.zone), ev.WipeDone)
                    case Delete():
                        self._answered(cmd, await self._backend.delete(cmd.vm_id, cmd.zone), ev.VmDeleted)
                    case Stop():
                        self._answered(cmd, await self._backend.stop(cmd.vm_id, cmd.zone), ev.VmStopped)
                    case Start():
                        await self._start(cmd)
                    case StartNotebook():
                        await self._start_notebook(cmd)
                    case StopNotebook():
                        self._answered(cmd, await self._backend.stop_notebook(cmd.vm_id, cmd.zone, cmd.session_id),
                                       ev.NotebookStopped)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("command %s failed in cluster %s", cmd, self._core.name, exc_info=True,
                            extra={"cluster": self._core.name, "vm_id": cmd.vm_id, "session_id": cmd.session_id})
                failure = CloudFailure("internal", f"{type(e).__name__}: {e}"[:500], cmd.zone)
                self._handle(ev.CommandFailed(self._clock.now(), cmd.id, failure))

    def _reported(self, cmd: Command, outcome, done: Callable[[float], ev.Event]) -> None:
        """The core hears `done(now)` of an outcome, or that the command failed if the cloud failed it."""
        now = self._clock.now()
        self._handle(ev.CommandFailed(now, cmd.id, outcome) if isinstance(outcome, CloudFailure) else done(now))

    def _answered(self, cmd: Command, failure: CloudFailure | None, done: type) -> None:
        now = self._clock.now()
        self._handle(done(now, cmd.id) if failure is None else ev.CommandFailed(now, cmd.id, failure))

    async def _launch(self, cmd: Launch) -> None:
        pool = self._core.pools[cmd.pool].config
        labels = {LABEL_CLUSTER: self._core.name, LABEL_POOL: cmd.pool, LABEL_REQUEST: cmd.vm_id}
        if cmd.session_id:
            labels[LABEL_SESSION] = cmd.session_id.replace(".", "_")
        spec = LaunchSpec(vm_id=cmd.vm_id, cluster=self._core.name, pool=cmd.pool, zone=cmd.zone,
                          machine_type=pool.machine_type, accelerator=pool.accelerator,
                          accelerator_count=pool.accelerator_count, labels=labels, images=cmd.images,
                          spot=cmd.spot)
        created = await self._backend.create(spec)
        if isinstance(created, CloudFailure):
            self._handle(ev.CommandFailed(self._clock.now(), cmd.id, created))
            return
        self._handle(ev.VmCreated(self._clock.now(), cmd.id, created.endpoint))
        ready = await self._backend.wait_ready(cmd.vm_id, cmd.zone)
        self._reported(cmd, ready, lambda now: ev.VmReady(now, cmd.id, ready.endpoint))

    async def _start_notebook(self, cmd: StartNotebook) -> None:
        vm, s = self._core.vms.get(cmd.vm_id), self._core.sessions.get(cmd.session_id)
        pool = self._core.pools[vm.pool].config if vm is not None else None
        # The secret is read here, not carried in the command (commands are logged).
        request = NotebookRequest(cmd.session_id, cmd.user, self._core.name, cmd.image,
                                  pool.accelerator_count if pool else 0, cmd.repository, cmd.digest,
                                  s.access_token if s is not None else "", pool.notebook_cpus if pool else 0.0,
                                  int(pool.notebook_memory_gb * 2**30) if pool else 0)
        started = await self._backend.start_notebook(cmd.vm_id, cmd.zone, request)
        self._reported(cmd, started, lambda now: ev.NotebookStarted(now, cmd.id, started))

    async def _start(self, cmd: Start) -> None:
        started = await self._backend.start(cmd.vm_id, cmd.zone)
        if not isinstance(started, CloudFailure):
            started = await self._backend.wait_ready(cmd.vm_id, cmd.zone)
        self._reported(cmd, started, lambda now: ev.VmStarted(now, cmd.id, started.endpoint))

    async def _pull(self, cmd: Pull) -> None:
        def progress(done: int) -> None:
            self._handle(ev.PullProgress(self._clock.now(), cmd.id, done))

        self._answered(cmd, await self._backend.pull(cmd.vm_id, cmd.zone, cmd.layers, progress, cmd.repository,
                                                    cmd.digest), ev.PullDone)
