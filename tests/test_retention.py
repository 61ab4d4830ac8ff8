"""Ended sessions leave the cluster's memory after sessions.retention_s; reads of them go to the
store, and a restart loads only the live sessions and the recently ended ones."""

from __future__ import annotations

from core_driver import make_core
from live_records import follow

from provisioner.common.clock import ManualClock
from provisioner.cloud.sim import SimCloud
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.model.records import SessionSpec
from provisioner.store import SqliteStore

RETENTION_S = 600.0


def runtime(store: SqliteStore, clock: ManualClock) -> ClusterRuntime:
    core = make_core(min_vms=2, sessions={"retention_s": RETENTION_S})
    return ClusterRuntime(core, SimCloud(core.config.sim, clock, tracer=None, record_calls=False), clock, store)


async def advance(rt: ClusterRuntime, clock: ManualClock, seconds: float) -> None:
    """Model time goes on in steps, each after the writes before it are durable (the cloud work
    waits for them, and the writer runs in wall time)."""
    for _ in range(int(seconds // 10)):
        await rt.writer.durable()
        await clock.advance(10)
    await rt.writer.durable()


def spec(request_id: str, user: str = "ada") -> SessionSpec:
    return SessionSpec(request_id, user, "gpu-p100", "gpu:latest")


async def test_an_ended_session_leaves_memory_and_is_still_read_from_the_store(tmp_path):
    store, clock = SqliteStore(tmp_path / "cluster.db"), ManualClock(start=0.0)
    rt = runtime(store, clock)
    await rt.start()
    try:
        await advance(rt, clock, 300)
        live_now = follow(rt)
        old, live = live_now(rt.allocate(spec("old"))), live_now(rt.allocate(spec("live")))
        await advance(rt, clock, 300)
        rt.stop(old.id, "done")
        await advance(rt, clock, 60)
        assert rt.core.sessions[old.id].terminal
        await advance(rt, clock, RETENTION_S)
        await rt.writer.durable()
        assert old.id not in rt.core.sessions and live.id in rt.core.sessions
        assert rt.reads.get(old.id).to_dict() == old.to_dict() == rt.reads.get_by_request(old.spec.key).to_dict()
        assert rt.allocate(spec("old")).id == old.id  # a retry long after: the same session, no new one
        assert rt.reads.knows_request(old.spec.key) and rt.stop(old.id, "again").state == old.state
        assert {s.id for s in rt.reads.sessions("ada")} == {old.id, live.id}
        # Every user's (an operator's list): the older ones from the store too; every user's ended
        # after a time (the budget enforcer's recent ends): what memory holds
        assert {s.id for s in rt.reads.sessions()} == {old.id, live.id}
        assert {s.id for s in rt.reads.sessions("", ended_after=0.0)} == {live.id}
        # A quota check asks for the sessions that can meter this week: the live ones, and those
        # that ended since the week began, from memory or from the store.
        ended = rt.reads.get(old.id).ended_at
        assert {s.id for s in rt.reads.sessions("ada", ended_after=ended)} == {old.id, live.id}
        assert {s.id for s in rt.reads.sessions("ada", ended_after=ended + 1)} == {live.id}
        recent = rt.allocate(spec("recent"))
        await advance(rt, clock, 60)
        rt.stop(recent.id, "done")
        await advance(rt, clock, 60)
        assert recent.id in rt.core.sessions and rt.core.sessions[recent.id].terminal
        assert {s.id for s in rt.reads.sessions("ada", ended_after=ended + 1)} == {live.id, recent.id}
        # Only what has left memory is read from the store: a window within the retention period
        # is answered from memory alone.
        reads = []
        load = store.sessions.load_user_ended_sessions
        store.sessions.load_user_ended_sessions = lambda *a: reads.append(a) or load(*a)
        assert {s.id for s in rt.reads.sessions("ada", ended_after=clock.now() - RETENTION_S / 2)} == {live.id, recent.id}
        assert reads == []
        assert {s.id for s in rt.reads.sessions("ada", ended_after=ended)} == {old.id, live.id, recent.id}
        assert len(reads) == 1 and reads[0][3] == clock.now() - RETENTION_S
    finally:
        await rt.close()
        store.close()


async def test_a_restart_loads_the_live_and_the_recently_ended_sessions_only(tmp_path):
    store, clock = SqliteStore(tmp_path / "cluster.db"), ManualClock(start=0.0)
    rt = runtime(store, clock)
    await rt.start()
    await advance(rt, clock, 300)
    made = {name: rt.allocate(spec(name)) for name in ("long-ago", "lately", "live")}
    await advance(rt, clock, 300)
    rt.stop(made["long-ago"].id, "done")
    await advance(rt, clock, RETENTION_S)
    rt.stop(made["lately"].id, "done")
    await advance(rt, clock, 60)
    await rt.close()  # the long-ago session is out of memory by now; the restart must not load it
    store.close()

    store = SqliteStore(tmp_path / "cluster.db")
    again = runtime(store, clock)
    await again.start()
    try:
        assert set(again.core.sessions) == {made["lately"].id, made["live"].id}
        assert again.reads.get(made["long-ago"].id).terminal
    finally:
        await again.close()
        store.close()
