"""ClusterCore scenarios in virtual time: the driver plays the cloud, the tests read the core."""

from __future__ import annotations

import json

import pytest
from core_scenarios import CATALOG, LATEST, ZONE_C, ZONE_F, bandwidth, driver, idle_with, states
from core_driver import POOL, Driver, fleet, make_core

from provisioner.decide.autoscale import STOCKOUT_MEMORY_S
from provisioner.cloud.base import CloudFailure
from provisioner.decide.commands import Launch, Pull, StartNotebook, StopNotebook, Wipe
from provisioner.decide import events as ev
from provisioner.decide.events import Restored
from provisioner.model.images import ImageCatalog
from provisioner.model.records import Session, SessionKind, StartKind, Vm
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V


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
    vm = d.live(d.core.vms[s.vm_id])
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

    vm = d.live(d.core.vms[a.vm_id])
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
    vm = d.live(d.core.vms[s.vm_id])
    d.stop(s)
    assert s.state is S.STOPPED and vm.reserved_for == ""
    d.run_until(lambda: vm.state is not V.CREATING and vm.state is not V.BOOTING, 600)
    assert vm.state is V.WARM and vm.session_id == "" and vm.id in d.core.pools[POOL].vms
    assert s.state is S.STOPPED
