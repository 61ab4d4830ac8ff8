"""The simulator's engine around one ClusterCore, for tests: a test only says `advance(seconds)`.

Durations are fixed (Launch: vm_created after `create_s`, vm_ready after boot_s more; Pull:
bytes / bandwidth; Wipe: wipe_s; Delete: delete_s), so tests can compute when things happen.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable

from provisioner.cloud.base import CloudFailure, HealthReport
from provisioner.cluster.core import ClusterCore, Command, IdSource, Launch, Pull, Wipe
from provisioner.config import FleetConfig, load_fleet
from provisioner.decide.images import LayerCache
from provisioner.model import Session, SessionKind, SessionSpec, Vm
from provisioner.sim.engine import Engine
from provisioner.decide.states import VmState

POOL = "gpu-p100"


@functools.cache
def fleet() -> FleetConfig:
    return load_fleet()


def make_core(cluster: str = "us-central1", pool: str = POOL, sessions: dict | None = None, seed: int = 0,
              **pool_changes) -> ClusterCore:
    """A core for one shipped cluster, cut down to one pool (so other pools add no noise).

    The pool runs the headroom autoscaler with at most 20 VMs unless told otherwise: small,
    predictable numbers that tests can reason about."""
    f = fleet()
    c = f.cluster(cluster)
    p = c.pool(pool).model_copy(update={"autoscaler": "headroom", "max_vms": 20, **pool_changes})
    c = c.model_copy(update={"pools": (p,)})
    settings = f.settings.sessions.model_copy(update=sessions or {})
    return ClusterCore(c, f.catalog, settings, IdSource(c.name, seed))


def _failure(what: str, zone: str) -> CloudFailure:
    return CloudFailure("unavailable", f"injected {what} failure", zone)


class Driver(Engine):
    """One core on the engine, with fixed durations (create_s, then the config's boot_s, pull
    bandwidth, wipe_s and delete_s, no jitter) and failure knobs, so tests can compute times."""

    def __init__(self, core: ClusterCore, now: float = 0.0, ticking: bool = True, create_s: float = 5.0):
        self.core = core
        self.tick_s = core.config.tick_s
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
        self._requests = itertools.count(1)
        self._warm = itertools.count()
        super().__init__([core], now=now, ticking=ticking)
        self.pump()

    # ---- engine hooks -------------------------------------------------------------------

    def changes(self, core: ClusterCore, sessions: list[Session], vms: list[Vm]) -> None:
        for vm in vms:
            self.vms[vm.id] = vm

    def carry_out(self, core: ClusterCore, commands: list[Command]) -> None:
        self.log.extend((self.now, cmd) for cmd in commands)
        super().carry_out(core, commands)

    def after_event(self) -> None:
        for check in self.checks:
            check(self)

    def create_delay(self, core: ClusterCore) -> float:
        return self.create_s

    def boot_delay(self, core: ClusterCore) -> float:
        return self.sim.boot_s

    def pull_delay(self, core: ClusterCore, nbytes: int) -> float:
        return nbytes / self.sim.pull_bytes_per_s

    def wipe_delay(self, core: ClusterCore) -> float:
        return self.sim.wipe_s

    def delete_delay(self, core: ClusterCore) -> float:
        return self.sim.delete_s

    def launch_outcome(self, core: ClusterCore, cmd: Launch) -> CloudFailure | None:
        code = self.fail_zones.get(cmd.zone)
        return CloudFailure(code, f"injected {code} in {cmd.zone}", cmd.zone) if code else None

    def pull_outcome(self, core: ClusterCore, cmd: Pull) -> CloudFailure | None:
        return _failure("pull", cmd.zone) if self.fail_pulls else None

    def wipe_outcome(self, core: ClusterCore, cmd: Wipe) -> CloudFailure | None:
        return _failure("wipe", cmd.zone) if self.fail_wipes else None

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
        core.restore([], [vm], self.now)
        self.vms[vm.id] = vm
        return vm

    # ---- reading the log ----------------------------------------------------------------

    def commands(self, kind: type | None = None, since: float = -math.inf) -> list[Command]:
        return [c for t, c in self.log if t >= since and (kind is None or isinstance(c, kind))]
