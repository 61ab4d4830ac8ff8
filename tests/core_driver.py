"""A virtual-time shell around ClusterCore for tests: it plays the cloud and the tick loop.

Each command the core issues is answered after the delay the sim physics gives it (Launch:
vm_created after `create_s`, vm_ready after boot_s more; Pull: bytes / bandwidth; Wipe: wipe_s;
Delete: delete_s), from a heap of (time, event), so a test only says `advance(seconds)`.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from typing import Callable

from provisioner.cloud.base import CloudFailure, HealthReport
from provisioner.cluster.core import ClusterCore, Command, Delete, IdSource, Launch, Pull, Wipe
from provisioner.config import FleetConfig, load_fleet
from provisioner.images import LayerCache
from provisioner.model import Session, SessionKind, SessionSpec, Vm
from provisioner.states import VmState

POOL = "gpu-p100"


@functools.cache
def fleet() -> FleetConfig:
    return load_fleet()


def make_core(cluster: str = "us-central1", pool: str = POOL, sessions: dict | None = None, seed: int = 0,
              **pool_changes) -> ClusterCore:
    """A core for one shipped cluster, cut down to one pool (so other pools add no noise)."""
    f = fleet()
    c = f.cluster(cluster)
    p = c.pool(pool).model_copy(update=pool_changes)
    c = c.model_copy(update={"pools": (p,)})
    settings = f.settings.sessions.model_copy(update=sessions or {})
    return ClusterCore(c, f.catalog, settings, IdSource(c.name, seed))


def _failure(what: str, zone: str) -> CloudFailure:
    return CloudFailure("unavailable", f"injected {what} failure", zone)


class Driver:
    def __init__(self, core: ClusterCore, now: float = 0.0, ticking: bool = True, create_s: float = 5.0):
        self.core = core
        self.now = now
        self.ticking = ticking
        self.tick_s = core.config.tick_s
        self.next_tick = now + self.tick_s
        self.create_s = create_s
        self.sim = core.config.sim
        # Failure knobs, read when a command is issued (not when it completes).
        # zone -> failure code for every launch into it (e.g. "stockout"):
        self.fail_zones: dict[str, str] = {}
        # pulls and wipes fail, as data, after their usual time:
        self.fail_pulls = False
        self.fail_wipes = False
        self.log: list[tuple[float, Command]] = []  # every command, with the time it was issued
        self.vms: dict[str, Vm] = {}  # every VM ever reported changed, deleted ones included
        self.checks: list[Callable[[Driver], None]] = []  # run after every event
        self._heap: list = []
        self._seq = itertools.count()
        self._requests = itertools.count(1)
        self._warm = itertools.count()
        self.pump()

    # ---- the shell's loop ---------------------------------------------------------------

    def pump(self) -> None:
        """Takes the core's output and schedules the cloud's answers, then runs the checks."""
        _, vms = self.core.take_changes()
        for vm in vms:
            self.vms[vm.id] = vm
        for cmd in self.core.take_commands():
            self.log.append((self.now, cmd))
            match cmd:
                case Launch():
                    code = self.fail_zones.get(cmd.zone)
                    if code:
                        failure = CloudFailure(code, f"injected {code} in {cmd.zone}", cmd.zone)
                        self._at(self.create_s, self._launch_failed, cmd.vm_id, failure)
                    else:
                        self._at(self.create_s, self._created, cmd.vm_id)
                case Pull():
                    delay = sum(layer.size_bytes for layer in cmd.layers) / self.sim.pull_bytes_per_s
                    if self.fail_pulls:
                        self._at(delay, self.core.pull_failed, cmd.vm_id, cmd.image, _failure("pull", cmd.zone))
                    else:
                        self._at(delay, self.core.pull_done, cmd.vm_id, cmd.image)
                case Wipe():
                    if self.fail_wipes:
                        self._at(self.sim.wipe_s, self._wipe_failed, cmd.vm_id, _failure("wipe", cmd.zone))
                    else:
                        self._at(self.sim.wipe_s, self._wiped, cmd.vm_id)
                case Delete():
                    self._at(self.sim.delete_s, self.core.vm_deleted, cmd.vm_id)
        for check in self.checks:
            check(self)

    def _at(self, delay: float, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (self.now + delay, next(self._seq), fn, args))

    def _step(self, end: float) -> bool:
        """Runs the next event or tick due by `end`; False when there is none."""
        t_event = self._heap[0][0] if self._heap else math.inf
        t_tick = self.next_tick if self.ticking else math.inf
        t = min(t_event, t_tick)
        if t > end:
            return False
        self.now = t
        if t_event <= t_tick:
            _, _, fn, args = heapq.heappop(self._heap)
            fn(*args, t)
        else:
            self.core.tick(t)
            self.next_tick += self.tick_s
        self.pump()
        return True

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self._step(end):
            pass
        self.now = end

    def run_until(self, done: Callable[[], bool], limit_s: float) -> float:
        """Steps until `done()`; returns the time it became true. Fails after `limit_s`."""
        end = self.now + limit_s
        while not done():
            if not self._step(end):
                raise AssertionError(f"not done after {limit_s}s (now {self.now})")
        return self.now

    # ---- the cloud's answers ------------------------------------------------------------

    def _vm(self, vm_id: str) -> Vm | None:
        return self.core.vms.get(vm_id)

    def _created(self, vm_id: str, now: float) -> None:
        vm = self._vm(vm_id)
        if vm is None:
            return
        if vm.state is VmState.CREATING:  # a re-issued launch of a booting VM skips this, as the runtime does
            self.core.vm_created(vm_id, f"sim://{vm_id}", now)
        self._at(self.sim.boot_s, self._ready, vm_id)

    def _ready(self, vm_id: str, now: float) -> None:
        vm = self._vm(vm_id)
        if vm is not None and vm.state is VmState.BOOTING:
            self.core.vm_ready(vm_id, now)

    def _launch_failed(self, vm_id: str, failure: CloudFailure, now: float) -> None:
        if self._vm(vm_id) is not None:
            self.core.launch_failed(vm_id, failure, now)

    def _wiped(self, vm_id: str, now: float) -> None:
        vm = self._vm(vm_id)
        if vm is not None and vm.state is VmState.RECYCLING:
            self.core.wipe_done(vm_id, now)

    def _wipe_failed(self, vm_id: str, failure: CloudFailure, now: float) -> None:
        vm = self._vm(vm_id)
        if vm is not None and vm.state is VmState.RECYCLING:
            self.core.wipe_failed(vm_id, failure, now)

    # ---- requests and reports, at the driver's `now` ------------------------------------

    def allocate(self, user: str = "alice", image: str = "gpu:latest",
                 kind: SessionKind = SessionKind.INTERACTIVE, **spec) -> Session:
        spec.setdefault("request_id", f"req-{next(self._requests)}")
        spec.setdefault("accelerator", POOL)
        s = self.core.allocate(SessionSpec(user_id=user, image=image, kind=kind, **spec), self.now)
        self.pump()
        return s

    def stop(self, s: Session, reason: str = "") -> Session:
        out = self.core.stop(s.id, reason, self.now)
        self.pump()
        return out

    def touch(self, s: Session) -> None:
        self.core.touch(s.id, self.now)
        self.pump()

    def health(self, vm_id: str, healthy: bool, detail: str = "") -> None:
        self.core.vm_health(vm_id, HealthReport(healthy, detail=detail), self.now)
        self.pump()

    def add_warm(self, *images: str, pool: str = POOL, zone: str = "") -> Vm:
        """An idle warm VM holding `images`, as if adopted from the cloud."""
        core = self.core
        cfg = core.pools[pool].config
        cache = LayerCache(cfg.disk_cache_bytes)
        for image in images:
            cache.add(image, core.catalog, self.now)
        vm = Vm(id=f"{core.name}-{pool}-w{next(self._warm):03d}", cluster=core.name, pool=pool,
                zone=zone or cfg.zones[0], cache=cache, created_at=self.now, endpoint="sim://adopted")
        vm.to(VmState.WARM, "adopted", self.now)
        core.vms[vm.id] = vm
        core.pools[pool].vms.add(vm.id)
        self.vms[vm.id] = vm
        return vm

    # ---- reading the log ----------------------------------------------------------------

    def commands(self, kind: type | None = None, since: float = -math.inf) -> list[Command]:
        return [c for t, c in self.log if t >= since and (kind is None or isinstance(c, kind))]
