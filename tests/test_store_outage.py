"""A PostgreSQL server away for a few seconds (shut down and started again, as a restart or a
failover does): the store's reads and grouped writes wait for it and succeed, a cluster's lease
is kept through it, and what fails after the ride-out fails UNAVAILABLE, naming no address."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2

from provisioner.api.status import to_status
from provisioner.cluster import leader
from provisioner.store import PostgresStore
from provisioner.store import outage
from provisioner.store.outage import StoreUnavailable

AWAY_S = 2.0


@pytest.fixture(scope="module")
def own_postgres():
    """A server of this module's own: it is shut down and started again."""
    from pg import serving

    yield from serving()


def away_for(server, seconds: float) -> threading.Thread:
    """Shuts the server down now and starts it again `seconds` later, in a thread."""
    server.pause()

    def back() -> None:
        time.sleep(seconds)
        server.resume()
    thread = threading.Thread(target=back)
    thread.start()
    return thread


@pytest.mark.timeout(60)
async def test_reads_and_grouped_writes_wait_for_the_database_to_come_back(own_postgres):
    store = PostgresStore(own_postgres.new_database())
    try:
        await store.commit(store.operator.save_quota_override, "ada", {"max_active": 2}, 1.0)
        assert (await store.read(store.operator.quota_override, "ada"))[0] == {"max_active": 2}
        back = away_for(own_postgres, AWAY_S)
        started = time.monotonic()
        written, read = await asyncio.gather(
            store.commit(store.operator.save_quota_override, "bob", {"max_active": 3}, 2.0),
            store.read(store.operator.quota_override, "ada"))
        waited = time.monotonic() - started
        back.join()
        assert read[0] == {"max_active": 2} and written is None
        assert (await store.read(store.operator.quota_override, "bob"))[0] == {"max_active": 3}
        print(f"the read and the write were answered {waited:.2f} s after the server went away")
        assert waited >= AWAY_S * 0.9  # they did wait for it
    finally:
        store.close()


@pytest.mark.timeout(60)
async def test_a_database_away_longer_than_the_ride_out_is_unavailable_without_its_address(own_postgres, monkeypatch):
    monkeypatch.setattr(outage, "RIDE_OUT_S", 1.0)
    url = own_postgres.new_database()
    store = PostgresStore(url)
    try:
        await store.commit(store.operator.save_quota_override, "ada", {"max_active": 2}, 1.0)
        back = away_for(own_postgres, 4.0)
        try:
            for attempt in (store.read(store.operator.quota_override, "ada"),
                            store.commit(store.operator.save_quota_override, "bob", {"max_active": 3}, 2.0)):
                with pytest.raises(StoreUnavailable) as err:
                    await attempt
                status = to_status(err.value)
                assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
                text = str(err.value) + status.message
                for secret in (url, str(own_postgres.port), "127.0.0.1", "provisioner@", url.rsplit("/", 1)[1]):
                    assert secret not in text
                assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
                assert str(own_postgres.port) in err.value.detail  # the log is told where
        finally:
            back.join()
        assert (await store.read(store.operator.quota_override, "ada"))[0] == {"max_active": 2}  # and it reconnects
    finally:
        store.close()


@pytest.mark.timeout(60)
async def test_the_lease_is_kept_through_a_restart_within_its_term(own_postgres):
    url = own_postgres.new_database()
    lease = leader.PostgresLease(url, "c1")
    other = leader.PostgresLease(url, "c1")
    assert lease.try_acquire()
    watching = asyncio.create_task(leader.watch(lease, "c1"))
    try:
        await asyncio.sleep(1.5)
        back = await asyncio.to_thread(away_for, own_postgres, AWAY_S)
        await asyncio.to_thread(back.join)
        await asyncio.sleep(leader.POLL_S + 1.0)
        assert not watching.done(), "the leader gave up its lease over a restart shorter than its term"
        assert not other.try_acquire()  # it holds the lock again: a standby cannot take it
    finally:
        watching.cancel()
        lease.release()
        other.release()


@pytest.mark.timeout(60)
async def test_a_lease_taken_by_another_replica_meanwhile_ends_with_the_term(own_postgres, monkeypatch):
    monkeypatch.setattr(leader, "TERM_S", 3.0)
    url = own_postgres.new_database()
    lease, standby = leader.PostgresLease(url, "c1"), leader.PostgresLease(url, "c1")
    assert lease.try_acquire()
    watching = asyncio.create_task(leader.watch(lease, "c1"))
    try:
        await asyncio.sleep(1.2)
        confirmed_by = time.monotonic()  # the last check confirmed the lease before this
        # The restart and the standby taking the freed lock, with the event loop held meanwhile:
        # the leader's watch has no chance to take the lock back first.
        own_postgres.pause()
        own_postgres.resume()
        assert standby.try_acquire()
        await asyncio.wait_for(watching, leader.TERM_S + 2)
        ended = time.monotonic()
        # Not before the term ran out, and not later than the watch may be late.
        assert ended - (confirmed_by - leader.POLL_S) >= leader.TERM_S
        assert ended - confirmed_by <= leader.TERM_S + leader.WATCH_LATE_S
    finally:
        watching.cancel()
        lease.release()
        standby.release()
