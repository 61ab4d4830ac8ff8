"""ClusterCore scenarios in virtual time, continued: releasing VMs, autoscaling, restart and the
notebook step (tests/test_core.py has starts, the queue, stockouts, culling and stopping)."""

from __future__ import annotations

import json

import pytest
from core_scenarios import CATALOG, LATEST, active, driver, states, no_more_than
from core_driver import POOL, Driver, make_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.decide.autoscale import SCALE_DOWN_IDLE_S, STABILIZATION_S, desired_vms
from provisioner.cloud.base import CloudFailure
from provisioner.decide.commands import Delete, Launch, Pull, StartNotebook, StopNotebook, Wipe
from provisioner.decide import events as ev
from provisioner.decide.events import Restored, SessionForgotten
from provisioner.model.errors import FailedPrecondition
from provisioner.model.records import Session, Vm, vm_copy
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V


# ---- releasing VMs ------------------------------------------------------------------------

def test_pool_without_recycling_deletes_the_vm_after_the_session():
    d = driver(recycle=False)
    vm = d.add_warm(LATEST)
    s = d.allocate()
    d.started(s)
    d.stop(s)
    d.advance(d.core.config.sim.notebook_stop_s)
    assert vm.state is V.DELETING and s.state is S.STOPPING
    assert [c.vm_id for c in d.commands(Delete)] == [vm.id] and not d.commands(Wipe)
    d.run_until(lambda: s.state is S.STOPPED, 120)
    assert vm.id not in d.core.vms and states(vm)[-3:] == ["assigned", "deleting", "deleted"]


def test_a_failed_delete_after_the_session_still_ends_it():
    """recycle: false and the delete fails for good (a lost reply whose retries ran out, or an
    operation past its timeout): the stopping session ends at once; the reconciler later finds
    the VM gone. A session left stopping would count as active and accrue GPU hours forever."""
    from provisioner.decide.reconcile import reconcile

    d = driver(recycle=False, min_vms=0)
    vm = d.add_warm(LATEST)
    s = d.allocate()
    d.started(s)
    d.stop(s)
    d.advance(d.core.config.sim.notebook_stop_s)
    assert vm.state is V.DELETING and s.state is S.STOPPING
    [delete] = d.commands(Delete)
    d.fail(delete, CloudFailure("unavailable", "operation not done in 600s", vm.zone))
    assert vm.state is V.FAILED
    assert s.state is S.STOPPED and s.ended_at == d.now
    d.reconciled(reconcile(d.core.vms.values(), [], d.now))
    assert vm.id not in d.core.vms and states(vm)[-3:] == ["deleting", "failed", "deleted"]


def test_a_restored_stopping_session_on_a_failed_vm_ends_when_the_reconciler_finds_it_gone():
    from provisioner.decide.reconcile import reconcile

    d = driver(recycle=False, min_vms=0)
    vm = d.add_warm(LATEST)
    s = d.allocate()
    d.stop(s)
    failed = vm_copy(d.core.vms[vm.id])
    failed.to(V.FAILED, "delete failed: unavailable", d.now)  # as recorded before the session was ended
    records = (d.core.sessions[s.id],), (failed,)
    d = driver(recycle=False, min_vms=0)  # a restart, from those records
    d.send(Restored(d.now, *records))
    s, vm = d.live(records[0][0]), d.live(failed)
    d.reconciled(reconcile(d.core.vms.values(), [], d.now))
    assert s.state is S.STOPPED and vm.id not in d.core.vms


def test_failed_wipe_deletes_the_vm_and_still_ends_the_session():
    d = driver()
    vm = d.add_warm(LATEST)
    s = d.allocate()
    d.fail_wipes = True
    d.stop(s)
    d.run_until(lambda: s.state is S.STOPPED, 60)
    assert vm.state is V.DELETING and "wipe failed" in vm.reason  # never reused unwiped
    assert d.allocate(user="bob").state is S.PROVISIONING


def test_failed_pull_moves_the_session_to_a_new_vm():
    d = driver()
    vm = d.add_warm("gpu:v159")
    d.fail_pulls = True
    s = d.allocate(image="gpu:v160")
    d.run_until(lambda: s.state is not S.PULLING_IMAGE, 600)
    d.fail_pulls = False
    assert vm.state is V.DELETING and s.state is S.PROVISIONING and s.vm_id != vm.id
    d.run_until(lambda: s.state is S.RUNNING, 1200)


def test_unhealthy_warm_vm_is_deleted():
    d = driver()
    vm = d.add_warm(LATEST)
    d.health(vm.id, True)
    assert vm.state is V.WARM
    d.health(vm.id, False, "xid 79: GPU has fallen off the bus")
    assert vm.state is V.DELETING and [c.vm_id for c in d.commands(Delete)] == [vm.id]
    assert d.allocate().state is S.PROVISIONING  # it is not handed out


def test_unhealthy_assigned_vm_fails_its_session():
    d = driver()
    vm = d.add_warm(LATEST)
    s = d.allocate()
    d.health(vm.id, False, "xid 48: double-bit ECC error")
    assert s.state is S.FAILED and "xid 48: double-bit ECC error" in s.reason and s.ended_at == d.now
    assert vm.state is V.DELETING and [c.vm_id for c in d.commands(Delete)] == [vm.id]
    d.run_until(lambda: vm.id not in d.core.vms, 120)


# ---- autoscaling --------------------------------------------------------------------------

def test_autoscaler_fills_the_pool_to_min_vms():
    d = driver(min_vms=3, max_vms=5, headroom_fraction=0.2)
    d.advance(d.tick_s)
    launches = d.commands(Launch)
    assert len(launches) == 3 and all(c.session_id == "" and c.images == (LATEST,) for c in launches)
    d.advance(10 * d.tick_s)
    assert len(d.commands(Launch)) == 3  # starting VMs count


@pytest.mark.parametrize("max_vms, expected", [(10, 6), (5, 5)])
def test_autoscaler_keeps_demand_plus_headroom_within_max(max_vms, expected):
    d = driver(max_vms=max_vms, headroom_fraction=0.5)
    d.checks.append(lambda d: no_more_than(d, expected))
    for _ in range(4):
        d.add_warm(LATEST)
    sessions = [d.allocate(f"u{i}") for i in range(4)]
    d.started(*sessions)
    d.advance(1200)  # 4 assigned + ceil(4 * 0.5) warm
    assert len(active(d)) == expected


def test_surplus_warm_vms_go_only_after_the_scale_down_delay():
    d = driver(headroom_fraction=0.2)  # no demand: one warm VM of headroom is wanted
    vms = [d.add_warm(LATEST) for _ in range(3)]
    t0 = d.now
    first = d.run_until(lambda: any(vm.state is V.DELETING for vm in vms), 2 * SCALE_DOWN_IDLE_S)
    assert SCALE_DOWN_IDLE_S <= first - t0 <= SCALE_DOWN_IDLE_S + d.tick_s
    d.advance(600)
    assert len(d.commands(Delete)) == 2 and len(active(d)) == 1


ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 4), st.sampled_from(["gpu:latest", "gpu:v158"])),
    st.tuples(st.just("stop"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([2.0, 20.0, 200.0, 700.0])),
), max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(0, 2), st.integers(2, 5), st.sampled_from([0.0, 0.2, 1.0]))
def test_autoscaler_never_exceeds_max_nor_deletes_an_assigned_vm(steps, min_vms, max_vms, headroom):
    d = driver(min_vms=min_vms, max_vms=max_vms, headroom_fraction=headroom)
    d.checks.append(lambda d: no_more_than(d, max_vms))
    for op, *args in steps:
        if op == "alloc":
            d.allocate(f"u{args[0]}", args[1])
        elif op == "stop" and d.core.sessions:
            d.stop(list(d.core.sessions.values())[args[0] % len(d.core.sessions)])
        elif op == "advance":
            d.advance(args[0])
    for s in list(d.core.sessions.values()):
        d.stop(s)
    # Every boot, pull, wipe and scale-down is done by then, and the peak has left the window.
    d.advance(STABILIZATION_S + SCALE_DOWN_IDLE_S + 800)
    for vm in d.vms.values():  # recycling pool, no health events: nothing assigned is deleted
        assert "assigned,deleting" not in ",".join(states(vm)), vm.history
    pool = d.core.pools[POOL]
    assert len(active(d)) == desired_vms(d.core.snapshot(pool))


# ---- restart ------------------------------------------------------------------------------

def roundtrip(objs, cls):
    """As the store keeps them: JSON of to_dict()."""
    return [cls.from_dict(json.loads(json.dumps(o.to_dict()))) for o in objs]


def test_restore_rebuilds_state_and_reissues_cloud_work():
    d = driver(max_vms=4)
    va, vb, vc = d.add_warm(LATEST), d.add_warm("gpu:v159"), d.add_warm("gpu:v158")
    s1, s2 = d.allocate("u1"), d.allocate("u2")
    assert (s1.vm_id, s2.vm_id, s2.state) == (va.id, vb.id, S.PULLING_IMAGE)
    d.evict(vc.id, "bad host")  # vc: deleting
    d.stop(s1)  # va: recycling
    s3 = d.allocate("u3")  # cold: creating
    d.advance(d.create_s)  # ... booting
    s4 = d.allocate("u4")  # cold: creating
    s5 = d.allocate("u5")  # the pool is at max: queued
    old = d.core
    v3, v4 = old.vms[s3.vm_id], old.vms[s4.vm_id]
    assert [vm.state for vm in (va, vb, vc, v3, v4)] == [V.RECYCLING, V.ASSIGNED, V.DELETING, V.BOOTING, V.CREATING]
    assert (s1.state, s5.state) == (S.STOPPING, S.QUEUED)

    new = make_core(max_vms=4, min_vms=0, headroom_fraction=0.0, seed=1)  # fresh ids, as after a restart
    step = new.handle(Restored(d.now, tuple(roundtrip(old.sessions.values(), Session)),
                               tuple(roundtrip(old.vms.values(), Vm))))
    assert {i: s.to_dict() for i, s in new.sessions.items()} == {i: s.to_dict() for i, s in old.sessions.items()}
    assert {i: v.to_dict() for i, v in new.vms.items()} == {i: v.to_dict() for i, v in old.vms.items()}
    assert list(new.pools[POOL].queue) == [s5.id] and set(new.pools[POOL].vms) == set(old.pools[POOL].vms)
    assert new.get_by_request(s5.spec.key).id == s5.id

    r = Driver(new, now=d.now)
    r.carry(new, step)  # the re-issued commands, carried out
    assert sorted((type(cmd).__name__, cmd.vm_id, cmd.session_id) for cmd in r.commands()) == sorted([
        ("Launch", v3.id, s3.id), ("Launch", v4.id, s4.id), ("Wipe", va.id, s1.id),
        ("Delete", vc.id, ""), ("Pull", vb.id, s2.id)])
    [pull] = r.commands(Pull)
    assert pull.image == LATEST and pull.layers == tuple(vb.cache.missing(LATEST, CATALOG))

    # The restored core finishes what was under way; the queued session gets the wiped VM.
    got = {s.id: r.live(new.sessions[s.id]) for s in (s1, s2, s3, s4, s5)}
    r.run_until(lambda: all(got[s.id].state is S.RUNNING for s in (s2, s3, s4, s5)), 1500)
    assert got[s1.id].state is S.STOPPED and got[s5.id].vm_id == va.id and vc.id not in new.vms


def test_only_ended_sessions_can_be_forgotten():
    d = driver()
    d.add_warm(LATEST)
    s = d.allocate(request_id="keep-me")
    with pytest.raises(FailedPrecondition):
        d.send(SessionForgotten(d.now, s.id))
    d.stop(s)
    d.run_until(lambda: s.state is S.STOPPED, 600)
    d.send(SessionForgotten(d.now, s.id))
    assert s.id not in d.core.sessions and s.spec.key not in d.core.by_request


# ---- the notebook ------------------------------------------------------------------------

def test_a_notebook_that_does_not_start_fails_its_session_with_the_reason_and_its_vm_is_wiped():
    d = driver(min_vms=0, headroom_fraction=0.0)
    vm = d.add_warm(LATEST)
    d.fail_notebooks = "container exited 1: ModuleNotFoundError: No module named 'jupyterlab'"
    s = d.allocate()
    assert s.state is S.STARTING
    d.advance(d.core.config.sim.notebook_start_s)
    assert s.state is S.FAILED
    assert s.reason == "the notebook did not start: container exited 1: ModuleNotFoundError: No module named 'jupyterlab'"
    assert vm.state is V.RECYCLING and [c.vm_id for c in d.commands(Wipe)] == [vm.id]
    d.fail_notebooks = ""
    d.advance(d.core.config.sim.wipe_s)
    assert vm.state is V.WARM  # wiped: the next session may have it
    assert d.allocate("bob").vm_id == vm.id


def test_a_session_stopped_while_its_notebook_starts_ends_the_notebook_then_the_vm_is_wiped():
    d = driver(min_vms=0, headroom_fraction=0.0)
    vm = d.add_warm(LATEST)
    s = d.allocate()
    [start] = d.commands(StartNotebook)
    d.stop(s, "changed my mind")
    [stop] = d.commands(StopNotebook)
    assert (stop.vm_id, stop.session_id) == (vm.id, s.id) and s.state is S.STOPPING and vm.state is V.ASSIGNED
    d.advance(d.core.config.sim.notebook_stop_s + d.core.config.sim.wipe_s)
    assert s.state is S.STOPPED and vm.state is V.WARM
    assert [h.state for h in s.history] == ["starting", "stopping", "stopped"]
    assert start.id not in {c.id for c in d.core.in_flight()}  # its late answer applies to nothing


def test_a_restart_starts_or_stops_the_notebook_again():
    d = driver(min_vms=0, headroom_fraction=0.0)
    d.add_warm(LATEST)
    d.add_warm(LATEST)
    stopping = d.allocate("ub")
    d.started(stopping)
    d.lost = {ev.NotebookStarted, ev.NotebookStopped}  # the process ends before the answers come
    starting = d.allocate("ua")
    d.stop(stopping)
    d.advance(1)
    assert (starting.state, stopping.state) == (S.STARTING, S.STOPPING)
    replay = Driver(make_core(min_vms=0, headroom_fraction=0.0), now=d.now)
    step = replay.send(ev.Restored(d.now, tuple(d.core.sessions.values()), tuple(d.core.vms.values())))
    again = {(type(c).__name__, c.session_id) for c in step.commands}
    assert again == {("StartNotebook", starting.id), ("StopNotebook", stopping.id)}
    replay.advance(d.core.config.sim.notebook_stop_s + d.core.config.sim.wipe_s)
    assert replay.core.sessions[starting.id].state is S.RUNNING
    assert replay.core.sessions[stopping.id].state is S.STOPPED
