"""Reconciliation: records against the cloud's inventory (pure), and the core applying it."""

from __future__ import annotations

from core_driver import Driver, make_core
from provisioner.cloud.base import CloudFailure, CloudVm
from provisioner.decide.events import CommandFailed, EvictRequested, Reconciled, StopRequested, WipeDone
from provisioner.decide.commands import Wipe
from provisioner.decide.reconcile import reconcile
from provisioner.model.records import Vm
from provisioner.model.states import SessionState, VmState

V = VmState


def record(vm_id: str, state: VmState) -> Vm:
    vm = Vm(id=vm_id, cluster="c", pool="p", zone="z", cache=None, created_at=0.0)  # type: ignore[arg-type]
    vm.state = state
    return vm


def cloud(vm_id: str, status: str = "running") -> CloudVm:
    return CloudVm(vm_id, "z", status)  # type: ignore[arg-type]


def test_each_kind_of_difference_is_found():
    records = [record("warm-here", V.WARM), record("assigned-gone", V.ASSIGNED), record("recycling-gone", V.RECYCLING),
               record("deleting-gone", V.DELETING), record("deleting-here", V.DELETING),
               record("failed-gone", V.FAILED), record("failed-here", V.FAILED), record("creating-gone", V.CREATING),
               record("booting-here", V.BOOTING), record("deleted-here", V.DELETED),
               record("warm-terminated", V.WARM)]
    inventory = [cloud("warm-here"), cloud("deleting-here"), cloud("failed-here"), cloud("booting-here"),
                 cloud("deleted-here"), cloud("stray"), cloud("warm-terminated", "terminated")]
    plan = reconcile(records, inventory, now=100.0, grace_s=0.0)
    assert plan.adopted == ["warm-here", "deleting-here", "booting-here"]  # the delete goes on
    assert plan.lost == ["assigned-gone", "recycling-gone"]
    assert plan.terminated == ["warm-terminated"]
    assert plan.deleted == ["deleting-gone", "failed-gone"]
    assert plan.retry_delete == ["failed-here"]
    # A deleted record claims nothing: its VM, still there, is a stray like one never recorded.
    assert [c.vm_id for c in plan.strays] == ["deleted-here", "stray"]
    assert "creating-gone" not in plan.lost + plan.deleted  # its launch decides
    assert plan.changes == 3 + 2 + 1 + 2


def test_a_stray_is_deleted_only_after_being_unclaimed_for_the_grace_period():
    first = reconcile([], [cloud("x")], now=100.0, grace_s=60.0)
    assert first.strays == [] and first.unclaimed_since == {"x": 100.0}
    early = reconcile([], [cloud("x")], now=130.0, unclaimed_since=first.unclaimed_since, grace_s=60.0)
    assert early.strays == [] and early.unclaimed_since == {"x": 100.0}
    late = reconcile([], [cloud("x")], now=160.0, unclaimed_since=early.unclaimed_since, grace_s=60.0)
    assert [c.vm_id for c in late.strays] == ["x"]
    claimed = reconcile([record("x", V.WARM)], [cloud("x")], now=160.0, unclaimed_since=first.unclaimed_since)
    assert claimed.strays == [] and claimed.unclaimed_since == {}  # a record appeared: forgotten


def test_core_fails_a_session_whose_vm_vanished_and_replaces_the_vm():
    d = Driver(make_core())
    d.advance(1_500)  # the pool fills and pulls the latest image
    s = d.allocate(user="ada", image="gpu:latest")
    d.advance(10)
    vm_id = d.core.sessions[s.id].vm_id
    assert d.core.sessions[s.id].state is SessionState.RUNNING
    present = [cloud(v.id) for v in d.core.vms.values() if v.state is not V.DELETED and v.id != vm_id]
    plan = reconcile(d.core.vms.values(), present, d.now)
    assert plan.lost == [vm_id]
    d.reconciled(plan)
    assert d.core.sessions[s.id].state is SessionState.FAILED
    assert "gone from the cloud" in d.core.sessions[s.id].reason
    assert [h.state for h in d.vms[vm_id].history][-2:] == ["failed", "deleted"]
    d.advance(200)  # the pool makes up for it
    assert sum(v.state is V.WARM for v in d.core.vms.values()) >= d.core.pools["gpu-p100"].policy.min_vms


def test_core_fails_a_session_whose_vm_was_terminated_and_deletes_the_vm():
    d = Driver(make_core())
    d.advance(1_500)
    s = d.allocate(user="ada", image="gpu:latest")
    d.advance(10)
    vm_id = d.core.sessions[s.id].vm_id
    inventory = [cloud(v.id, "terminated" if v.id == vm_id else "running")
                 for v in d.core.vms.values() if v.state is not V.DELETED]
    plan = reconcile(d.core.vms.values(), inventory, d.now)
    assert plan.terminated == [vm_id] and plan.lost == []
    step = d.core.handle(Reconciled(d.now, plan))
    assert d.core.sessions[s.id].state is SessionState.FAILED
    assert d.core.vms[vm_id].state is V.DELETING  # what is left of it (its disk) is deleted
    assert [c.vm_id for c in step.commands if type(c).__name__ == "Delete"] == [vm_id]


def test_a_wipe_result_for_a_vm_the_reconciler_removed_is_ignored():
    d = Driver(make_core())
    d.advance(1_500)
    s = d.allocate(user="ada", image="gpu:latest")
    d.advance(10)
    vm_id = d.core.sessions[s.id].vm_id
    d.stop(s, "done")
    d.advance(d.core.config.sim.notebook_stop_s)  # its notebook has ended: the VM is being wiped...
    [wipe] = [c for c in d.commands(Wipe) if c.vm_id == vm_id]
    assert d.core.vms[vm_id].state is V.RECYCLING
    present = [cloud(v.id) for v in d.core.vms.values() if v.state is not V.DELETED and v.id != vm_id]
    d.reconciled(reconcile(d.core.vms.values(), present, d.now))  # ...when it vanishes
    assert vm_id not in d.core.vms  # deleted and forgotten
    dropped = d.core.dropped
    d.send(WipeDone(d.now, wipe.id))  # the wipe's answer arrives late: nothing to do
    d.send(CommandFailed(d.now, wipe.id, CloudFailure("not_found", "gone", "z")))
    assert vm_id not in d.core.vms and d.core.dropped == dropped + 2


def test_core_finishes_deletes_and_retries_failed_ones():
    d = Driver(make_core())
    d.advance(200)
    a, b = [v for v in d.core.vms.values() if v.state is V.WARM][:2]
    d.core.handle(EvictRequested(d.now, a.id, "test"))  # deleting; its VM is already gone from the cloud
    [delete_b] = d.core.handle(EvictRequested(d.now, b.id, "test")).commands
    d.core.handle(CommandFailed(d.now, delete_b.id, CloudFailure("internal", "boom", b.zone)))  # failed for good
    plan = reconcile(d.core.vms.values(), [cloud(v.id) for v in d.core.vms.values() if v.id != a.id], d.now)
    assert plan.deleted == [a.id] and plan.retry_delete == [b.id]
    step = d.core.handle(Reconciled(d.now, plan))
    assert d.core.vms.get(a.id) is None or d.core.vms[a.id].state is V.DELETED
    assert d.core.vms[b.id].state is V.DELETING
    assert [c.vm_id for c in step.commands] == [b.id]


def test_starting_records_are_covered_a_create_after_its_grace():
    records = [record("booting-gone", V.BOOTING), record("booting-terminated", V.BOOTING),
               record("creating-young", V.CREATING), record("creating-old", V.CREATING)]
    records[2].created_at = 250.0  # entered creating 50 s ago: its insert may still be on the way
    plan = reconcile(records, [cloud("booting-terminated", "terminated")], now=300.0, create_grace_s=100.0)
    assert plan.lost == ["booting-gone", "creating-old"] and plan.terminated == ["booting-terminated"]
    assert plan.adopted == [] and "creating-young" not in plan.lost


def test_a_session_whose_vm_vanished_while_booting_gets_another():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    s = d.allocate(user="ada")
    d.advance(d.create_s + 1)  # its VM is booting
    first = d.live(d.core.vms[s.vm_id])
    assert first.state is V.BOOTING and s.state is SessionState.PROVISIONING
    d.reconciled(reconcile(d.core.vms.values(), [], d.now))
    assert first.state is V.DELETED and first.id not in d.core.vms
    assert s.state is SessionState.PROVISIONING and s.vm_id != first.id  # a new VM is made for it
    d.run_until(lambda: s.state is SessionState.RUNNING, 1200)  # the lost VM's late answers change nothing
