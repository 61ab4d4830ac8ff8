"""No VM or session stays in flight past its deadline, whatever the cloud or the executors do.

Each kind of executor failure (a launch, pull, wipe, delete, stop or start raising) and each lost
answer (created, ready, pull done, wipe done, deleted, stopped, started, or a failure report) is
injected into a busy pool with a standby tier; after every step, nothing has been in creating,
booting, recycling, deleting, stopping_standby, starting, provisioning, pulling_image or stopping
longer than the deadline the core derives from the config (plus the tick that notices it).
"""

from __future__ import annotations

import asyncio

import pytest
from core_driver import Driver, busy, make_core

from provisioner.common.clock import ManualClock
from provisioner.cloud.sim import SimCloud
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.decide import events as ev
from provisioner.decide.commands import Delete, Launch, Pull, Start, StartNotebook, Stop, StopNotebook, Wipe
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V

CASES = [
    pytest.param({}, id="nothing-injected"),
    *[pytest.param({"raising": {kind}}, id=f"{kind.__name__.lower()}-raises")
      for kind in (Launch, Pull, Wipe, Delete, Stop, Start, StartNotebook, StopNotebook)],
    *[pytest.param({"lost": {kind}}, id=f"{kind.__name__}-lost")
      for kind in (ev.VmCreated, ev.VmReady, ev.PullDone, ev.WipeDone, ev.VmDeleted, ev.VmStopped, ev.VmStarted,
                   ev.NotebookStarted, ev.NotebookStopped)],
    pytest.param({"lost": {ev.CommandFailed}, "fail_pulls": True, "fail_wipes": True}, id="failure-reports-lost"),
    pytest.param({"duplicate": True}, id="every-answer-twice"),
]


def limit_of(d: Driver, state, obj) -> float:
    limits = d.core.limits
    if isinstance(state, V):  # a VM and a session may share a state's name ("starting")
        return {V.CREATING: limits.launch_s, V.BOOTING: limits.launch_s, V.RECYCLING: limits.wipe_s,
                V.DELETING: limits.delete_s, V.STOPPING_STANDBY: limits.stop_s, V.STARTING: limits.start_s}[state]
    return {S.PROVISIONING: max(limits.launch_s, limits.start_s),
            S.PULLING_IMAGE: limits.pull_s(getattr(obj, "pull_bytes_total", 0)),
            S.STARTING: limits.notebook_start_s,
            S.STOPPING: limits.notebook_stop_s + limits.wipe_s + limits.delete_s}[state]


def nothing_overdue(d: Driver) -> None:
    for obj in [*d.core.vms.values(), *d.core.sessions.values()]:
        if obj.state in (V.CREATING, V.BOOTING, V.RECYCLING, V.DELETING, V.STOPPING_STANDBY, V.STARTING,
                         S.PROVISIONING, S.PULLING_IMAGE, S.STARTING, S.STOPPING):
            entered = obj.history[-1].time  # a session placed again has a new VM, with its own deadline
            assert d.now - entered <= limit_of(d, obj.state, obj) + d.tick_s, \
                f"{obj.id} {obj.state} since {entered}, now {d.now}: {obj.history}"


@pytest.mark.parametrize("knobs", CASES)
def test_nothing_stays_in_flight_past_its_deadline(knobs):
    d = Driver(make_core(min_vms=2, max_vms=6, standby=True))
    for name, value in knobs.items():
        setattr(d, name, value)
    d.checks.append(nothing_overdue)
    sessions = busy(d)
    d.advance(5 * 3600)  # quiet: surplus VMs are stopped into standby
    for i in range(4):  # more than the warm VMs: standby VMs are started
        sessions.append(d.allocate(user=f"late{i}", image="gpu:v160"))
    # Each of a session's three tries may take a start or launch and a pull to its deadline.
    d.advance(3 * (d.core.limits.start_s + max(d.core.limits.launch_s, d.core.limits.pull_s(25 * 10**9))))
    # The work was issued (every kind of it when nothing is injected), and whatever was lost or
    # failed, nothing is left in flight.
    kinds = {type(c) for c in d.commands()}
    assert {Launch, Pull, Wipe, Delete} <= kinds
    if not knobs:
        assert kinds == {Launch, Pull, Wipe, Delete, Stop, Start, StartNotebook, StopNotebook}
    assert not [s.id for s in sessions if s.state in (S.PROVISIONING, S.PULLING_IMAGE, S.STARTING, S.STOPPING)]
    if "duplicate" in knobs:
        assert d.core.dropped > 0 and all(s.state in (S.STOPPED, S.RUNNING, S.QUEUED) for s in sessions)


def test_an_expired_launch_fails_its_vm_deletes_what_may_be_left_and_places_the_session_again():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    d.lost = {ev.VmReady}
    s = d.allocate()
    first = d.live(d.core.vms[s.vm_id])
    d.run_until(lambda: first.state is V.DELETING, d.core.limits.launch_s + 2 * d.tick_s)
    assert [h.state for h in first.history] == ["creating", "booting", "failed", "deleting"]
    assert "deadline_exceeded" in first.history[2].reason
    assert s.state is S.PROVISIONING and s.vm_id != first.id
    d.lost = set()
    d.run_until(lambda: s.state is S.RUNNING, 1200)


def test_an_executor_exception_in_the_live_runtime_reaches_the_core_as_a_command_failure():
    """Not logged and dropped: the VM of a launch whose executor raised fails at once."""

    class Crashing(SimCloud):
        async def create(self, spec):
            raise RuntimeError("the cloud client broke")

    async def run():
        core = make_core(min_vms=1, headroom_fraction=0.0)
        clock = ManualClock(start=0.0)
        runtime = ClusterRuntime(core, Crashing(core.config.sim, clock, tracer=None, record_calls=False), clock)
        await runtime.start()
        try:
            await clock.advance(core.config.tick_s)
            for _ in range(5):
                await asyncio.sleep(0)
            failed = [e for e in core.event_log.events if isinstance(e, ev.CommandFailed)]
            assert failed and "RuntimeError: the cloud client broke" in failed[0].failure.message
            # The VM is failed at once (no tick has passed since to launch another).
            assert core.in_flight() == [] and not [vm for vm in core.vms.values() if vm.state is V.CREATING]
        finally:
            await runtime.close()

    asyncio.run(run())
