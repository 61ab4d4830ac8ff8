"""A discrete-event, virtual-time shell around ClusterCores: it plays the cloud and the tick loop.

Each command a core issues is answered after the delay the physics gives it (Launch: vm_created
after create_s, vm_ready after boot_s more, or launch_failed; Pull: pull_done after the bytes at
the pull bandwidth; Wipe: wipe_done; Delete: vm_deleted). Events sit in a heap of
(time, seq, core, callback, args); after each event the shell takes the core's changes and
commands. Events due at the same time as a tick run before it.

Subclasses hook in by overriding `changes` (what changed after an event), `carry_out` (commands)
and the duration/outcome methods. The hot path does no logging and copies nothing.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Callable, Iterable

from provisioner.cloud.base import CloudFailure
from provisioner.cloud.sim import SimPhysics
from provisioner.cluster.core import ClusterCore, Command, Delete, Launch, Pull, Wipe
from provisioner.model import Session, Vm
from provisioner.decide.states import VmState

_CREATING, _BOOTING, _RECYCLING = VmState.CREATING, VmState.BOOTING, VmState.RECYCLING


class Engine:
    def __init__(self, cores: Iterable[ClusterCore], now: float = 0.0, ticking: bool = True, seed: int = 0):
        self.cores: list[ClusterCore] = list(cores)
        self.now = now
        self.ticking = ticking
        # One physics per core, seeded from its cluster's sim seed and the run's seed.
        self.physics = {c.name: SimPhysics(c.config.sim.model_copy(update={"seed": c.config.sim.seed * 7919 + seed}))
                        for c in self.cores}
        # [next tick time, period, core], one per core.
        self._ticks = [[now + c.config.tick_s, c.config.tick_s, c] for c in self.cores]
        self._heap: list = []
        self._seq = itertools.count()
        self.bytes_pulled = 0
        self.events = 0

    # ---- scheduling -----------------------------------------------------------------------

    def at(self, when: float, core: ClusterCore | None, fn: Callable, *args) -> None:
        """Calls fn(*args, when) at `when`, then pumps `core` (every core when None)."""
        heapq.heappush(self._heap, (when, next(self._seq), core, fn, args))

    def _after(self, delay: float, core: ClusterCore, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (self.now + delay, next(self._seq), core, fn, args))

    def _step(self, end: float) -> bool:
        """Runs the next event or tick due by `end`; False when there is none."""
        heap = self._heap
        t_event = heap[0][0] if heap else math.inf
        tick = None
        if self.ticking:
            tick = min(self._ticks, key=_first) if len(self._ticks) > 1 else self._ticks[0] if self._ticks else None
        t_tick = tick[0] if tick is not None else math.inf
        t = t_event if t_event <= t_tick else t_tick
        if t > end:
            return False
        self.now = t
        self.events += 1
        if t_event <= t_tick:
            _, _, core, fn, args = heapq.heappop(heap)
            fn(*args, t)
            self.pump(core)
        else:
            core = tick[2]
            core.tick(t)
            tick[0] += tick[1]
            self.pump(core)
        return True

    def advance(self, seconds: float) -> None:
        self.run_to(self.now + seconds)

    def run_to(self, end: float) -> None:
        step = self._step
        while step(end):
            pass
        self.now = end

    def run_until(self, done: Callable[[], bool], limit_s: float) -> float:
        """Steps until `done()`; returns the time it became true. Fails after `limit_s`."""
        end = self.now + limit_s
        while not done():
            if not self._step(end):
                raise AssertionError(f"not done after {limit_s}s (now {self.now})")
        return self.now

    # ---- the shell's loop -----------------------------------------------------------------

    def pump(self, core: ClusterCore | None = None) -> None:
        """Takes the output of `core` (every core when None) and schedules the cloud's answers."""
        for c in self.cores if core is None else (core,):
            sessions, vms = c.take_changes()
            if sessions or vms:
                self.changes(c, sessions, vms)
            commands = c.take_commands()
            if commands:
                self.carry_out(c, commands)
        self.after_event()

    def changes(self, core: ClusterCore, sessions: list[Session], vms: list[Vm]) -> None:
        """What changed in `core` during the last event; for subclasses."""

    def after_event(self) -> None:
        """Runs after every event, once its changes and commands are handled; for subclasses."""

    def carry_out(self, core: ClusterCore, commands: list[Command]) -> None:
        after = self._after
        for cmd in commands:
            match cmd:
                case Launch():
                    failure = self.launch_outcome(core, cmd)
                    if failure is not None:
                        after(self.create_delay(core), core, self._launch_failed, core, cmd.vm_id, failure)
                    else:
                        after(self.create_delay(core), core, self._created, core, cmd.vm_id)
                case Pull():
                    nbytes = sum(layer.size_bytes for layer in cmd.layers)
                    self.bytes_pulled += nbytes
                    delay = self.pull_delay(core, nbytes)
                    failure = self.pull_outcome(core, cmd)
                    if failure is not None:
                        after(delay, core, core.pull_failed, cmd.vm_id, cmd.image, failure)
                    else:
                        after(delay, core, core.pull_done, cmd.vm_id, cmd.image)
                case Wipe():
                    failure = self.wipe_outcome(core, cmd)
                    if failure is not None:
                        after(self.wipe_delay(core), core, self._wipe_failed, core, cmd.vm_id, failure)
                    else:
                        after(self.wipe_delay(core), core, self._wiped, core, cmd.vm_id)
                case Delete():
                    after(self.delete_delay(core), core, core.vm_deleted, cmd.vm_id)

    # ---- durations and outcomes (the physics; tests override them) -------------------------

    def create_delay(self, core: ClusterCore) -> float:
        return self.physics[core.name].create_s()

    def boot_delay(self, core: ClusterCore) -> float:
        return self.physics[core.name].boot_s()

    def pull_delay(self, core: ClusterCore, nbytes: int) -> float:
        return self.physics[core.name].pull_s(nbytes)

    def wipe_delay(self, core: ClusterCore) -> float:
        return self.physics[core.name].wipe_s()

    def delete_delay(self, core: ClusterCore) -> float:
        return self.physics[core.name].delete_s()

    def launch_outcome(self, core: ClusterCore, cmd: Launch) -> CloudFailure | None:
        return self.physics[core.name].launch_outcome(cmd.zone)

    def pull_outcome(self, core: ClusterCore, cmd: Pull) -> CloudFailure | None:
        return None

    def wipe_outcome(self, core: ClusterCore, cmd: Wipe) -> CloudFailure | None:
        return None

    # ---- the cloud's answers --------------------------------------------------------------
    # Each checks the VM is still in the state the answer is for: the core may have moved on.

    def _created(self, core: ClusterCore, vm_id: str, now: float) -> None:
        vm = core.vms.get(vm_id)
        if vm is None:
            return
        if vm.state is _CREATING:  # a re-issued launch of a booting VM skips this, as the runtime does
            core.vm_created(vm_id, f"sim://{vm_id}", now)
        self._after(self.boot_delay(core), core, self._ready, core, vm_id)

    def _ready(self, core: ClusterCore, vm_id: str, now: float) -> None:
        vm = core.vms.get(vm_id)
        if vm is not None and vm.state is _BOOTING:
            core.vm_ready(vm_id, now)

    def _launch_failed(self, core: ClusterCore, vm_id: str, failure: CloudFailure, now: float) -> None:
        if vm_id in core.vms:
            core.launch_failed(vm_id, failure, now)

    def _wiped(self, core: ClusterCore, vm_id: str, now: float) -> None:
        vm = core.vms.get(vm_id)
        if vm is not None and vm.state is _RECYCLING:
            core.wipe_done(vm_id, now)

    def _wipe_failed(self, core: ClusterCore, vm_id: str, failure: CloudFailure, now: float) -> None:
        vm = core.vms.get(vm_id)
        if vm is not None and vm.state is _RECYCLING:
            core.wipe_failed(vm_id, failure, now)


def _first(item: list) -> float:
    return item[0]
