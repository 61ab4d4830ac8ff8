"""The simulated cloud: the embedded default backend, so everything runs on a laptop.

`SimCloud` is the async CloudBackend over a Clock: its VMs (cloud/sim_inventory.py), latencies
and launch outcomes from the seeded physics (cloud/sim_physics.py, which the trace-driven
simulator uses directly, without asyncio), stockouts, and faults injected by tests and demos
(cloud/sim_faults.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
from typing import Any, NamedTuple, Sequence

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
from provisioner.cloud.sim_faults import OPS, RAISE_AS, Faults
from provisioner.cloud.sim_inventory import Inventory, SimVm
from provisioner.cloud.sim_physics import SimConfigLike, SimPhysics
from provisioner.model.images import Layer

_tracer = trace.get_tracer(__name__)

_SPAN_NAMES = {op: f"sim.{op}" for op in OPS | {"health"}}

# A pull reports progress at most this often (sim seconds) and at most this many times.
PULL_STEP_S = 15.0
PULL_MAX_STEPS = 20
# VMs per page of list_vms, which yields to the event loop between pages as a real cloud's paged
# list does: snapshotting 8,000 VMs at once held every call in flight for 10-17 ms.
LIST_PAGE = 500


class SimCall(NamedTuple):
    op: str
    vm_id: str
    zone: str


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
        spot_tiers: frozenset[str] = frozenset(),
    ):
        """`spot_rates`: preemptions per VM-hour of each pool with Spot VMs; in `spot_tiers`, the
        pools (with a Spot tier) where only the VMs made Spot are preempted."""
        self.clock = clock
        self.physics = physics or SimPhysics(config)
        self._tracer = _tracer if tracer is _DEFAULT else tracer  # None: no spans
        self._record = record_calls
        self.calls: list[SimCall] = []
        self._vms = inventory if inventory is not None else Inventory()
        self._faults = Faults()
        # Spot pools' preemptions per VM-hour, and when each running Spot VM is preempted (drawn
        # at its first health check; memoryless, so a restart drawing again changes nothing).
        self._spot = {pool: rate for pool, rate in (spot_rates or {}).items() if rate > 0}
        self._spot_tiers = spot_tiers
        self._preempt_at: dict[str, float] = {}
        self._spot_rng = random.Random(self.physics.config.seed * 31 + 7)

    # -- fault injection and inspection --------------------------------------------------------

    def set_stockout(self, zone: str, on: bool = True) -> None:
        (self.physics.stocked_out.add if on else self.physics.stocked_out.discard)(zone)

    def inject(self, op: str, code: str, count: int = 1, zone: str | None = None) -> None:
        """The next `count` calls of `op` (in `zone`, if given) fail with `code`."""
        self._faults.inject(op, code, count, zone)

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

    def _running_vm(self, op: str, vm_id: str, zone: str) -> SimVm | CloudFailure:
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
                raise RAISE_AS[fault.code](fault.message)
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
        vm = SimVm(
            spec.vm_id,
            spec.zone,
            cluster,
            dict(spec.labels),
            f"sim://{spec.cluster}/{spec.vm_id}",
            ready_at=now + create_s + self.physics.boot_s(),
            spot=spec.spot,
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

    def _preempted(self, vm: SimVm) -> bool:
        pool = vm.labels.get(LABEL_POOL, "")
        rate = self._spot.get(pool, 0.0)
        if not rate or (pool in self._spot_tiers and not vm.spot):
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

    def _find(self, vm_id: str, zone: str) -> SimVm | None:
        vm = self._vms.get(vm_id)
        # As in a real cloud, a VM asked for in the wrong zone is not found.
        return vm if vm is not None and vm.zone == zone else None

    def _fault(self, op: str, zone: str) -> CloudFailure | None:
        return self._faults.take(op, zone)

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


def _stopped(vm: SimVm) -> CloudFailure | None:
    """A stopped VM runs nothing (it must be started first), as the gce backend reports it."""
    if vm.status == "terminated":
        return CloudFailure("unavailable", f"vm {vm.vm_id} is stopped", vm.zone)
    return None


def _not_found(vm_id: str, zone: str, when: str = "") -> CloudFailure:
    return CloudFailure("not_found", f"vm {vm_id} not found in {zone}" + (f" ({when})" if when else ""), zone)
