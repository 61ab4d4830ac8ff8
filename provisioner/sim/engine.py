"""A discrete-event, virtual-time shell around ClusterCores: it plays the cloud and the tick loop.

Each command a core issues is answered, as an event naming the command, after the delay the
physics gives it (Launch: VmCreated after create_s, VmReady after boot_s more, or CommandFailed;
Pull: PullDone after the bytes at the pull bandwidth; Wipe: WipeDone; Delete: VmDeleted; Stop:
VmStopped; Start: VmStarted after the pool's seeded start time, or CommandFailed on a stockout;
StartNotebook: NotebookStarted after notebook_start_s; StopNotebook: NotebookStopped).
Scheduled work sits in one heap of (time, seq, callback, args), each core's next tick beside it;
each event goes to its core's `handle`, and the step it returns is carried out at once. Work due
at the same time as a tick runs before it, and the cores' ticks due together go in the cores' order. Whether an
answer still applies is the core's business, not the engine's.

A Spot pool's running VMs, and its Spot tier's, are preempted at its `spot_preemptions_per_hour` (a
Poisson process per VM, drawn from a generator of its own so runs without Spot draw exactly as
before): the core hears it as the gce backend reports it, a health report with the cause
"preempted".

How long each command takes and whether it fails is the physics' answer, one per core
(`physics`, a provisioner.cloud.sim_physics.SimPhysics or anything with its methods: the tests'
driver has fixed durations and failure knobs). Subclasses hook in by overriding `changes` (what
changed in a step), `carry_out` (commands) and the delivery of answers (`deliver`). The hot
path does no logging and copies nothing.
"""

from __future__ import annotations

import heapq
import itertools
import random
from typing import Callable, Iterable

from provisioner.cloud.base import PREEMPTED, CloudFailure, HealthReport
from provisioner.cloud.sim_physics import SimPhysics
from provisioner.decide.commands import (Command, Delete, Launch, Pull, Start, StartNotebook, Step, Stop, StopNotebook,
                                         Wipe)
from provisioner.decide.core import ClusterCore
from provisioner.decide.events import (
    CommandFailed, Event, HealthReported, NotebookStarted, NotebookStopped, PullDone, Tick, VmCreated, VmDeleted,
    VmReady, VmStarted, VmStopped, WipeDone,
)
from provisioner.model.states import VmState
from provisioner.model.records import Session, Vm

_NEVER = float("inf")
_NO_TICK = (_NEVER, -1)


class Engine:
    def __init__(self, cores: Iterable[ClusterCore], now: float = 0.0, ticking: bool = True, seed: int = 0):
        self.cores: list[ClusterCore] = list(cores)
        self.now = now
        self.ticking = ticking
        # One physics per core, seeded from its cluster's sim seed and the run's seed.
        self.physics = {c.name: SimPhysics(c.config.sim.model_copy(update={"seed": c.config.sim.seed * 7919 + seed}))
                        for c in self.cores}
        self._heap: list = []
        self._seq = itertools.count()
        # Each core's next tick, (time, core's index), in a heap of its own as small as the cores
        # are few: a tick runs after all other work due at its time, the cores' in their order.
        self._ticks = [(now + c.config.tick_s, i) for i, c in enumerate(self.cores)] if ticking else []
        heapq.heapify(self._ticks)
        self._tick_s = [c.config.tick_s for c in self.cores]
        self.bytes_pulled = 0
        self.events = 0
        self.spot_preemptions = 0  # Spot VMs the simulated cloud took back
        # Each core's own, as its physics: a run's draws do not depend on which clusters share a process (--jobs).
        self._spot_rng = {c.name: random.Random((c.config.sim.seed * 7919 + seed) * 104729 + 17) for c in self.cores}
        self._spot_run: dict[str, int] = {}  # vm id -> its current run (a start is a new one)
        # How each kind of command is carried out: looked up by type, not matched case by case.
        self._kinds = {Launch: self._run_launch, Pull: self._run_pull, Wipe: self._run_wipe, Delete: self._run_delete,
                       Stop: self._run_stop, Start: self._run_start, StartNotebook: self._run_start_notebook,
                       StopNotebook: self._run_stop_notebook}

    # ---- scheduling -----------------------------------------------------------------------

    def at(self, when: float, fn: Callable, *args) -> None:
        """Calls fn(*args, when) at `when`."""
        heapq.heappush(self._heap, (when, next(self._seq), fn, args))

    def _answer(self, core: ClusterCore, event: Event) -> None:
        heapq.heappush(self._heap, (event.at, next(self._seq), self.deliver, (core, event)))

    def _step(self, end: float) -> bool:
        """Runs the next event or tick due by `end`; False when there is none."""
        heap, ticks = self._heap, self._ticks
        tick_t, i = ticks[0] if ticks else _NO_TICK
        top_t = heap[0][0] if heap else _NEVER
        if tick_t < top_t:  # work due at a tick's time runs before it
            if tick_t > end:
                return False
            self._tick(tick_t, i)
            return True
        if top_t > end:
            return False
        t, _, fn, args = heapq.heappop(heap)
        self.now = t
        self.events += 1
        fn(*args, t)
        return True

    def _tick(self, now: float, i: int) -> None:
        core = self.cores[i]
        self.now = now
        self.events += 1
        heapq.heapreplace(self._ticks, (now + self._tick_s[i], i))
        if not core.tick_quietly(now):  # most ticks change nothing: counted, not handed in
            self.handle(core, Tick(now))

    def advance(self, seconds: float) -> None:
        self.run_to(self.now + seconds)

    def run_to(self, end: float) -> None:
        heap, pop, ticks = self._heap, heapq.heappop, self._ticks
        while True:  # _step, inline: this loop runs every event of a replay
            top_t = heap[0][0] if heap else _NEVER
            tick_t, i = ticks[0] if ticks else _NO_TICK
            if tick_t < top_t:
                if tick_t > end:
                    break
                self._tick(tick_t, i)
            else:
                if top_t > end:
                    break
                t, _, fn, args = pop(heap)
                self.now = t
                self.events += 1
                fn(*args, t)
        self.now = end

    def run_until(self, done: Callable[[], bool], limit_s: float) -> float:
        """Steps until `done()`; returns the time it became true. Fails after `limit_s`."""
        end = self.now + limit_s
        while not done():
            if not self._step(end):
                raise AssertionError(f"not done after {limit_s}s (now {self.now})")
        return self.now

    # ---- the shell's loop -----------------------------------------------------------------

    def handle(self, core: ClusterCore, *events: Event) -> Step:
        """Gives `core` the events and carries out its step."""
        step = core.handle(*events)
        self.carry(core, step)
        return step

    def carry(self, core: ClusterCore, step: Step) -> None:
        if step.sessions or step.vms:
            self.changes(core, step.sessions, step.vms)
        if step.commands:
            self.carry_out(core, step.commands)
        self.after_event()

    def deliver(self, core: ClusterCore, event: Event, now: float) -> None:
        """An answer from the cloud reaches the core."""
        self.handle(core, event)

    def changes(self, core: ClusterCore, sessions: list[Session], vms: list[Vm]) -> None:
        """What changed in `core` during the last step; for subclasses."""

    def after_event(self) -> None:
        """Runs after every step, once its changes and commands are handled; for subclasses."""

    def carry_out(self, core: ClusterCore, commands: list[Command]) -> None:
        physics, kinds = self.physics[core.name], self._kinds
        for cmd in commands:
            kinds[type(cmd)](core, cmd, self.now, physics)

    def _run_launch(self, core: ClusterCore, cmd: Launch, now: float, physics: SimPhysics) -> None:
        failure = physics.launch_outcome(cmd.zone)
        delay = physics.create_s()
        if failure is not None:
            self._answer(core, CommandFailed(now + delay, cmd.id, failure))
        else:
            self.at(now + delay, self._created, core, cmd)

    def _run_pull(self, core: ClusterCore, cmd: Pull, now: float, physics: SimPhysics) -> None:
        nbytes = sum(layer.size_bytes for layer in cmd.layers)
        self.bytes_pulled += nbytes
        delay = physics.pull_s(nbytes)
        self._done_or_failed(core, cmd, now + delay, physics.pull_outcome(cmd.zone), PullDone)

    def _run_wipe(self, core: ClusterCore, cmd: Wipe, now: float, physics: SimPhysics) -> None:
        failure = physics.wipe_outcome(cmd.zone)
        self._done_or_failed(core, cmd, now + physics.wipe_s(), failure, WipeDone)

    def _run_delete(self, core: ClusterCore, cmd: Delete, now: float, physics: SimPhysics) -> None:
        self._answer(core, VmDeleted(now + physics.delete_s(), cmd.id))

    def _run_stop(self, core: ClusterCore, cmd: Stop, now: float, physics: SimPhysics) -> None:
        self._answer(core, VmStopped(now + physics.stop_s(), cmd.id))

    def _run_start(self, core: ClusterCore, cmd: Start, now: float, physics: SimPhysics) -> None:
        # A stopped VM holds no GPU: its start meets stockouts as a create does.
        failure = physics.launch_outcome(cmd.zone)
        if failure is not None:
            self._answer(core, CommandFailed(now + physics.create_s(), cmd.id, failure))
        else:
            up = now + physics.start_s(cmd.pool)
            self._answer(core, VmStarted(up, cmd.id, f"sim://{cmd.vm_id}"))
            self._spot_run_from(core, cmd.vm_id, cmd.pool, up)

    def _run_start_notebook(self, core: ClusterCore, cmd: StartNotebook, now: float, physics: SimPhysics) -> None:
        failure = physics.notebook_outcome(cmd.zone)
        self._done_or_failed(core, cmd, now + physics.notebook_start_s(), failure, NotebookStarted)

    def _run_stop_notebook(self, core: ClusterCore, cmd: StopNotebook, now: float, physics: SimPhysics) -> None:
        self._answer(core, NotebookStopped(now + physics.notebook_stop_s(), cmd.id))

    def _done_or_failed(self, core: ClusterCore, cmd: Command, at: float, failure: CloudFailure | None,
                        done: type) -> None:
        """The command's answer at `at`: `done` (an event naming the command), or its failure."""
        self._answer(core, done(at, cmd.id) if failure is None else CommandFailed(at, cmd.id, failure))

    def _created(self, core: ClusterCore, cmd: Launch, now: float) -> None:
        """The cloud has the VM: it says so, and the boot starts (its time drawn only now)."""
        self.deliver(core, VmCreated(now, cmd.id, f"sim://{cmd.vm_id}"), now)
        delay = self.physics[core.name].boot_s()
        self._answer(core, VmReady(now + delay, cmd.id))
        self._spot_run_from(core, cmd.vm_id, cmd.pool, now + delay)

    def _spot_run_from(self, core: ClusterCore, vm_id: str, pool: str, up: float) -> None:
        """A Spot VM up from `up` is preempted after an exponential time, unless it is gone first."""
        config = core.pools[pool].config
        if not (config.spot or config.spot_tier and core.vms[vm_id].spot) or config.spot_preemptions_per_hour <= 0:
            return
        run = self._spot_run[vm_id] = self._spot_run.get(vm_id, 0) + 1
        self.at(up + self._spot_rng[core.name].expovariate(config.spot_preemptions_per_hour / 3600.0), self._preempt,
                core, vm_id, run)

    def _preempt(self, core: ClusterCore, vm_id: str, run: int, now: float) -> None:
        vm = core.vms.get(vm_id)
        if vm is None or self._spot_run.get(vm_id) != run or vm.state not in _PREEMPTIBLE:
            return  # deleted, stopped or started again since
        self.spot_preemptions += 1
        self.deliver(core, HealthReported(now, vm_id, HealthReport(False, detail=PREEMPTED, cause="preempted")), now)


# Running VMs a preemption can take (a stopped one holds no Spot capacity).
_PREEMPTIBLE = frozenset({VmState.WARM, VmState.ASSIGNED, VmState.RECYCLING})
