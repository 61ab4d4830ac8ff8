"""ClusterCore scenarios in virtual time: the driver plays the cloud, the tests read the core."""

from __future__ import annotations

import json

import pytest
from core_driver import POOL, Driver, fleet, make_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.decide.autoscale import SCALE_DOWN_IDLE_S, STABILIZATION_S, STOCKOUT_MEMORY_S, desired_vms
from provisioner.cloud.base import CloudFailure
from provisioner.decide.commands import Delete, Launch, Pull, StartNotebook, StopNotebook, Wipe
from provisioner.decide import events as ev
from provisioner.decide.events import Restored, SessionForgotten
from provisioner.model.errors import FailedPrecondition
from provisioner.model.images import ImageCatalog
from provisioner.model.records import Session, SessionKind, StartKind, Vm
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V

CATALOG = fleet().catalog
LATEST = CATALOG.latest  # gpu:v160
ZONE_C, ZONE_F = "us-central1-c", "us-central1-f"  # the us-central1 gpu-p100 zones


def driver(**pool) -> Driver:
    """A quiet pool by default: no minimum, no headroom, so only the test's requests move it."""
    return Driver(make_core(**{"min_vms": 0, "headroom_fraction": 0.0, **pool}))


def states(vm: Vm) -> list[str]:
    return [h.state for h in vm.history]


def active(d: Driver) -> list[Vm]:
    return [vm for vm in d.core.vms.values() if vm.state in (V.CREATING, V.BOOTING, V.WARM, V.ASSIGNED, V.RECYCLING)]


def _no_more_than(d: Driver, n: int) -> None:
    assert len(active(d)) <= n


def idle_with(d: Driver, image: str) -> list[Vm]:
    return [vm for vm in d.core.vms.values() if vm.state is V.WARM and vm.cache.has_image(image, CATALOG)]


def bandwidth(d: Driver) -> float:
    return d.core.config.sim.pull_bytes_per_s


# ---- the three kinds of start -------------------------------------------------------------

def test_warm_hit_starts_its_notebook_at_once_and_pins_latest():
    d = driver(min_vms=2)
    # The autoscaler fills the pool and prewarms latest onto the new VMs.
    d.run_until(lambda: len(idle_with(d, LATEST)) == 2, 1200)
    n_commands = len(d.log)

    s = d.allocate(image="gpu:latest")
    assert (s.state, s.start, s.image) == (S.STARTING, StartKind.WARM, "gpu:v160")
    assert d.core.vms[s.vm_id].state is V.ASSIGNED
    [(_, start)] = d.log[n_commands:]  # nothing to launch or pull: the notebook starts
    assert isinstance(start, StartNotebook) and (start.vm_id, start.session_id, start.image) == (
        s.vm_id, s.id, "gpu:v160")
    d.started(s)
    assert s.ready_at == s.created_at + d.core.config.sim.notebook_start_s == d.now and s.endpoint

    # "latest" moves on (a new catalog is rolled out): the session keeps the version it got.
    versions = {v: [layer.id for layer in CATALOG.layers(v)] for v in CATALOG.versions()}
    d.core.catalog = ImageCatalog(CATALOG.layer_sizes, versions, latest="gpu:v159")
    d.advance(60)
    assert (s.state, s.image, s.spec.image) == (S.RUNNING, "gpu:v160", "gpu:latest")
    assert Session.from_dict(json.loads(json.dumps(s.to_dict()))).image == "gpu:v160"
    assert d.allocate(user="bob", image="gpu:latest").image == "gpu:v159"


def test_partial_hit_pulls_only_the_missing_layers():
    d = driver()
    vm = d.add_warm("gpu:v159")
    s = d.allocate(image="gpu:v160")
    assert (s.state, s.start, s.vm_id) == (S.PULLING_IMAGE, StartKind.PARTIAL, vm.id)

    [pull] = d.commands(Pull)
    old = CATALOG.layer_ids("gpu:v159")
    assert pull.layers == tuple(layer for layer in CATALOG.layers("gpu:v160") if layer.id not in old)
    assert (pull.vm_id, pull.image, pull.session_id) == (vm.id, "gpu:v160", s.id)
    missing = CATALOG.missing_bytes("gpu:v160", old)
    assert 0 < missing < CATALOG.size_bytes("gpu:v160") and s.pull_bytes_total == missing

    t0 = d.now
    ready = d.run_until(lambda: s.state is S.RUNNING, 3600)
    assert missing / bandwidth(d) <= ready - t0 <= missing / bandwidth(d) + d.tick_s
    assert s.start is StartKind.PARTIAL and s.pull_bytes_done == missing
    assert vm.cache.has_image("gpu:v160", CATALOG) and not vm.pulling


def test_cold_start_launches_boots_pulls_and_runs():
    d = driver()
    s = d.allocate()
    assert (s.state, s.start) == (S.PROVISIONING, StartKind.COLD)
    [launch] = d.commands(Launch)
    # What the shell turns into labels (cluster, pool, request = VM id, session).
    assert (launch.vm_id, launch.pool, launch.session_id, launch.images) == (s.vm_id, POOL, s.id, (LATEST,))
    assert launch.zone in d.core.pools[POOL].config.zones
    vm = d.core.vms[s.vm_id]
    assert (vm.state, vm.reserved_for, vm.zone) == (V.CREATING, s.id, launch.zone)

    booted = d.run_until(lambda: s.state is not S.PROVISIONING, 600)
    assert s.state is S.PULLING_IMAGE
    assert booted == pytest.approx(d.create_s + d.core.config.sim.boot_s)
    [pull] = d.commands(Pull)
    assert sum(layer.size_bytes for layer in pull.layers) == CATALOG.size_bytes(LATEST)

    ready = d.run_until(lambda: s.state is S.RUNNING, 3600)
    assert ready - booted == pytest.approx(CATALOG.size_bytes(LATEST) / bandwidth(d) + d.core.config.sim.notebook_start_s)
    assert [h.state for h in s.history] == ["provisioning", "pulling_image", "starting", "running"]
    assert s.start is StartKind.COLD and states(vm) == ["creating", "booting", "warm", "assigned"]


# ---- the queue ----------------------------------------------------------------------------

def test_full_pool_queues_fairly_and_hands_over_a_wiped_vm():
    d = driver(max_vms=2)
    for _ in range(2):
        d.add_warm(LATEST)
    a, b = d.allocate("ua"), d.allocate("ub")
    d.started(a, b)

    waiting = {}
    for name, user, kind in [("c", "uc", SessionKind.BATCH), ("d1", "ud", SessionKind.INTERACTIVE),
                             ("d2", "ud", SessionKind.INTERACTIVE), ("e1", "ue", SessionKind.INTERACTIVE)]:
        d.advance(1)
        waiting[name] = d.allocate(user, kind=kind)
    assert all(s.state is S.QUEUED for s in waiting.values())
    assert not d.commands(Launch)  # at max_vms: nothing to launch
    # Interactive first; ud's second request waits behind ue's first; batch last.
    assert {n: s.queue_position for n, s in waiting.items()} == {"d1": 1, "e1": 2, "d2": 3, "c": 4}

    vm = d.core.vms[a.vm_id]
    stopped_at = d.now
    d.stop(a)
    [stop] = d.commands(StopNotebook)  # its notebook ends first, then its VM is wiped
    assert (stop.vm_id, stop.session_id) == (vm.id, a.id) and vm.state is V.ASSIGNED
    d.advance(d.core.config.sim.notebook_stop_s)
    assert vm.state is V.RECYCLING and waiting["d1"].state is S.QUEUED  # never handed over unwiped
    d.run_until(lambda: waiting["d1"].state is S.RUNNING, 600)
    assert d.now - stopped_at >= d.core.config.sim.wipe_s
    assert a.state is S.STOPPED and waiting["d1"].vm_id == vm.id and vm.session_id == waiting["d1"].id
    assert states(vm)[-4:] == ["assigned", "recycling", "warm", "assigned"]
    assert waiting["d1"].queue_position == 0 and waiting["c"].queue_position == 3


def test_serving_the_head_does_not_let_a_second_request_overtake():
    d = driver(max_vms=1)
    d.add_warm(LATEST)
    a = d.allocate("ua")
    d1, _, d2, _, e1 = d.allocate("ud"), d.advance(1), d.allocate("ud"), d.advance(1), d.allocate("ue")
    assert (d1.queue_position, e1.queue_position, d2.queue_position) == (1, 2, 3)
    d.stop(a)
    d.run_until(lambda: d1.state is S.RUNNING, 600)
    assert (e1.queue_position, d2.queue_position) == (1, 2)


# ---- stockouts ----------------------------------------------------------------------------

def test_stocked_out_zone_is_avoided_for_its_memory():
    d = driver(min_vms=1, max_vms=5)
    d.fail_zones[ZONE_C] = "stockout"
    d.run_until(lambda: len(d.commands(Launch)) == 2, 60)
    first, second = d.commands(Launch)
    assert (first.zone, second.zone) == (ZONE_C, ZONE_F)
    failed_at = d.log[0][0] + d.create_s
    assert d.core.pools[POOL].stocked_out_until[ZONE_C] == failed_at + STOCKOUT_MEMORY_S
    d.fail_zones.clear()

    # Within the memory a new VM still goes to F, though C has none.
    d.set_policy(min_vms=2)
    d.advance(d.tick_s)
    assert d.commands(Launch)[-1].zone == ZONE_F
    # Once it expires, C is tried again (it has the fewest of the pool's VMs).
    d.advance(failed_at + STOCKOUT_MEMORY_S - d.now)
    d.set_policy(min_vms=3)
    d.advance(d.tick_s)
    assert d.commands(Launch)[-1].zone == ZONE_C


def test_a_stockout_is_remembered_for_the_zone_the_cloud_names():
    d = driver(min_vms=1, max_vms=5)
    d.run_until(lambda: len(d.commands(Launch)) == 1, 60)
    launch = d.commands(Launch)[0]
    other = ZONE_F if launch.zone == ZONE_C else ZONE_C  # e.g. a GKE node pool's own zone
    d.fail(launch, CloudFailure("stockout", "ZONE_RESOURCE_POOL_EXHAUSTED", other))
    assert list(d.core.pools[POOL].stocked_out_until) == [other]


def test_all_zones_stocked_out_queues_until_the_memory_expires():
    d = driver(min_vms=2, max_vms=5)
    d.fail_zones = {ZONE_C: "stockout", ZONE_F: "stockout"}
    d.run_until(lambda: all(vm.state is V.DELETED for vm in d.vms.values()) and len(d.vms) == 2, 60)
    until = max(d.core.pools[POOL].stocked_out_until.values())
    d.fail_zones.clear()

    s = d.allocate()
    assert s.state is S.QUEUED and s.queue_position == 1 and "stocked out" in s.reason
    t_queued = d.now
    started = d.run_until(lambda: s.state is not S.QUEUED, 600)
    assert not [t for t, c in d.log if isinstance(c, Launch) and t_queued <= t < started]
    assert until <= started <= until + d.tick_s
    assert s.state is S.PROVISIONING and s.queue_position == 0
    d.run_until(lambda: s.state is S.RUNNING, 1200)


def test_cold_start_fails_over_to_another_zone():
    d = driver()
    d.fail_zones[ZONE_C] = "stockout"
    s = d.allocate()
    assert d.commands(Launch)[0].zone == ZONE_C
    d.advance(d.create_s)
    assert d.commands(Launch)[-1].zone == ZONE_F and d.commands(Launch)[-1].session_id == s.id
    assert s.state is S.PROVISIONING
    d.run_until(lambda: s.state is S.RUNNING, 1200)


def test_failed_cold_start_that_gets_a_warm_vm_is_a_warm_hit():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0, max_vms=2, zones=(ZONE_C,)), create_s=30.0)
    d.add_warm(LATEST)
    first = d.allocate("ua")
    d.fail_zones[ZONE_C] = "stockout"
    s = d.allocate("ub")
    assert s.state is S.PROVISIONING
    d.stop(first)  # its notebook stops (2 s), its VM is wiped (20 s), before the launch fails (30 s)
    d.run_until(lambda: s.state is not S.PROVISIONING, 60)
    assert s.state is S.STARTING and s.vm_id == first.vm_id
    assert s.start is StartKind.WARM


def test_a_session_queued_past_the_queue_timeout_fails_and_one_placed_in_time_does_not():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0, max_vms=1, sessions={"queue_timeout_s": 600.0}))
    d.add_warm(LATEST)
    first = d.allocate("ua")
    queued = [d.allocate("ub"), d.allocate("uc")]
    assert [s.state for s in queued] == [S.QUEUED, S.QUEUED]
    d.advance(300)
    d.stop(first)  # its wiped VM goes to the first in the queue
    d.run_until(lambda: any(s.state is S.RUNNING for s in queued), 60)
    [served] = [s for s in queued if s.state is S.RUNNING]
    [waiting] = [s for s in queued if s is not served]
    d.advance(599 - d.now)
    assert waiting.state is S.QUEUED and waiting.queue_position == 1
    d.advance(d.tick_s + 1)
    assert waiting.state is S.FAILED and "in the queue" in waiting.reason and waiting.ended_at <= 600 + d.tick_s
    assert served.state is S.RUNNING and not d.core.pools[POOL].queue


def test_a_burst_that_times_out_together_leaves_the_rest_of_the_queue_numbered_in_order():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0, max_vms=1, sessions={"queue_timeout_s": 600.0}))
    d.add_warm(LATEST)
    d.allocate("holder")
    burst = [d.allocate(f"b{i}") for i in range(6)]
    d.advance(100)
    later = [(d.allocate(f"l{i}"), d.advance(1))[0] for i in range(3)]
    assert sorted(s.queue_position for s in burst + later) == list(range(1, 10))
    d.advance(600 - d.now + d.tick_s)
    assert all(s.state is S.FAILED and s.queue_position == 0 for s in burst)
    assert [s.queue_position for s in later] == [1, 2, 3]
    assert list(d.core.pools[POOL].queue) == [s.id for s in later]


def test_without_a_queue_timeout_a_session_waits_as_long_as_it_takes():
    # No share: the batch is not preempted for the interactive session.
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0, max_vms=1, priority={"share_gpus_per_user": 0}))
    d.add_warm(LATEST)
    d.allocate("ua", kind=SessionKind.BATCH)  # holds the one VM for its max runtime (12 h)
    s = d.allocate("ub")
    d.advance(40_000)
    assert s.state is S.QUEUED


# ---- culling ------------------------------------------------------------------------------

def test_idle_interactive_session_is_stopped_at_its_idle_timeout():
    d = driver()
    d.add_warm(LATEST)
    s = d.allocate()
    d.started(s)
    stopped = d.run_until(lambda: s.state is not S.RUNNING, 5000)
    assert s.idle_timeout_s == 3600
    assert s.idle_timeout_s <= stopped - s.ready_at <= s.idle_timeout_s + d.tick_s
    assert s.state is S.STOPPING and "idle" in s.reason
    d.run_until(lambda: s.state is S.STOPPED, 60)


def test_touch_resets_the_idle_timer():
    d = driver()
    d.add_warm(LATEST)
    s = d.allocate()
    d.advance(3000)
    d.touch(s)
    d.advance(3000)  # 6000 s after start, 3000 s after the touch
    assert s.state is S.RUNNING
    stopped = d.run_until(lambda: s.state is not S.RUNNING, 1000)
    assert 6600 <= stopped <= 6600 + d.tick_s and "idle" in s.reason


def test_batch_session_is_not_idle_culled_but_stops_at_max_runtime():
    d = driver()
    d.add_warm(LATEST)
    s = d.allocate(kind=SessionKind.BATCH)
    assert s.max_runtime_s == fleet().settings.sessions.batch_max_runtime_s == 43200
    d.advance(2 * s.idle_timeout_s)
    assert s.state is S.RUNNING
    stopped = d.run_until(lambda: s.state is not S.RUNNING, 43200)
    assert s.max_runtime_s <= stopped - s.ready_at <= s.max_runtime_s + d.tick_s
    assert "max runtime" in s.reason


# ---- stopping -----------------------------------------------------------------------------

def test_stop_is_idempotent():
    d = driver()
    d.add_warm(LATEST)
    s = d.allocate()
    d.stop(s, "done")
    history = list(s.history)
    assert d.stop(s, "again") is s and s.history == history and s.reason == "done"
    d.run_until(lambda: s.state is S.STOPPED, 60)
    d.stop(s)
    assert s.state is S.STOPPED and len(s.history) == len(history) + 1
    assert len(d.commands(Wipe)) == 1


def test_stop_of_a_queued_session_leaves_the_queue():
    d = driver(max_vms=1)
    d.add_warm(LATEST)
    d.allocate("ua")
    q1, _, q2 = d.allocate("ub"), d.advance(1), d.allocate("uc")
    assert (q1.queue_position, q2.queue_position) == (1, 2)
    d.stop(q1)
    assert q1.state is S.STOPPED and q1.ended_at == d.now and q1.queue_position == 0
    assert list(d.core.pools[POOL].queue) == [q2.id] and q2.queue_position == 1


def test_a_move_in_the_queue_is_told_to_watchers_not_written():
    """The head of a queue leaving moves everyone behind it up one place. The places change in
    memory and the step lists the moved sessions for their watchers, but only the session that
    left is a changed record (a new revision, a row to write): a long queue served from its head
    would otherwise rewrite itself at every step."""
    d = driver(max_vms=1)
    d.add_warm(LATEST)
    d.allocate("holder")
    waiting = [(d.allocate(f"u{i}"), d.advance(1))[0] for i in range(5)]  # in this order
    revisions = [s.revision for s in waiting]
    step = d.send(ev.StopRequested(d.now, waiting[0].id, ""))
    assert [s.id for s in step.sessions] == [waiting[0].id]
    assert sorted(s.id for s in step.moved) == sorted(s.id for s in waiting[1:])
    assert [s.queue_position for s in waiting[1:]] == [1, 2, 3, 4]
    assert [s.revision for s in waiting[1:]] == revisions[1:]
    step = d.send(ev.StopRequested(d.now, waiting[-1].id, ""))  # the tail leaving moves no one
    assert [s.id for s in step.sessions] == [waiting[-1].id] and step.moved == []


def test_a_restored_queue_is_numbered_again():
    """Places are not written as they move, so a record may hold an old one: a restore numbers
    the queue again from its order."""
    d = driver(max_vms=1)
    d.add_warm(LATEST)
    holder = d.allocate("holder")
    waiting = [(d.allocate(f"u{i}"), d.advance(1))[0] for i in range(3)]
    d.stop(waiting[0])
    records = [Session.from_dict(s.to_dict()) for s in (holder, *waiting)]
    for r in records[2:]:
        r.queue_position += 7  # as written before the head left
    fresh = Driver(make_core(min_vms=0, headroom_fraction=0.0, max_vms=1), now=d.now)
    fresh.send(Restored(d.now, tuple(records), tuple(Vm.from_dict(v.to_dict()) for v in d.core.vms.values())))
    assert [fresh.core.sessions[s.id].queue_position for s in waiting[1:]] == [1, 2]


def test_stop_while_provisioning_gives_the_vm_to_the_pool():
    d = driver()
    s = d.allocate()
    vm = d.core.vms[s.vm_id]
    d.stop(s)
    assert s.state is S.STOPPED and vm.reserved_for == ""
    d.run_until(lambda: vm.state is not V.CREATING and vm.state is not V.BOOTING, 600)
    assert vm.state is V.WARM and vm.session_id == "" and vm.id in d.core.pools[POOL].vms
    assert s.state is S.STOPPED


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
    vm.to(V.FAILED, "delete failed: unavailable", d.now)  # as recorded before the session was ended
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
    d.checks.append(lambda d: _no_more_than(d, expected))
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
    d.checks.append(lambda d: _no_more_than(d, max_vms))
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
    got = {s.id: new.sessions[s.id] for s in (s1, s2, s3, s4, s5)}
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
