"""The cluster runtime's serving path: writes group-committed in the core's order, nothing acted
on before its transaction commits, and capacity counts kept as VMs change."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest

from core_driver import make_core

from provisioner.api import convert
from provisioner.common.clock import ManualClock
from provisioner.cloud.sim import SimCloud
from provisioner.cluster import runtime as runtime_module
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.model.records import SessionSpec
from provisioner.store import SqliteStore


def runtime(store=None, **pool) -> tuple[ClusterRuntime, SimCloud, ManualClock]:
    core = make_core(**pool)
    clock = ManualClock(start=0.0)
    cloud = SimCloud(core.config.sim, clock, tracer=None, record_calls=False)
    return ClusterRuntime(core, cloud, clock, store), cloud, clock


def walked(rt: ClusterRuntime) -> tuple[dict, dict]:
    """The capacity counts as a walk over every VM finds them."""
    by_image, unhealthy = {}, {}
    for pool in rt.reads.pools():
        name = pool.config.name
        for vm in rt.core.assignable(pool):
            for image in vm.cache.images(rt.reads.catalog):
                by_image.setdefault(name, {}).setdefault(image, 0)
                by_image[name][image] += 1
        unhealthy[name] = sum(not vm.healthy for vm in pool.vms.values())
    return by_image, unhealthy


def counted(rt: ClusterRuntime) -> tuple[dict, dict]:
    return ({p: c for p, c in rt.capacity.warm_by_image.items() if c},
            {p.config.name: rt.capacity.unhealthy.get(p.config.name, 0) for p in rt.reads.pools()})


async def test_capacity_counts_follow_every_change_as_a_full_walk_finds_them():
    rt, cloud, clock = runtime(min_vms=6)
    await rt.start()
    try:
        await clock.advance(600)
        assert counted(rt) == walked(rt)
        sessions = [rt.allocate(SessionSpec(f"r{i}", "ada", "gpu-p100", "gpu:latest")) for i in range(3)]
        assert counted(rt) == walked(rt)
        await clock.advance(600)
        for s in sessions[:2]:
            rt.stop(s.id, "done")
        await clock.advance(600)
        assert walked(rt)[0] and counted(rt) == walked(rt)  # recycled VMs hold the image
        warm = next(vm for vm in rt.core.vms.values() if vm.state.value == "warm")
        cloud.mark_unhealthy(warm.id, "xid 79")
        await rt._check(rt._checkable())
        assert counted(rt) == walked(rt) and sum(walked(rt)[1].values()) == 1
        await clock.advance(600)
        assert counted(rt) == walked(rt)
    finally:
        await rt.close()


async def test_a_steps_watchers_and_commands_wait_for_its_transaction(tmp_path):
    store = SqliteStore(tmp_path / "cluster.db")
    rt, cloud, clock = runtime(store, min_vms=0, headroom_fraction=0.0)
    await rt.start()
    try:
        gate = threading.Event()
        store.writer.submit(lambda _cur: gate.wait(10))  # the writer is busy
        first = rt.allocate(SessionSpec("r1", "ada", "gpu-p100", "gpu:latest"))
        second = rt.allocate(SessionSpec("r2", "bob", "gpu-p100", "gpu:latest"))
        durable = asyncio.create_task(rt.writer.durable(second.id))
        await asyncio.sleep(0.05)
        assert not durable.done() and not cloud.vms  # no launch before the session is written
        assert store.sessions.load_sessions(rt.reads.name) == []
        gate.set()
        await durable
        assert {s.id for s in store.sessions.load_sessions(rt.reads.name)} == {first.id, second.id}
        await clock.advance(1)
        assert len(cloud.vms) == 2  # each cold start launched once written
    finally:
        await rt.close()
        store.close()


async def test_a_read_of_some_sessions_waits_for_their_writes_only(tmp_path):
    store = SqliteStore(tmp_path / "cluster.db")
    rt, cloud, clock = runtime(store, min_vms=0, headroom_fraction=0.0)
    await rt.start()
    try:
        ada = rt.allocate(SessionSpec("r1", "ada", "gpu-p100", "gpu:latest"))
        await rt.writer.durable()
        gate = threading.Event()
        store.writer.submit(lambda _cur: gate.wait(10))  # the writer is busy
        bob = rt.allocate(SessionSpec("r2", "bob", "gpu-p100", "gpu:latest"))  # queued behind it
        await asyncio.wait_for(rt.writer.durable(ada.id), 1)  # ada's is written: a read of it goes on
        for waiting in (rt.writer.durable(bob.id), rt.writer.durable(ada.id, bob.id), rt.writer.durable()):
            task = asyncio.create_task(waiting)
            await asyncio.sleep(0.05)
            assert not task.done()
            task.cancel()
        gate.set()
        await asyncio.wait_for(rt.writer.durable(bob.id), 5)
        assert {s.id for s in store.sessions.load_sessions(rt.reads.name)} == {ada.id, bob.id}
    finally:
        await rt.close()
        store.close()


async def test_the_health_pass_lets_other_calls_in_between_its_chunks(monkeypatch):
    rt, cloud, clock = runtime(min_vms=12)
    await rt.start()
    try:
        await clock.advance(600)
        checked = [vm for vm in rt.core.vms.values() if vm.state.value == "warm"]
        assert len(checked) >= 12
        monkeypatch.setattr(runtime_module, "HEALTH_CHUNK", 5)
        steps, seen = [], []
        handle = rt.handle
        monkeypatch.setattr(rt, "handle", lambda *events: steps.append(len(events)) or handle(*events))

        async def another_call():  # what a request sees of the pass while it runs
            while True:
                seen.append(sum(steps))
                await asyncio.sleep(0)

        other = asyncio.create_task(another_call())
        await asyncio.sleep(0)
        await rt._check(rt._checkable())
        other.cancel()
        assert max(steps) == 5 and len(steps) == -(-len(checked) // 5) and sum(steps) == len(checked)
        assert any(0 < n < len(checked) for n in seen)  # it ran mid-pass
    finally:
        await rt.close()


async def test_a_brief_list_leaves_out_histories_and_notices_and_keeps_what_metering_reads():
    rt, cloud, clock = runtime(min_vms=1)
    await rt.start()
    try:
        await clock.advance(600)
        s = rt.allocate(SessionSpec("r1", "ada", "gpu-p100", "gpu:latest"))
        await clock.advance(60)
        rt.stop(s.id, "done")
        await clock.advance(60)
        ended = rt.reads.get(s.id)
        full, brief = convert.session_to_pb(ended, clock.now()), convert.session_to_pb(ended, clock.now(), brief=True)
        assert full.history and not brief.history and not brief.notices
        for name in ("id", "state", "cluster", "pool", "spec", "create_time", "ready_time", "end_time"):
            assert getattr(brief, name) == getattr(full, name), name
        assert brief.ByteSize() < full.ByteSize()
    finally:
        await rt.close()


class _Call:
    """A servicer context with no deadline."""

    def time_remaining(self):
        return None


@pytest.mark.parametrize("parts", ["filtered", "converted"])
async def test_a_long_list_is_filtered_and_converted_a_part_at_a_time_and_answered_whole(monkeypatch, parts):
    from provisioner.cluster import service
    from provisioner.v1 import cluster_service_pb2 as cluster_pb

    rt, cloud, clock = runtime(min_vms=12)
    await rt.start()
    try:
        await clock.advance(600)
        made = [rt.allocate(SessionSpec(f"r{i}", f"u{i % 3}", "gpu-p100", "gpu:latest")) for i in range(12)]
        await clock.advance(60)
        monkeypatch.setattr(service, "FILTER_AT_ONCE" if parts == "filtered" else "CONVERT_AT_ONCE", 5)
        turns = 0

        async def count_turns():
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        before = turns
        servicer = service.ClusterServicer(rt, clock)
        resp = await servicer.List(cluster_pb.ListRequest(brief=True, page_size=100), _Call())
        during = turns - before
        counter.cancel()
        expected = service.filter_sessions(rt.reads.sessions(""), "", [])
        assert [s.id for s in resp.sessions] == [s.id for s in expected]
        assert {s.id for s in made} <= {s.id for s in resp.sessions}
        assert during >= 2  # the loop turned between the parts (12 sessions, 5 at a time)
    finally:
        await rt.close()


async def test_health_is_read_once_a_period_for_each_vm_spread_evenly_over_it():
    rt, cloud, clock = runtime(min_vms=12)
    await rt.start()
    try:
        await clock.advance(600)
        warm = {vm.id for vm in rt.core.vms.values() if vm.state.value == "warm"}
        assert len(warm) >= 12
        reads: list[tuple[float, str]] = []
        health = rt.backend.health

        async def recording(vm_id, zone):
            reads.append((clock.now(), vm_id))
            return await health(vm_id, zone)

        rt.backend.health = recording
        start = clock.now()
        await clock.advance(runtime_module.HEALTH_CHECK_S + 2 * runtime_module.HEALTH_SLICE_S)
        in_a_period = [vm for t, vm in reads if t < start + runtime_module.HEALTH_CHECK_S]
        assert set(in_a_period) >= warm  # every warm VM read once a period, and only once
        assert all(n == 1 for n in collections.Counter(in_a_period).values())
        per_instant: dict[float, int] = {}
        for t, _ in reads:
            per_instant[t] = per_instant.get(t, 0) + 1
        # 12 or so VMs over 60 slices: never more than one slice's share at once.
        share = -(-len(warm) * runtime_module.HEALTH_SLICE_S // runtime_module.HEALTH_CHECK_S)
        assert max(per_instant.values()) <= share
        assert len(per_instant) >= len(warm)
    finally:
        await rt.close()


async def test_a_listing_s_later_pages_follow_its_first_page_s_order_without_filtering_again(monkeypatch):
    from provisioner.cluster import service
    from provisioner.v1 import cluster_service_pb2 as cluster_pb

    rt, cloud, clock = runtime(min_vms=14)
    await rt.start()
    try:
        await clock.advance(600)
        for i in range(10):
            rt.allocate(SessionSpec(f"r{i}", "ada", "gpu-p100", "gpu:latest"))
            await clock.advance(1)
        servicer = service.ClusterServicer(rt, clock)
        filtered = []
        sessions = rt.reads.sessions
        monkeypatch.setattr(rt.reads, "sessions", lambda *args: filtered.append(args) or sessions(*args))
        first = await servicer.List(cluster_pb.ListRequest(page_size=4), _Call())
        rt.allocate(SessionSpec("newer", "ada", "gpu-p100", "gpu:latest"))  # first in the order, now
        await clock.advance(1)
        second = await servicer.List(cluster_pb.ListRequest(page_size=4, page_token=first.next_page_token), _Call())
        third = await servicer.List(cluster_pb.ListRequest(page_size=4, page_token=second.next_page_token), _Call())
        listed = [s.spec.request_id for r in (first, second, third) for s in r.sessions]
        assert listed == [f"r{i}" for i in reversed(range(10))]  # newest first, none twice, none left out
        assert third.next_page_token == "" and len(filtered) == 1
        again = await servicer.List(cluster_pb.ListRequest(page_size=4), _Call())  # a new listing sees it
        assert again.sessions[0].spec.request_id == "newer" and len(filtered) == 2
    finally:
        await rt.close()


async def test_a_watcher_of_a_queued_session_is_told_of_its_moves_and_a_resume_of_where_it_is(tmp_path):
    """A queued session's place moves without a new revision (it is not written): its watcher
    still hears of it, a report at most every `move_report_s` with the latest place (moves in between
    are not reported one by one), and a watch resumed after the revision it saw starts with where
    the session stands now. A change of the session is reported at once."""
    store = SqliteStore(tmp_path / "cluster.db")
    rt, cloud, clock = runtime(store, min_vms=0, max_vms=1, headroom_fraction=0.0)
    rt.watchers.move_report_s = 0.3
    await rt.start()
    try:
        rt.allocate(SessionSpec("r0", "holder", "gpu-p100", "gpu:latest"))
        ahead = []
        for i in range(4):
            ahead.append(rt.allocate(SessionSpec(f"r{i + 1}", f"u{i}", "gpu-p100", "gpu:latest")))
            await clock.advance(1)
        me = rt.allocate(SessionSpec("r9", "me", "gpu-p100", "gpu:latest"))
        await rt.writer.durable()
        watch = rt.watchers.watch(me.id)

        async def report(within: float = 5) -> tuple[int, int, float]:
            started = asyncio.get_running_loop().time()
            s = await asyncio.wait_for(anext(watch), within)
            return s.revision, s.queue_position, asyncio.get_running_loop().time() - started

        revision, place, _ = await report()
        assert place == 5
        rt.stop(ahead[0].id, "gave up")
        assert (await report())[:2] == (revision, 4)  # the first move: at once
        rt.stop(ahead[1].id, "gave up")
        rt.stop(ahead[2].id, "gave up")
        moved = await report()
        assert moved[:2] == (revision, 2) and moved[2] >= 0.2  # both moves in one report, after the interval
        rt.stop(me.id, "changed my mind")
        stopped = await report(within=0.2)  # a change: at once
        assert stopped[0] > revision and stopped[1] == 0
        await watch.aclose()
    finally:
        await rt.close()
        store.close()


async def test_a_watch_resumed_at_the_revision_seen_starts_with_where_the_session_stands_now(tmp_path):
    store = SqliteStore(tmp_path / "cluster.db")
    rt, cloud, clock = runtime(store, min_vms=0, max_vms=1, headroom_fraction=0.0)
    await rt.start()
    try:
        rt.allocate(SessionSpec("r0", "holder", "gpu-p100", "gpu:latest"))
        ahead = rt.allocate(SessionSpec("r1", "u1", "gpu-p100", "gpu:latest"))
        await clock.advance(1)
        me = rt.allocate(SessionSpec("r9", "me", "gpu-p100", "gpu:latest"))
        await rt.writer.durable()
        seen = me.revision
        assert me.queue_position == 2
        rt.stop(ahead.id, "gave up")
        resumed = rt.watchers.watch(me.id, after_revision=seen)
        s = await asyncio.wait_for(anext(resumed), 5)
        assert (s.revision, s.queue_position) == (seen, 1)
        await resumed.aclose()
    finally:
        await rt.close()
        store.close()
