"""The simulated cloud: the embedded default backend, so everything runs on a laptop.

Two parts. `SimPhysics` is pure and seeded: how long things take and whether a launch fails.
The trace-driven simulator uses it directly, without asyncio. `SimCloud` is the async
CloudBackend over a Clock: an in-memory inventory, latencies from the physics, stockouts, and
faults injected by tests and demos.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import sqlite3
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, Sequence

from opentelemetry import trace
from opentelemetry.trace import StatusCode

from provisioner.agent.simulated import miner
from provisioner.agent.usage import Usage
from provisioner.common.clock import Clock
from provisioner.cloud.base import (
    LABEL_CLUSTER,
    LABEL_POOL,
    PREEMPTED,
    CloudFailure,
    CloudVm,
    HealthReport,
    LaunchSpec,
    NotebookRequest,
    ProgressCallback,
)
from provisioner.model.errors import (
    InvalidArgument,
    NoCapacity,
    NotFound,
    ProvisionerError,
    QuotaExceeded,
    Unavailable,
)
from provisioner.model.images import Layer

_tracer = trace.get_tracer(__name__)

OPS = frozenset({"create", "wait_ready", "pull", "wipe", "stop", "start", "delete", "list_vms", "start_notebook",
                 "stop_notebook"})
_CODES = frozenset({"stockout", "quota", "rate_limited", "unavailable", "not_found", "invalid", "internal"})
_SPAN_NAMES = {op: f"sim.{op}" for op in OPS | {"health"}}

# A pull reports progress at most this often (sim seconds) and at most this many times.
PULL_STEP_S = 15.0
PULL_MAX_STEPS = 20
# VMs per page of list_vms, which yields to the event loop between pages as a real cloud's paged
# list does: snapshotting 8,000 VMs at once held every call in flight for 10-17 ms.
LIST_PAGE = 500


class SimConfigLike(Protocol):
    """What the sim needs from its config (config.SimCloudConfig has these fields)."""

    boot_s: float
    boot_jitter_s: float
    pull_bytes_per_s: float
    wipe_s: float
    delete_s: float
    stop_s: float
    notebook_start_s: float
    notebook_stop_s: float
    start_median_s: float
    start_sigma: float
    pool_start_median_s: dict[str, float]
    stocked_out_zones: list[str]
    launch_failure_rate: float
    seed: int


class SimPhysics:
    """Durations and launch outcomes; deterministic for a given seed and call sequence."""

    CREATE_S = 3.0  # the insert operation, before the VM starts booting
    CREATE_JITTER_S = 1.0

    def __init__(self, config: SimConfigLike):
        self.config = config
        self.rng = random.Random(config.seed)
        # Mutable: stockouts come and go during a run.
        self.stocked_out: set[str] = set(config.stocked_out_zones)

    def create_s(self) -> float:
        return self.CREATE_S + self.rng.uniform(-self.CREATE_JITTER_S, self.CREATE_JITTER_S)

    def boot_s(self) -> float:
        j = self.config.boot_jitter_s
        return max(0.0, self.config.boot_s + (self.rng.uniform(-j, j) if j else 0.0))

    def pull_s(self, nbytes: int) -> float:
        return nbytes / self.config.pull_bytes_per_s if nbytes > 0 else 0.0

    def wipe_s(self) -> float:
        return self.config.wipe_s

    def delete_s(self) -> float:
        return self.config.delete_s

    def stop_s(self) -> float:
        return self.config.stop_s

    def notebook_start_s(self) -> float:
        return self.config.notebook_start_s

    def notebook_stop_s(self) -> float:
        return self.config.notebook_stop_s

    def start_s(self, pool: str) -> float:
        """A stopped VM of `pool` started, until its agent answers: lognormal, a long tail."""
        c = self.config
        median = c.pool_start_median_s.get(pool, c.start_median_s)
        return self.rng.lognormvariate(math.log(median), c.start_sigma) if c.start_sigma else median

    def launch_outcome(self, zone: str) -> CloudFailure | None:
        """Whether a create, or a start (a stopped VM holds no GPU), gets its GPUs in `zone`."""
        if zone in self.stocked_out:
            return CloudFailure("stockout", f"zone {zone} has no GPUs of this shape (ZONE_RESOURCE_POOL_EXHAUSTED)", zone)
        rate = self.config.launch_failure_rate
        # Draw only when failures are on, so turning them off does not shift other durations.
        if rate > 0 and self.rng.random() < rate:
            return CloudFailure("unavailable", f"simulated launch failure in {zone}", zone)
        return None

    @staticmethod
    def gpu_temperature_c(vm_id: str) -> float:
        # Stable per VM and independent of the rng, so health checks do not shift durations.
        return 45.0 + (zlib.crc32(vm_id.encode()) % 2500) / 100.0


class SimCall(NamedTuple):
    op: str
    vm_id: str
    zone: str


@dataclass(slots=True)
class _Vm:
    vm_id: str
    zone: str
    cluster: str
    labels: dict[str, str]
    endpoint: str
    ready_at: float  # boot runs whether or not anyone waits for it
    status: str = "provisioning"
    health: HealthReport | None = None  # set by mark_unhealthy
    usage: str | None = None  # what its session runs, as JSON (set_usage, mark_miner); a wipe clears it
    layers: list[str] = dataclasses.field(default_factory=list)  # image layers on its disk, by id

    def snapshot(self) -> CloudVm:
        return CloudVm(self.vm_id, self.zone, self.status, dict(self.labels), self.endpoint)  # type: ignore[arg-type]

    def to_json(self) -> str:
        d = {f: getattr(self, f) for f in self.__slots__}
        d["health"] = dataclasses.asdict(self.health) if self.health else None
        return json.dumps(d)

    @classmethod
    def from_json(cls, body: str) -> _Vm:
        d = json.loads(body)
        d["health"] = HealthReport(**d["health"]) if d["health"] else None
        return cls(**d)


class Inventory(dict):
    """The cloud's VMs by id. Given a path, also kept in SQLite: VMs then outlive the process that
    made them, as a real cloud's do, and every replica of a cluster sees one cloud. The file
    also logs each call with the calling process, to show who acted when (for a day)."""

    CALLS_KEPT_S = 86_400.0
    PRUNE_EVERY = 10_000  # calls

    def __init__(self, path: str | Path | None = None):
        super().__init__()
        self._db: sqlite3.Connection | None = None
        if path is None:
            return
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # Survives a killed process, as the cloud must; a simulation need not survive power loss.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._calls = 0
        self._db.execute("CREATE TABLE IF NOT EXISTS vms (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS calls (wall REAL NOT NULL, pid INTEGER NOT NULL, "
                         "op TEXT NOT NULL, vm_id TEXT NOT NULL, zone TEXT NOT NULL)")
        for vm_id, body in self._db.execute("SELECT id, body FROM vms"):
            super().__setitem__(vm_id, _Vm.from_json(body))

    def __setitem__(self, vm_id: str, vm: _Vm) -> None:
        super().__setitem__(vm_id, vm)
        self.save(vm)

    def __delitem__(self, vm_id: str) -> None:
        super().__delitem__(vm_id)
        if self._db is not None:
            self._db.execute("DELETE FROM vms WHERE id = ?", (vm_id,))

    def pop(self, vm_id: str, default: Any = None) -> Any:
        if vm_id not in self:
            return default
        vm = self[vm_id]
        del self[vm_id]
        return vm

    def save(self, vm: _Vm) -> None:
        """Writes a VM whose fields changed."""
        if self._db is not None:
            self._db.execute("INSERT INTO vms VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                             (vm.vm_id, vm.to_json()))

    def log_call(self, op: str, vm_id: str, zone: str) -> None:
        if self._db is not None:
            now = time.time()
            self._db.execute("INSERT INTO calls VALUES (?, ?, ?, ?, ?)", (now, os.getpid(), op, vm_id, zone))
            self._calls += 1
            if self._calls % self.PRUNE_EVERY == 0:
                self._db.execute("DELETE FROM calls WHERE wall < ?", (now - self.CALLS_KEPT_S,))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


@dataclass(slots=True)
class _Fault:
    code: str
    remaining: int
    zone: str | None


# list_vms returns a list, not a failure, so its injected faults are raised as typed errors.
_RAISE_AS: dict[str, type[ProvisionerError]] = {
    "stockout": NoCapacity,
    "quota": QuotaExceeded,
    "rate_limited": Unavailable,
    "unavailable": Unavailable,
    "not_found": NotFound,
    "invalid": InvalidArgument,
    "internal": ProvisionerError,
}

_DEFAULT: Any = object()
_NO_SPAN = contextlib.nullcontext()


class SimCloud:
    """In-process CloudBackend. All waiting goes through the clock, so a ManualClock drives it."""

    name = "sim"

    def __init__(
        self,
        config: SimConfigLike,
        clock: Clock,
        *,
        physics: SimPhysics | None = None,
        tracer: trace.Tracer | None = _DEFAULT,
        record_calls: bool = True,
        inventory: Inventory | None = None,
        spot_rates: dict[str, float] | None = None,
    ):
        self.clock = clock
        self.physics = physics or SimPhysics(config)
        self._tracer = _tracer if tracer is _DEFAULT else tracer  # None: no spans
        self._record = record_calls
        self.calls: list[SimCall] = []
        self._vms = inventory if inventory is not None else Inventory()
        self._faults: dict[str, list[_Fault]] = {}
        # Spot pools' preemptions per VM-hour, and when each running Spot VM is preempted (drawn
        # at its first health check; memoryless, so a restart drawing again changes nothing).
        self._spot = {pool: rate for pool, rate in (spot_rates or {}).items() if rate > 0}
        self._preempt_at: dict[str, float] = {}
        self._spot_rng = random.Random(self.physics.config.seed * 31 + 7)

    # -- fault injection and inspection --------------------------------------------------------

    def set_stockout(self, zone: str, on: bool = True) -> None:
        (self.physics.stocked_out.add if on else self.physics.stocked_out.discard)(zone)

    def inject(self, op: str, code: str, count: int = 1, zone: str | None = None) -> None:
        """The next `count` calls of `op` (in `zone`, if given) fail with `code`."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; one of {sorted(OPS)}")
        if code not in _CODES:
            raise ValueError(f"unknown failure code {code!r}; one of {sorted(_CODES)}")
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._faults.setdefault(op, []).append(_Fault(code, count, zone))

    def mark_unhealthy(self, vm_id: str, detail: str, hardware_errors: int = 1, temperature_c: float = 95.0) -> None:
        vm = self._vms[vm_id]
        vm.health = HealthReport(False, temperature_c, hardware_errors, detail)
        self._vms.save(vm)

    def set_usage(self, vm_id: str, usage: Usage | None) -> None:
        """What the VM's agent reports its session runs, from now until the VM is wiped."""
        vm = self._vms[vm_id]
        vm.usage = usage.to_json() if usage is not None else None
        self._vms.save(vm)

    def mark_miner(self, vm_id: str, seed: int = 0) -> Usage:
        """The VM's session mines (its program and pool picked by seed) until the VM is wiped."""
        usage = miner(seed).usage()
        self.set_usage(vm_id, usage)
        return usage

    def kill(self, vm_id: str) -> bool:
        """The VM vanishes as if preempted or deleted outside us; False if there was none."""
        return self._vms.pop(vm_id, None) is not None

    @property
    def vms(self) -> dict[str, CloudVm]:
        return {vid: vm.snapshot() for vid, vm in self._vms.items()}

    def disk(self, vm_id: str) -> list[str]:
        """The image layers on a VM's disk, by id: a stop and a start keep them."""
        return list(self._vms[vm_id].layers)

    # -- CloudBackend --------------------------------------------------------------------------

    async def create(self, spec: LaunchSpec) -> CloudVm | CloudFailure:
        with self._enter("create", spec.vm_id, spec.zone) as span:
            return self._end(span, await self._create(spec))

    async def wait_ready(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        with self._enter("wait_ready", vm_id, zone) as span:
            return self._end(span, await self._wait_ready(vm_id, zone))

    async def pull(
        self, vm_id: str, zone: str, layers: Sequence[Layer], on_progress: ProgressCallback | None = None,
        repository: str = "", digest: str = "",  # the synthetic catalog's layers are what it pulls
    ) -> CloudFailure | None:
        with self._enter("pull", vm_id, zone) as span:
            return self._end(span, await self._pull(vm_id, zone, layers, on_progress, span))

    async def wipe(self, vm_id: str, zone: str) -> CloudFailure | None:
        with self._enter("wipe", vm_id, zone) as span:
            return self._end(span, await self._wipe(vm_id, zone))

    async def start_notebook(self, vm_id: str, zone: str, request: NotebookRequest) -> str | CloudFailure:
        with self._enter("start_notebook", vm_id, zone) as span:
            return self._end(span, await self._notebook(vm_id, zone, "start_notebook", self.physics.notebook_start_s()))

    async def stop_notebook(self, vm_id: str, zone: str, session_id: str) -> CloudFailure | None:
        with self._enter("stop_notebook", vm_id, zone) as span:
            failure = await self._notebook(vm_id, zone, "stop_notebook", self.physics.notebook_stop_s())
            return self._end(span, failure or None)

    def _running_vm(self, op: str, vm_id: str, zone: str) -> _Vm | CloudFailure:
        """The VM an operation on a running VM (`op`) works on, or why it cannot."""
        fault = self._fault(op, zone)
        if fault is not None:
            return fault
        vm = self._find(vm_id, zone)
        if vm is None:
            return _not_found(vm_id, zone)
        return _stopped(vm) or vm

    async def _notebook(self, vm_id: str, zone: str, what: str, duration: float) -> str | CloudFailure:
        """A notebook container's start or stop on the VM: its time, then the VM's own endpoint."""
        vm = self._running_vm(what, vm_id, zone)
        if isinstance(vm, CloudFailure):
            return vm
        await self.clock.sleep(duration)
        if self._vms.get(vm_id) is not vm:
            return _not_found(vm_id, zone, f"during the notebook's {what.split('_')[0]}")
        return ""

    async def stop(self, vm_id: str, zone: str) -> CloudFailure | None:
        with self._enter("stop", vm_id, zone) as span:
            return self._end(span, await self._stop(vm_id, zone))

    async def start(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        with self._enter("start", vm_id, zone) as span:
            return self._end(span, await self._start(vm_id, zone))

    async def delete(self, vm_id: str, zone: str) -> CloudFailure | None:
        with self._enter("delete", vm_id, zone) as span:
            return self._end(span, await self._delete(vm_id, zone))

    async def list_vms(self, cluster: str) -> list[CloudVm]:
        with self._enter("list_vms", "", "") as span:
            if span is not None:
                span.set_attribute("provisioner.cluster", cluster)
            fault = self._fault("list_vms", "")
            if fault is not None:
                raise _RAISE_AS[fault.code](fault.message)
            ids = [vm_id for vm_id, vm in self._vms.items() if vm.cluster == cluster]
            listed: list[CloudVm] = []
            for start in range(0, len(ids), LIST_PAGE):
                if start:
                    await asyncio.sleep(0)
                # Gone since the ids were taken: not listed, as a later page of a real list would not.
                listed.extend(vm.snapshot() for vm_id in ids[start:start + LIST_PAGE]
                              if (vm := self._vms.get(vm_id)) is not None)
            return listed

    async def health(self, vm_id: str, zone: str) -> HealthReport:
        if self._record:
            self.calls.append(SimCall("health", vm_id, zone))
        vm = self._find(vm_id, zone)
        if vm is None:
            report = HealthReport(False, detail=f"vm {vm_id} not found in {zone}")
        elif self._preempted(vm):
            report = HealthReport(False, detail=PREEMPTED, cause="preempted")
        else:
            report = vm.health or HealthReport(True, self.physics.gpu_temperature_c(vm_id))
            if vm.usage is not None:
                report = dataclasses.replace(report, usage=Usage.from_json(vm.usage))
        # A span only for a failed check: every VM is checked every minute, and a span per
        # healthy answer would be most of the trace file.
        if not report.healthy and self._tracer is not None:
            with self._tracer.start_as_current_span(_SPAN_NAMES["health"], attributes=self._attributes(vm_id, zone)) \
                    as span:
                span.set_status(StatusCode.ERROR, report.detail)
        return report

    async def close(self) -> None:
        self._vms.close()

    # -- operations ----------------------------------------------------------------------------

    async def _create(self, spec: LaunchSpec) -> CloudVm | CloudFailure:
        fault = self._fault("create", spec.zone)
        if fault is not None:
            return fault
        vm = self._vms.get(spec.vm_id)
        if vm is not None:  # a retried create finds the VM it already made
            return vm.snapshot()
        failure = self.physics.launch_outcome(spec.zone)
        create_s = self.physics.create_s()
        if failure is not None:
            # The insert is accepted and its operation fails later, leaving nothing behind.
            await self.clock.sleep(create_s)
            return failure
        now = self.clock.now()
        cluster = spec.labels.get(LABEL_CLUSTER, spec.cluster)
        # The cloud holds the VM from the moment it accepts the insert: a caller that gives up
        # mid-create still leaves a VM behind, as a real cloud would.
        vm = _Vm(
            spec.vm_id,
            spec.zone,
            cluster,
            dict(spec.labels),
            f"sim://{spec.cluster}/{spec.vm_id}",
            ready_at=now + create_s + self.physics.boot_s(),
        )
        self._vms[spec.vm_id] = vm
        await self.clock.sleep(create_s)
        if self._vms.get(spec.vm_id) is not vm:
            return CloudFailure("not_found", f"vm {spec.vm_id} vanished while being created", spec.zone)
        return vm.snapshot()

    async def _wait_ready(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        vm = self._running_vm("wait_ready", vm_id, zone)
        if isinstance(vm, CloudFailure):
            return vm
        wait = vm.ready_at - self.clock.now()
        if wait > 0:
            await self.clock.sleep(wait)
            if self._vms.get(vm_id) is not vm:
                return _not_found(vm_id, zone, "while booting")
            if (stopped := _stopped(vm)) is not None:
                return stopped
        if vm.status == "provisioning":
            vm.status = "running"
            self._vms.save(vm)
        return vm.snapshot()

    async def _pull(
        self, vm_id: str, zone: str, layers: Sequence[Layer], on_progress: ProgressCallback | None, span: Any
    ) -> CloudFailure | None:
        vm = self._running_vm("pull", vm_id, zone)
        if isinstance(vm, CloudFailure):
            return vm
        total = sum(layer.size_bytes for layer in layers)
        if span is not None:
            span.set_attribute("provisioner.pull_bytes", total)
        if total <= 0:
            return None
        duration = self.physics.pull_s(total)
        steps = max(1, min(PULL_MAX_STEPS, math.ceil(duration / PULL_STEP_S)))
        start = self.clock.now()
        for i in range(1, steps + 1):
            # Each step wakes at its own offset from the start, so the pull ends exactly at
            # start + duration (as the simulator's engine has it), not at a sum of rounded steps.
            await self.clock.sleep(start + (duration if i == steps else duration * i / steps) - self.clock.now())
            if self._vms.get(vm_id) is not vm:
                return _not_found(vm_id, zone, "during the pull")
            if (stopped := _stopped(vm)) is not None:
                return stopped
            if on_progress is not None:
                on_progress(total if i == steps else total * i // steps)
        vm.layers.extend(layer.id for layer in layers if layer.id not in vm.layers)
        self._vms.save(vm)
        return None

    async def _wipe(self, vm_id: str, zone: str) -> CloudFailure | None:
        vm = self._running_vm("wipe", vm_id, zone)
        if isinstance(vm, CloudFailure):
            return vm
        await self.clock.sleep(self.physics.wipe_s())
        if self._vms.get(vm_id) is not vm:
            return _not_found(vm_id, zone, "during the wipe")
        if vm.usage is not None:  # the session's processes ended
            vm.usage = None
            self._vms.save(vm)
        return None

    def _preempted(self, vm: _Vm) -> bool:
        rate = self._spot.get(vm.labels.get(LABEL_POOL, ""), 0.0)
        if not rate:
            return False
        now = self.clock.now()
        return now >= self._preempt_at.setdefault(vm.vm_id, now + self._spot_rng.expovariate(rate / 3600.0))

    async def _stop(self, vm_id: str, zone: str) -> CloudFailure | None:
        self._preempt_at.pop(vm_id, None)  # a start is a new run
        fault = self._fault("stop", zone)
        if fault is not None:
            return fault
        vm = self._find(vm_id, zone)
        if vm is None:
            return _not_found(vm_id, zone)
        if vm.status == "terminated":
            return None  # already stopped
        vm.status = "stopping"
        self._vms.save(vm)
        await self.clock.sleep(self.physics.stop_s())
        if self._vms.get(vm_id) is not vm:
            return _not_found(vm_id, zone, "while stopping")
        if vm.status == "stopping":  # not started again meanwhile
            vm.status = "terminated"
            self._vms.save(vm)
        return None

    async def _start(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        fault = self._fault("start", zone)
        if fault is not None:
            return fault
        vm = self._find(vm_id, zone)
        if vm is None:
            return _not_found(vm_id, zone)
        if vm.status in ("provisioning", "running"):
            return vm.snapshot()  # started already
        if vm.status == "stopping":
            return CloudFailure("unavailable", f"vm {vm_id} is still stopping: start it once it is stopped", zone)
        failure = self.physics.launch_outcome(zone)
        op_s = self.physics.create_s()
        if failure is not None:
            # The start is accepted and its operation fails later; the VM stays stopped.
            await self.clock.sleep(op_s)
            return failure
        start_s = self.physics.start_s(vm.labels.get(LABEL_POOL, ""))
        # On another host: what was wrong with the old one's GPU stays behind.
        vm.status, vm.ready_at, vm.health = "provisioning", self.clock.now() + start_s, None
        self._vms.save(vm)
        await self.clock.sleep(min(op_s, start_s))
        if self._vms.get(vm_id) is not vm:
            return _not_found(vm_id, zone, "while starting")
        return vm.snapshot()

    async def _delete(self, vm_id: str, zone: str) -> CloudFailure | None:
        self._preempt_at.pop(vm_id, None)
        fault = self._fault("delete", zone)
        if fault is not None:
            return fault
        vm = self._find(vm_id, zone)
        if vm is None:
            return None  # already gone counts as deleted
        vm.status = "stopping"
        self._vms.save(vm)
        await self.clock.sleep(self.physics.delete_s())
        if self._vms.get(vm_id) is vm:
            del self._vms[vm_id]
        return None

    # -- helpers -------------------------------------------------------------------------------

    def _find(self, vm_id: str, zone: str) -> _Vm | None:
        vm = self._vms.get(vm_id)
        # As in a real cloud, a VM asked for in the wrong zone is not found.
        return vm if vm is not None and vm.zone == zone else None

    def _fault(self, op: str, zone: str) -> CloudFailure | None:
        if not self._faults:
            return None
        pending = self._faults.get(op)
        if not pending:
            return None
        for i, f in enumerate(pending):
            if f.zone is None or f.zone == zone:
                f.remaining -= 1
                if f.remaining <= 0:
                    del pending[i]
                    if not pending:
                        del self._faults[op]
                return CloudFailure(f.code, f"injected {f.code} fault on {op}", zone)  # type: ignore[arg-type]
        return None

    def _enter(self, op: str, vm_id: str, zone: str) -> Any:
        if self._record:
            self.calls.append(SimCall(op, vm_id, zone))
        self._vms.log_call(op, vm_id, zone)
        if self._tracer is None:
            return _NO_SPAN
        return self._tracer.start_as_current_span(_SPAN_NAMES[op], attributes=self._attributes(vm_id, zone))

    @staticmethod
    def _attributes(vm_id: str, zone: str) -> dict[str, str]:
        attrs = {"cloud.provider": "sim", "cloud.zone": zone}
        if vm_id:
            attrs["provisioner.vm_id"] = vm_id
        return attrs

    @staticmethod
    def _end(span: Any, result: Any) -> Any:
        if span is not None and isinstance(result, CloudFailure) and span.is_recording():
            span.set_attribute("cloud.failure_code", result.code)
            span.set_status(StatusCode.ERROR, result.message)
        return result


def _stopped(vm: _Vm) -> CloudFailure | None:
    """A stopped VM runs nothing (it must be started first), as the gce backend reports it."""
    if vm.status == "terminated":
        return CloudFailure("unavailable", f"vm {vm.vm_id} is stopped", vm.zone)
    return None


def _not_found(vm_id: str, zone: str, when: str = "") -> CloudFailure:
    return CloudFailure("not_found", f"vm {vm_id} not found in {zone}" + (f" ({when})" if when else ""), zone)
