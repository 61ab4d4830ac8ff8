"""The simulator's engine around one ClusterCore, for tests: a test only says `advance(seconds)`.

Durations are fixed (Launch: VmCreated after `create_s`, VmReady after boot_s more; Pull:
bytes / bandwidth; Wipe: wipe_s; Delete: delete_s), so tests can compute when things happen.
The core keeps an event log, so any scenario can be replayed into a fresh core.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable

from live_records import Live

from provisioner.agent.usage import Usage
from provisioner.cloud.base import CloudFailure, HealthReport
from provisioner.config import FleetConfig, load_fleet
from provisioner.decide import events as ev
from provisioner.decide.commands import Command, Step
from provisioner.decide.core import ClusterCore
from provisioner.decide.eventlog import EventLog
from provisioner.decide.ids import IdSource
from provisioner.model.images import LayerCache
from provisioner.model.states import SessionState, VmState
from provisioner.model.records import Session, SessionKind, SessionSpec, Vm
from provisioner.sim.engine import Engine

POOL = "gpu-p100"


@functools.cache
def fleet() -> FleetConfig:
    return load_fleet()


def make_core(cluster: str = "us-central1", pool: str = POOL, sessions: dict | None = None, seed: int = 0,
              priority: dict | None = None, abuse: dict | None = None, live_records: bool = False,
              **pool_changes) -> ClusterCore:
    """A core for one shipped cluster, cut down to one pool (so other pools add no noise).

    The pool runs the headroom autoscaler with at most 20 VMs and no standby tier unless told
    otherwise: small, predictable numbers that tests can reason about. `sessions`, `priority` and
    `abuse` change the fleet's settings of those names."""
    f = fleet()
    c = f.cluster(cluster)
    p = c.pool(pool).model_copy(update={"autoscaler": "headroom", "max_vms": 20, "standby": False, **pool_changes})
    c = c.model_copy(update={"pools": (p,)})
    settings = f.settings.sessions.model_copy(update=sessions or {})
    classes = f.settings.priority.model_copy(update=priority or {})
    detection = f.settings.abuse.model_copy(update=abuse or {})
    return ClusterCore(c, f.catalog, settings, IdSource(c.name, seed), event_log=EventLog(), priority=classes,
                       abuse=detection, live_records=live_records)


def _failure(what: str, zone: str) -> CloudFailure:
    return CloudFailure("unavailable", f"injected {what} failure", zone)


class FixedPhysics:
    """The driver's physics: fixed durations (no jitter) and its failure knobs, read when a
    command is issued."""

    def __init__(self, driver: Driver):
        self.d = driver

    def create_s(self) -> float:
        return self.d.create_s

    def boot_s(self) -> float:
        return self.d.sim.boot_s

    def pull_s(self, nbytes: int) -> float:
        return nbytes / self.d.sim.pull_bytes_per_s

    def wipe_s(self) -> float:
        return self.d.sim.wipe_s

    def delete_s(self) -> float:
        return self.d.sim.delete_s

    def stop_s(self) -> float:
        return self.d.sim.stop_s

    def start_s(self, pool: str) -> float:
        return self.d.sim.start_median_s

    def notebook_start_s(self) -> float:
        return self.d.sim.notebook_start_s

    def notebook_stop_s(self) -> float:
        return self.d.sim.notebook_stop_s

    def launch_outcome(self, zone: str) -> CloudFailure | None:
        code = self.d.fail_zones.get(zone)
        return CloudFailure(code, f"injected {code} in {zone}", zone) if code else None

    def pull_outcome(self, zone: str) -> CloudFailure | None:
        return _failure("pull", zone) if self.d.fail_pulls else None

    def wipe_outcome(self, zone: str) -> CloudFailure | None:
        return _failure("wipe", zone) if self.d.fail_wipes else None

    def notebook_outcome(self, zone: str) -> CloudFailure | None:
        reason = self.d.fail_notebooks
        return CloudFailure("failed_precondition", reason, zone) if reason else None


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
        self.fail_notebooks = ""  # a notebook's start fails with this reason (the runtime's)
        # Commands of these kinds raise in their executor (the runtime reports CommandFailed at once):
        self.raising: set[type] = set()
        # Answers of these kinds never arrive (lost on the way, or the executor hung):
        self.lost: set[type] = set()
        self.duplicate = False  # every answer arrives twice
        self.log: list[tuple[float, Command]] = []  # every command, with the time it was issued
        self.vms: dict[str, Vm] = {}  # every VM ever reported changed, deleted ones included
        self.sessions: dict[str, Session] = {}  # every session ever reported changed
        self.checks: list[Callable[[Driver], None]] = []  # run after every step
        self._live: dict[str, Live] = {}  # one per record: a test may compare them with `is`
        self._requests = itertools.count(1)
        self._warm = itertools.count()
        super().__init__([core], now=now, ticking=ticking)
        self.physics = {core.name: FixedPhysics(self)}

    # ---- engine hooks -------------------------------------------------------------------

    def changes(self, core: ClusterCore, sessions: list[Session], vms: list[Vm]) -> None:
        for vm in vms:
            self.vms[vm.id] = vm
        for s in sessions:
            self.sessions[s.id] = s

    def live(self, record: Session | Vm | None) -> Live | None:
        """The record as the core has it at each read (or as it last was, once the core let go of it)."""
        if record is None:
            return None
        if (found := self._live.get(record.id)) is None:
            if hasattr(record, "cache"):
                found = Live(record, lambda i: self.core.vms.get(i) or self.vms.get(i))
            else:
                found = Live(record, lambda i: self.core.sessions.get(i) or self.sessions.get(i))
            self._live[record.id] = found
        return found

    def carry_out(self, core: ClusterCore, commands: list[Command]) -> None:
        self.log.extend((self.now, cmd) for cmd in commands)
        raising = [c for c in commands if type(c) in self.raising]
        super().carry_out(core, [c for c in commands if type(c) not in self.raising])
        for cmd in raising:  # after a create's time: an executor fails once it has tried
            at = self.now + self.create_s
            self.at(at, self.deliver, core, ev.CommandFailed(
                at, cmd.id, CloudFailure("internal", f"RuntimeError: injected {type(cmd).__name__} crash")))

    def deliver(self, core: ClusterCore, event: ev.Event, now: float) -> None:
        if type(event) in self.lost:
            return
        super().deliver(core, event, now)
        if self.duplicate:
            super().deliver(core, event, now)

    def after_event(self) -> None:
        for check in self.checks:
            check(self)

    # ---- requests and reports, at the driver's `now` ------------------------------------

    def send(self, *events: ev.Event) -> Step:
        return self.handle(self.core, *events)

    def allocate(self, user: str = "alice", image: str = "gpu:latest",
                 kind: SessionKind = SessionKind.INTERACTIVE, **spec) -> Session:
        spec.setdefault("request_id", f"req-{next(self._requests)}")
        spec.setdefault("accelerator", POOL)
        return self.live(self.send(ev.SessionRequested(self.now, SessionSpec(user_id=user, image=image, kind=kind,
                                                                              **spec))).reply)

    def started(self, *sessions: Session) -> None:
        """Runs until the sessions' notebooks have started (each is running)."""
        self.run_until(lambda: all(s.state is SessionState.RUNNING for s in sessions), 600)

    def stop(self, s: Session, reason: str = "") -> Session:
        return self.live(self.send(ev.StopRequested(self.now, s.id, reason)).reply)

    def touch(self, s: Session) -> None:
        self.send(ev.SessionTouched(self.now, s.id))

    def health(self, vm_id: str, healthy: bool = True, detail: str = "", usage: Usage | None = None) -> None:
        self.send(ev.HealthReported(self.now, vm_id, HealthReport(healthy, detail=detail, usage=usage)))

    def evict(self, vm_id: str, reason: str = "") -> Vm:
        return self.live(self.send(ev.EvictRequested(self.now, vm_id, reason)).reply)

    def set_policy(self, pool: str = POOL, **changes) -> None:
        config = self.core.pool(pool).policy
        self.send(ev.PolicySet(self.now, pool, config.model_copy(update=changes)))

    def reconciled(self, plan) -> None:
        self.send(ev.Reconciled(self.now, plan))

    def fail(self, cmd: Command, failure: CloudFailure) -> None:
        """The cloud's answer to `cmd`, now: it failed."""
        self.send(ev.CommandFailed(self.now, cmd.id, failure))

    def add_warm(self, *images: str, pool: str = POOL, zone: str = "") -> Vm:
        """An idle warm VM holding `images`, as if restored from the store."""
        core = self.core
        cfg = core.pools[pool].config
        cache = LayerCache(cfg.disk_cache_bytes)
        for image in images:
            cache.add(image, core.catalog, self.now)
        vm = Vm(id=f"{core.name}-{pool}-w{next(self._warm):03d}", cluster=core.name, pool=pool,
                zone=zone or cfg.zones[0], cache=cache, created_at=self.now, endpoint="sim://adopted")
        for state in (VmState.CREATING, VmState.BOOTING, VmState.WARM):
            vm.to(state, "made earlier", self.now)
        self.send(ev.Restored(self.now, (), (vm,)))
        self.vms[vm.id] = self.core.vms[vm.id]
        return self.live(vm)

    def make_standby(self, n: int, image: str = "gpu:v160", images: tuple[str, ...] = ()) -> list[Live]:
        """n VMs stopped into standby the way the autoscaler does it: n sessions make the pool's
        peak, end, and their VMs idle past the scale-down window (the pool needs `standby: true`,
        no warm target and no minimum). The i-th session runs `images[i]` if given, else `image`."""
        sessions = [self.allocate(user=f"peak{i}", image=images[i] if images else image) for i in range(n)]
        self.run_until(lambda: all(s.state is SessionState.RUNNING for s in sessions), 1800)
        for s in sessions:
            self.stop(s)
        vm_ids = [s.vm_id for s in sessions]
        self.run_until(lambda: all(self.vms[v].state is VmState.STANDBY for v in vm_ids), 6 * 3600)
        return [self.live(self.vms[v]) for v in vm_ids]

    # ---- reading the log ----------------------------------------------------------------

    def commands(self, kind: type | None = None, since: float = -math.inf) -> list[Command]:
        return [c for t, c in self.log if t >= since and (kind is None or isinstance(c, kind))]


def busy(d: Driver) -> list[Session]:
    """A pool at work for 80 minutes: cold, partial and warm starts, stops, evictions, with warm
    VMs to pull, wipe and delete even when no launch succeeds. Returns its sessions."""
    for _ in range(3):
        d.add_warm("gpu:v160")
    images = ["gpu:latest", "gpu:v150", "gpu:v141", "gpu:v159"]
    sessions = []
    for i in range(12):
        sessions.append(d.allocate(user=f"u{i % 4}", image=images[i % len(images)]))
        d.advance(400)
        if i % 3 == 2:
            for s in sessions:
                if not s.terminal and s.state is not SessionState.STOPPING:
                    d.stop(s)
        if i % 4 == 3 and (warm := [vm for vm in d.core.vms.values() if vm.state is VmState.WARM]):
            d.evict(warm[0].id, "a test")
    return sessions
