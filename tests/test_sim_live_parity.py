"""The simulator and the live cluster service take the same decisions for the same events.

One script of requests (creates, touches, stops), the same cloud physics (fixed durations, a
zone stocked out for the first minutes), idle VMs stopped into standby and started again by a
late burst, and the same clock start, played twice: through the
simulator's engine, and through ClusterRuntime on the simulated cloud under a ManualClock. Every
command the core issues, and every session's and VM's history, must be the same in both, to the
last bit of every timestamp.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from provisioner.common.clock import ManualClock
from provisioner.cloud.sim import SimCloud, SimPhysics
from provisioner.decide.core import ClusterCore
from provisioner.decide.events import SessionRequested, SessionTouched, StopRequested
from provisioner.decide.ids import IdSource
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.config import load_fleet
from provisioner.model.records import SessionKind, SessionSpec
from provisioner.sim.engine import Engine

T0 = 1_700_000_000.0  # both sides start here: the forecast buckets by hour of day and week
END_S = 5_000.0
STOCKED_OUT = "us-central1-c"
STOCKOUT_ENDS_S = 301.3


class ScriptedPhysics(SimPhysics):
    """Fixed insert time; every other duration comes from the config (no jitter)."""

    def create_s(self) -> float:
        return 3.4


def make_core() -> ClusterCore:
    fleet = load_fleet()
    cluster = fleet.cluster("us-central1")
    pool = cluster.pool("gpu-p100").model_copy(update={"autoscaler": "predictive", "min_vms": 2, "max_vms": 12})
    sim = cluster.sim.model_copy(update={"boot_jitter_s": 0.0, "start_sigma": 0.0,
                                         "start_median_s": 44.7,  # starts by the tick end off it
                                         "stocked_out_zones": (STOCKED_OUT,)})
    cluster = cluster.model_copy(update={"pools": (pool,), "sim": sim})
    sessions = fleet.settings.sessions.model_copy(update={"idle_timeout_s": 600.0})
    return ClusterCore(cluster, fleet.catalog, sessions, IdSource(cluster.name, 7))


def spec(n: int, user: str, image: str, kind: SessionKind = SessionKind.INTERACTIVE) -> SessionSpec:
    return SessionSpec(request_id=f"req-{n}", user_id=user, accelerator="gpu-p100", image=image, kind=kind)


# (seconds after T0, action). Neither a request nor the insert it causes (3.4 s later) falls on a
# multiple of the 5 s tick: at a tie the engine runs the event first, the live loop whichever
# slept first.
Action = tuple[str, object]
SCRIPT: list[tuple[float, Action]] = [
    (1.7, ("allocate", spec(1, "ada", "gpu:latest"))),
    (2.9, ("allocate", spec(2, "bob", "gpu:v150"))),  # an old pinned release: a pull or a cold start
    (13.3, ("allocate", spec(3, "cy", "gpu:v160", SessionKind.BATCH))),
    *[(47.1 + i * 0.7, ("allocate", spec(4 + i, f"u{i}", ("gpu:v160", "gpu:v159", "gpu:v141")[i % 3])))
      for i in range(6)],
    (200.3, ("stop", "req-1")),
    (260.9, ("touch", "req-2")),
    (STOCKOUT_ENDS_S, ("stockout_over", None)),
    (333.7, ("allocate", spec(10, "ada", "gpu:v158"))),
    (901.1, ("stop", "req-3")),
    (1_207.6, ("allocate", spec(11, "dee", "gpu:latest"))),
    (1_811.2, ("stop", "req-11")),
    # A burst once idle VMs have gone to standby: more sessions than warm VMs, so some start.
    *[(3_601.3 + i * 0.3, ("allocate", spec(20 + i, f"b{i}", "gpu:v160"))) for i in range(6)],
]


def do(core: ClusterCore, physics: SimPhysics, action: Action, allocate: Callable, touch: Callable, stop: Callable) -> None:
    kind, arg = action
    if kind == "allocate":
        allocate(arg)
    elif kind == "stockout_over":
        physics.stocked_out.discard(STOCKED_OUT)
    else:
        sid = next(s.id for s in core.sessions.values() if s.spec.request_id == arg)
        touch(sid) if kind == "touch" else stop(sid)


class Recorder:
    """Everything the core hands its shell: each command with its time, each VM and session."""

    def __init__(self, core: ClusterCore, now: Callable[[], float]):
        self.commands: list[tuple[float, str]] = []
        self.sessions, self.vms = {}, {}  # id -> the object, deleted ones included
        handle = core.handle

        def recorded(*events):
            step = handle(*events)
            self.commands += [(now() - T0, repr(c)) for c in step.commands]
            self.sessions |= {s.id: s for s in step.sessions}
            self.vms |= {v.id: v for v in step.vms}
            return step

        core.handle = recorded

    def outcome(self) -> dict:
        def hist(h):
            return [(c.state, c.reason, c.time - T0) for c in h]

        return {"commands": self.commands,
                "sessions": {k: hist(s.history) for k, s in self.sessions.items()},
                "vms": {k: hist(v.history) for k, v in self.vms.items()}}


def simulated() -> dict:
    core = make_core()
    engine = Engine([core], now=T0)
    physics = ScriptedPhysics(core.config.sim)
    engine.physics[core.name] = physics
    recorder = Recorder(core, lambda: engine.now)
    for t, action in SCRIPT:
        engine.run_to(T0 + t)
        do(core, physics, action, lambda s: engine.handle(core, SessionRequested(engine.now, s)),
           lambda sid: engine.handle(core, SessionTouched(engine.now, sid)),
           lambda sid: engine.handle(core, StopRequested(engine.now, sid, "done")))
    engine.run_to(T0 + END_S)
    return recorder.outcome()


async def live() -> dict:
    core = make_core()
    clock = ManualClock(start=T0)
    physics = ScriptedPhysics(core.config.sim)
    cloud = SimCloud(core.config.sim, clock, physics=physics, tracer=None, record_calls=False)
    recorder = Recorder(core, clock.now)
    runtime = ClusterRuntime(core, cloud, clock)
    await runtime.start()
    try:
        for t, action in SCRIPT:
            await clock.advance(T0 + t - clock.now())
            do(core, physics, action, runtime.allocate, runtime.touch, lambda sid: runtime.stop(sid, "done"))
        await clock.advance(T0 + END_S - clock.now())
    finally:
        await runtime.close()
    return recorder.outcome()


def test_simulator_and_live_service_take_identical_decisions():
    sim, real = simulated(), asyncio.run(live())
    # The script exercises what matters: a stockout, every kind of start, culling, scale-down
    # into standby and starts from it.
    vm_reasons = [r for h in sim["vms"].values() for _, r, _ in h]
    session_states = [s for h in sim["sessions"].values() for s, _, _ in h]
    assert any("stockout" in r for r in vm_reasons)
    assert {"running", "pulling_image", "stopped"} <= set(session_states), set(session_states)
    assert any("idle" in r for h in sim["sessions"].values() for _, r, _ in h)
    assert sum("Stop(" in c for _, c in sim["commands"]) >= 2 and any("Start(" in c for _, c in sim["commands"])
    assert len(sim["commands"]) > 20 and len(sim["vms"]) > 5

    assert sim["commands"] == real["commands"]
    assert sim["sessions"] == real["sessions"]
    assert sim["vms"] == real["vms"]
