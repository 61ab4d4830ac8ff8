"""The state tables are the code: every edge of them is taken by some scenario here.

The models check each change against the tables as it happens (an edge missing from a table
raises), so whatever these scenarios do is in the tables; this test shows the converse: no
table edge is left that no code takes. The edges are read from the histories of every session
and VM the scenarios made.
"""

from __future__ import annotations

from core_driver import Driver, busy, make_core

from provisioner.cloud.base import CloudVm
from provisioner.decide.commands import Delete, Launch, Start, Stop
from provisioner.decide.reconcile import reconcile
from provisioner.model.states import SESSION_TRANSITIONS, VM_TRANSITIONS
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V

ZONE_C, ZONE_F = "us-central1-c", "us-central1-f"


def quiet(**pool) -> Driver:
    sessions = {"queue_timeout_s": 300.0}  # a queued session that gets nothing in 5 minutes fails
    return Driver(make_core(sessions=sessions, **{"min_vms": 0, "headroom_fraction": 0.0, **pool}))


def lost(d: Driver, *vm_ids: str) -> None:
    """The reconciler finds these VMs gone from the cloud."""
    present = [CloudVm(vm.id, vm.zone, "running") for vm in d.core.vms.values() if vm.id not in vm_ids]
    d.reconciled(reconcile(d.core.vms.values(), present, d.now, create_grace_s=0.0))


def stockouts(d: Driver) -> None:
    """Every zone stocks out under a cold start, then capacity comes back."""
    d.fail_zones = {ZONE_C: "stockout", ZONE_F: "stockout"}
    s = d.allocate()
    d.run_until(lambda: s.state is S.QUEUED, 60)  # provisioning -> provisioning -> queued
    d.fail_zones = {}
    d.run_until(lambda: s.state is S.RUNNING, 1200)  # queued -> provisioning -> pulling_image -> running


def failed_pulls(d: Driver) -> None:
    """A pull fails with another warm VM to go to, then with none and no room to launch, then
    with room to launch."""
    a, b = d.add_warm("gpu:v150"), d.add_warm("gpu:v151")
    keep = d.add_warm("gpu:v160")
    running = d.allocate(image="gpu:v160")
    assert running.vm_id == keep.id
    d.fail_pulls = True
    s = d.allocate(image="gpu:v158")
    first = s.vm_id
    d.run_until(lambda: s.vm_id != first, 1200)  # pulling_image -> pulling_image, on the other VM
    d.set_policy(max_vms=1)  # the VM the running session has: no room for another
    d.run_until(lambda: s.state is S.QUEUED, 1200)  # the second pull fails: nowhere to go
    d.fail_pulls = False
    d.stop(running)  # the wiped VM goes to the queued session, lacking its image
    d.run_until(lambda: s.state is S.RUNNING, 1200)
    d.set_policy(max_vms=4)
    d.add_warm("gpu:v150")
    d.fail_pulls = True
    other = d.allocate(image="gpu:v141")
    d.run_until(lambda: other.state is S.PROVISIONING, 1200)  # no warm VM left: a new one
    assert {a.id, b.id} <= set(d.vms)


def failed_launches(d: Driver) -> None:
    """Launches that fail without a stockout: the session fails after PLACEMENT_ATTEMPTS."""
    d.raising = {Launch}
    s = d.allocate()
    d.run_until(lambda: s.terminal, 600)
    assert s.state is S.FAILED


def failed_deletes_and_the_reconciler(d: Driver) -> None:
    """A delete fails; the reconciler retries it, finds VMs gone in every state, and finds
    deletes done."""
    d.set_policy(max_vms=10)
    d.add_warm("gpu:v160")
    d.add_warm("gpu:v160")
    d.raising = {Delete}
    victim = next(vm for vm in d.core.vms.values() if vm.state is V.WARM)
    d.evict(victim.id)
    d.advance(30)  # deleting -> failed
    d.raising = set()
    lost(d)  # still there: its delete is retried (failed -> deleting)
    d.advance(60)
    running, pulling, recycling = d.allocate(image="gpu:v160"), d.allocate(image="gpu:v150"), d.allocate()
    d.advance(400)
    d.stop(recycling)
    booting = d.allocate(image="gpu:v141")
    d.advance(d.create_s + 1)
    creating = d.allocate(image="gpu:v141")
    lost(d, d.add_warm("gpu:v160").id)
    assert (d.core.vms[booting.vm_id].state, d.core.vms[creating.vm_id].state) == (V.BOOTING, V.CREATING)
    gone = [running.vm_id, recycling.vm_id, creating.vm_id, booting.vm_id]
    if pulling.state is S.PULLING_IMAGE:
        gone.append(pulling.vm_id)
    lost(d, *gone)
    failed = d.add_warm("gpu:v160")
    d.raising = {Delete}
    d.evict(failed.id)
    d.advance(30)
    d.raising = set()
    lost(d, failed.id)  # failed -> deleted: nothing was left
    d.advance(600)


def queue(d: Driver) -> None:
    d.set_policy(max_vms=1)
    d.add_warm("gpu:v160")
    first = d.allocate(image="gpu:v160")
    waiting, leaving = d.allocate(image="gpu:v160"), d.allocate(image="gpu:v160")
    assert waiting.state is S.QUEUED
    d.stop(leaving)  # queued -> stopped
    d.stop(first)
    d.run_until(lambda: waiting.state is S.RUNNING, 60)  # the wiped VM holds its image


def launch_failed_with_a_warm_vm_free(d: Driver) -> None:
    d.create_s = 30.0
    d.add_warm("gpu:v160")
    first = d.allocate(image="gpu:v160")
    d.fail_zones = {ZONE_C: "stockout", ZONE_F: "stockout"}
    s = d.allocate(image="gpu:v160")
    d.stop(first)  # its VM is wiped (20 s) before the launch fails (30 s)
    d.run_until(lambda: s.state is S.RUNNING, 60)  # provisioning -> running


def queue_timeout(d: Driver) -> None:
    d.set_policy(max_vms=1)
    d.add_warm("gpu:v160")
    d.allocate(image="gpu:v160")
    s = d.allocate(image="gpu:v160")
    d.run_until(lambda: s.terminal, 600)
    assert s.state is S.FAILED


def failed_wipe(d: Driver) -> None:
    d.add_warm("gpu:v160")
    s = d.allocate(image="gpu:v160")
    d.fail_wipes = True
    d.stop(s)
    d.run_until(lambda: s.terminal, 600)


def unhealthy(d: Driver) -> None:
    d.add_warm("gpu:v160")
    s = d.allocate(image="gpu:v160")
    idle = d.add_warm("gpu:v160")
    d.health(s.vm_id, False, "xid 79")
    d.health(idle.id, False, "xid 79")
    d.advance(60)


def stop_while_starting(d: Driver) -> None:
    provisioning = d.allocate(image="gpu:v141")
    d.add_warm("gpu:v150")
    pulling = d.allocate(image="gpu:v159")
    assert pulling.state is S.PULLING_IMAGE
    d.stop(provisioning)
    d.stop(pulling)
    d.advance(600)


def lost_mid_pull(d: Driver) -> None:
    d.add_warm("gpu:v150")
    s = d.allocate(image="gpu:v159")
    assert s.state is S.PULLING_IMAGE
    lost(d, s.vm_id)
    assert s.state is S.FAILED


def standby(d: Driver) -> None:
    """Idle VMs stopped into standby and started for sessions: with their image, without it,
    after a stockout (the VM stays stopped), after a failed start (deleted); a stop that fails;
    standby beyond the target deleted."""
    d.set_policy(standby=True, max_vms=6)
    d.make_standby(4)
    s = d.allocate(image="gpu:v160")  # standby -> starting -> warm; provisioning -> running
    d.run_until(lambda: s.state is S.RUNNING, 600)
    # The VM started beside s's (assignment.hedge_worth) is stopped again once idle: t finds no warm VM.
    d.run_until(lambda: not any(vm.state is V.WARM for vm in d.core.vms.values()), 1800)
    d.fail_zones = {ZONE_C: "stockout", ZONE_F: "stockout"}  # whichever stopped VM it starts
    t = d.allocate(image="gpu:v141")  # starting -> standby; the session queued, every zone out
    d.run_until(lambda: t.state is not S.PROVISIONING, 600)
    d.fail_zones = {}
    d.run_until(lambda: t.state is S.RUNNING, 3600)  # once the pool tries the zones again
    d.raising = {Start}
    u = d.allocate(image="gpu:v160")  # starting -> deleting
    d.run_until(lambda: u.vm_id == "" or d.vms[u.vm_id].state is not V.STARTING, 600)
    d.raising = {Stop}
    for x in (s, t, u):
        d.stop(x)
    d.advance(5 * 3600)  # the stop fails: stopping_standby -> deleting; the rest go too
    d.raising = set()
    d.set_policy(standby=False)  # standby -> deleting
    d.advance(120)


def standby_lost(d: Driver) -> None:
    """VMs gone from the cloud while stopping, stopped and starting."""
    d.set_policy(standby=True)
    vms = d.make_standby(3)
    d.allocate(image="gpu:v160")  # two of them started (assignment.hedge_worth), one left stopped
    starting = next(vm for vm in vms if vm.state is V.STARTING)
    stopped = next(vm for vm in vms if vm.state is V.STANDBY)
    lost(d, stopped.id)
    lost(d, starting.id)
    s = d.allocate(user="bob", image="gpu:v160")
    d.run_until(lambda: s.state is S.RUNNING, 1800)
    d.stop(s)
    vm_id = s.vm_id
    d.run_until(lambda: d.vms[vm_id].state is V.STOPPING_STANDBY, 6 * 3600)
    lost(d, vm_id)


SCENARIOS = [queue, queue_timeout, launch_failed_with_a_warm_vm_free, stockouts, failed_pulls, failed_launches, failed_deletes_and_the_reconciler, failed_wipe, unhealthy,
             stop_while_starting, lost_mid_pull, standby, standby_lost]


def edges(objects) -> set[tuple]:
    out = set()
    for obj in objects:
        states = [None, *(type(obj.state)(h.state) for h in obj.history)]
        out |= set(zip(states, states[1:]))
    return out


def test_every_table_edge_is_taken_by_some_scenario():
    vm_edges, session_edges = set(), set()
    for scenario in SCENARIOS:
        d = quiet(max_vms=4)
        scenario(d)
        vm_edges |= edges(d.vms.values())
        session_edges |= edges(d.sessions.values())
    d = Driver(make_core(min_vms=2, max_vms=6))
    busy(d)
    vm_edges |= edges(d.vms.values())
    session_edges |= edges(d.sessions.values())

    table_vm = {(old, new) for old, row in VM_TRANSITIONS.items() for new in row}
    table_session = {(old, new) for old, row in SESSION_TRANSITIONS.items() for new in row}
    assert table_vm - vm_edges == set()
    assert table_session - session_edges == set()
    assert vm_edges <= table_vm and session_edges <= table_session  # as the models enforce
