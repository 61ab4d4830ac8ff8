"""The standby tier: idle VMs stopped with their disks, started for sessions before any new VM,
and a start that fails falling back the way a failed create does."""

from __future__ import annotations


from core_driver import POOL, Driver, make_core

from provisioner.api import convert
from provisioner.cloud.base import CloudVm
from provisioner.decide.assignment import choose_standby, standby_sooner
from provisioner.decide.autoscale import (SCALE_DOWN_IDLE_S, STANDBY_SCALE_DOWN_IDLE_S, STANDBY_STABILIZATION_S,
                                          PoolSnapshot, stabilization_s, standby_target)
from provisioner.decide.commands import Launch, Start, Stop
from provisioner.decide.events import Restored
from provisioner.decide.forecast import Dispersion, warm_for
from provisioner.decide.pools import AUTOSCALE_QUIET_S, FORECAST_REFRESH_S, forecast_due
from provisioner.decide.reconcile import reconcile
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V
from provisioner.model.records import StartKind, vm_copy


def standby_pool(**pool) -> Driver:
    return Driver(make_core(min_vms=0, headroom_fraction=0.0, standby=True, **pool))


def test_idle_vms_go_to_standby_and_a_session_starts_the_one_holding_its_image():
    d = standby_pool()
    first, second = d.make_standby(2)
    d.add_warm("gpu:v141", "gpu:v150")
    # The standby VMs kept their disks: both hold v160, neither v141 fully.
    assert all(vm.cache.has_image("gpu:v160", d.core.catalog) for vm in (first, second))
    d.evict(next(vm.id for vm in d.core.vms.values() if vm.state is V.WARM))
    s = d.allocate(image="gpu:v160")
    assert s.state is S.PROVISIONING and s.vm_id in (first.id, second.id)
    started = d.vms[s.vm_id]
    assert started.state is V.STARTING and d.commands(Start)[0].vm_id == started.id
    d.run_until(lambda: s.state is S.RUNNING, 600)
    assert s.start is StartKind.WARM and not d.commands(Launch, since=d.log[-1][0] - 600)
    assert s.ready_at - s.created_at == d.sim.start_median_s + d.sim.notebook_start_s


def test_a_session_with_no_warm_vm_starts_two_standby_vms_holding_its_image_and_takes_the_first_up():
    # A start's tail is long (a third of starts over 60 s at the sim's median and sigma): a second
    # VM started beside the session's serves it if it is up first; the other joins the pool.
    d = standby_pool()
    first, second = d.make_standby(2)
    durations = iter([300.0, 20.0])  # the session's own start deep in its tail, the other's quick
    d.physics[d.core.name].start_s = lambda pool: next(durations)
    since = d.now
    s = d.allocate(image="gpu:v160")
    own = d.live(d.vms[s.vm_id])
    other = second if own.id == first.id else first
    assert [c.vm_id for c in d.commands(Start, since=since)] == [own.id, other.id]
    assert other.state is V.STARTING and not other.reserved_for
    d.run_until(lambda: s.state is S.RUNNING, 600)
    assert s.vm_id == other.id and s.start is StartKind.WARM
    assert s.ready_at - s.created_at == 20.0 + d.sim.notebook_start_s
    d.run_until(lambda: own.state is not V.STARTING, 600)
    assert own.state is V.WARM and not own.session_id and not own.reserved_for  # the pool's now


def test_a_second_standby_vm_is_started_only_if_it_holds_the_sessions_image():
    d = standby_pool()
    d.make_standby(2, images=("gpu:v101", "gpu:v160"))
    since = d.now
    s = d.allocate(image="gpu:v160")
    assert [c.vm_id for c in d.commands(Start, since=since)] == [s.vm_id]


def test_a_session_starts_a_standby_vm_holding_its_image_rather_than_pull_it_for_minutes_onto_a_warm_vm():
    # A warm VM still filling its disk may lack minutes of pulls (v159 lacks 5 GB of v160: two
    # minutes); a stopped VM that kept the whole image is up in about 45 s.
    d = standby_pool()
    (stopped,) = d.make_standby(1)
    warm = d.add_warm("gpu:v159")
    s = d.allocate(image="gpu:v160")
    assert s.vm_id == stopped.id and stopped.state is V.STARTING
    assert warm.state is V.WARM and not warm.session_id
    d.run_until(lambda: s.state is S.RUNNING, 600)
    assert s.ready_at - s.created_at == d.sim.start_median_s + d.sim.notebook_start_s


def test_a_session_takes_a_warm_vm_whose_pull_is_shorter_than_a_standby_vms_start_and_pull():
    d = standby_pool()
    (stopped,) = d.make_standby(1, image="gpu:v101")
    warm = d.add_warm("gpu:v159")
    catalog, bandwidth = d.core.catalog, d.sim.pull_bytes_per_s
    warm_missing = catalog.missing_bytes("gpu:v160", warm.cache.layer_ids)
    stopped_missing = catalog.missing_bytes("gpu:v160", stopped.cache.layer_ids)
    assert not standby_sooner(warm_missing, stopped_missing, d.sim.start_median_s, bandwidth)
    s = d.allocate(image="gpu:v160")
    assert s.vm_id == warm.id and s.state is S.PULLING_IMAGE and stopped.state is V.STANDBY
    assert standby_sooner(None, stopped_missing, d.sim.start_median_s, bandwidth)  # no warm VM: start it


def test_a_standby_pool_lets_a_surplus_vm_go_minutes_after_it_goes_idle_unless_it_is_still_filling():
    # Stopped, a VM is back in about a minute with its disk: not worth ten minutes idle, nor an
    # hour held for the pool's peak. One still pulling the pool's images waits the ten minutes.
    d = standby_pool()
    s = d.allocate(image="gpu:v160")
    d.run_until(lambda: s.state is S.RUNNING, 1800)
    d.stop(s)
    filling = d.live(d.vms[s.vm_id])  # wiped, it pulls the pool's other images
    d.run_until(lambda: filling.state is V.WARM, 600)
    full = d.add_warm(*d.core.pools[POOL].ranking)
    idle_from = d.now
    d.run_until(lambda: full.state is not V.WARM, 2 * 3600)
    # The autoscaler looks at a quiet pool every AUTOSCALE_QUIET_S.
    assert STANDBY_SCALE_DOWN_IDLE_S <= d.now - idle_from <= STANDBY_SCALE_DOWN_IDLE_S + AUTOSCALE_QUIET_S + d.tick_s
    d.run_until(lambda: filling.state is not V.WARM, 2 * 3600)
    assert SCALE_DOWN_IDLE_S <= d.now - idle_from <= SCALE_DOWN_IDLE_S + AUTOSCALE_QUIET_S + d.tick_s
    assert stabilization_s("headroom", True) == STANDBY_STABILIZATION_S < stabilization_s("headroom", False)


def test_a_start_that_stocks_out_falls_back_to_a_standby_vm_in_another_zone():
    d = standby_pool()
    pair = d.make_standby(2, images=("gpu:v101", "gpu:v160"))
    assert pair[0].zone != pair[1].zone  # the pool spreads its VMs over its zones
    # a: the one the session is offered first (the best-cached, or the first of a tie).
    first = choose_standby("gpu:v101", d.core.pools[POOL].standby.values(), d.core.catalog, lambda v: True)
    a, b = pair if first.id == pair[0].id else pair[::-1]
    launches = len(d.commands(Launch))
    d.fail_zones = {a.zone: "stockout"}
    s = d.allocate(image="gpu:v101")
    assert s.vm_id == a.id
    assert b.cache.has_image("gpu:v101", d.core.catalog)  # filled while idle: started beside a (hedge_worth)
    d.advance(d.create_s)  # the start's operation fails
    assert a.state is V.STANDBY  # stopped still, its disk kept
    assert s.state is S.PROVISIONING and b.state is V.STARTING
    # b is on its way already, so the session waits on a new VM (it joins the pool when up) and b
    # serves the session as soon as it is up.
    assert len(d.commands(Launch)) == launches + 1 and s.vm_id != b.id
    d.run_until(lambda: s.state is S.RUNNING, 900)
    assert s.vm_id == b.id
    assert d.core.failed_tries().get(s.id) is None  # a stockout does not count against the session


def test_a_start_that_stocks_out_with_no_other_standby_vm_falls_back_to_a_new_vm_in_another_zone():
    d = standby_pool()
    (vm,) = d.make_standby(1)
    d.fail_zones = {vm.zone: "stockout"}
    s = d.allocate(image="gpu:v160")
    assert s.vm_id == vm.id
    d.advance(d.create_s)
    assert vm.state is V.STANDBY and s.state is S.PROVISIONING
    new = d.core.vms[s.vm_id]
    assert new.id != vm.id and new.zone != vm.zone and new.state in (V.CREATING, V.BOOTING)
    d.run_until(lambda: s.state is S.RUNNING, 1800)
    assert s.start is StartKind.COLD


def test_a_start_that_fails_otherwise_deletes_the_vm_and_counts_against_the_session():
    d = standby_pool()
    (vm,) = d.make_standby(1)
    d.raising = {Start}
    s = d.allocate(image="gpu:v160")
    d.advance(d.create_s)
    assert vm.state is V.DELETING and d.core.failed_tries()[s.id] == 1
    assert s.state is S.PROVISIONING and d.core.vms[s.vm_id].state is V.CREATING


def test_a_failed_stop_deletes_the_vm():
    d = standby_pool()
    d.raising = {Stop}
    s = d.allocate(image="gpu:v160")
    d.run_until(lambda: s.state is S.RUNNING, 1800)
    d.stop(s)
    vm_id = s.vm_id
    d.run_until(lambda: d.vms[vm_id].state in (V.DELETING, V.DELETED), 6 * 3600)
    assert d.commands(Stop) and "stop failed" in d.vms[vm_id].history[-1].reason + d.vms[vm_id].history[-2].reason


def test_standby_beyond_the_target_is_deleted_when_the_tier_is_turned_off():
    d = standby_pool()
    vms = d.make_standby(2)
    d.set_policy(standby=False)
    d.advance(2 * d.tick_s)
    assert all(vm.state in (V.DELETING, V.DELETED) for vm in vms)


def test_the_reconciler_adopts_stopped_vms_and_loses_vanished_ones():
    d = standby_pool()
    a, b = d.make_standby(2)
    plan = reconcile(d.core.vms.values(), [CloudVm(a.id, a.zone, "terminated")], d.now)
    assert a.id in plan.adopted and b.id in plan.lost and a.id not in plan.terminated


def test_a_restarted_core_starts_again_what_was_starting_and_stops_what_was_stopping():
    d = standby_pool()
    a, b = d.make_standby(2)
    s = d.allocate(image="gpu:v160")
    starting = d.core.vms[s.vm_id]
    fresh = Driver(make_core(min_vms=0, headroom_fraction=0.0, standby=True), now=d.now)
    other = b if starting.id == a.id else a  # started beside it (hedge_worth): the pool's when up
    step = fresh.send(Restored(d.now, (s,), tuple(d.core.vms.values())))
    assert sorted((type(c).__name__, c.vm_id, c.session_id) for c in step.commands) == sorted(
        [("Start", starting.id, s.id), ("Start", other.id, "")])
    fresh.run_until(lambda: fresh.core.sessions[s.id].state is S.RUNNING, 600)


def test_choose_standby_prefers_the_fewest_missing_bytes_in_a_usable_zone():
    d = standby_pool()
    a, b = (vm_copy(vm) for vm in d.make_standby(2))  # records of the test's own, to change
    catalog = d.core.catalog
    b.cache.add("gpu:v101", catalog, d.now)
    assert choose_standby("gpu:v101", [a, b], catalog, lambda vm: True) is b
    assert choose_standby("gpu:v101", [a, b], catalog, lambda vm: vm is not b) is a
    assert choose_standby("gpu:v101", [a, b], catalog, lambda vm: False) is None


def test_dispersion_is_one_for_steady_arrivals_and_large_for_bursts():
    steady, bursty = Dispersion(), Dispersion()
    for minute in range(600):
        steady.add(minute * 60.0 + 1.0)  # one a minute
        if minute % 30 == 0:
            for _ in range(30):  # thirty at once every half hour: the same mean
                bursty.add(minute * 60.0 + 1.0)
    assert steady.index(36_000.0) == 1.0
    assert bursty.index(36_000.0) > 10
    assert warm_for(10, 0, 0.02, dispersion=bursty.index(36_000.0)) > warm_for(10, 0, 0.02)


def test_standby_target_holds_the_days_peak_and_the_forecasts_burst_cover():
    snap = PoolSnapshot(warm=2, starting=0, assigned=3, recycling=0, queued=0, min_vms=0, max_vms=50,
                        headroom_fraction=0.0, autoscaler="predictive", forecast_warm=2, standby=True,
                        forecast_cover=9)
    assert standby_target(snap, day_peak=20) == 15  # 20 at the peak, 5 wanted now
    assert standby_target(snap, day_peak=5) == 7  # cover 9 minus 2 warm
    assert standby_target(snap._replace(standby=False), day_peak=20) == 0


def test_a_burst_that_takes_every_warm_vm_redoes_the_forecast_at_once():
    last = 1_000.0
    soon = last + FORECAST_REFRESH_S / 4
    assert not forecast_due(soon, last, forecast_warm=3, ready=1)  # warm VMs left: wait for the minute
    assert forecast_due(soon, last, forecast_warm=3, ready=0)  # the burst took them all
    assert not forecast_due(soon, last, forecast_warm=0, ready=0)  # nothing was kept warm: no burst
    assert not forecast_due(last, last, forecast_warm=3, ready=0)  # once per instant
    assert forecast_due(last + FORECAST_REFRESH_S, last, forecast_warm=3, ready=5)


def test_every_vm_state_the_core_has_is_in_the_api():
    for state in V:
        assert convert.vm_state_from_pb(convert.vm_state_to_pb(state)) is state
