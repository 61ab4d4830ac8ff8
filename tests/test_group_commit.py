"""Group commit, against SQLite and a real PostgreSQL server: concurrent writes share a
transaction, each caller is answered after its transaction is durable, one bad write fails alone,
and what was acknowledged survives a SIGKILL of the writing process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from provisioner.store.group_commit import WriterClosed
from provisioner.front.records import FrontRecords
from provisioner.store import open_store

CLUSTER = "c"


@pytest.fixture
def store(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "unused.db")
    yield s
    s.close()


def _hold(store) -> threading.Event:
    """Keeps the writer busy in a transaction until the event is set: what is submitted
    meanwhile queues, as it does behind a commit in progress."""
    gate, holding = threading.Event(), threading.Event()

    def wait(_cur):
        holding.set()
        gate.wait(10)

    store.writer.submit(wait)
    assert holding.wait(10)
    return gate


async def _submitted(*coros) -> list[asyncio.Task]:
    """Tasks of `coros`, each run up to where it waits for its write."""
    tasks = [asyncio.create_task(c) for c in coros]
    await asyncio.sleep(0)
    return tasks


async def test_writes_queued_behind_a_commit_share_the_next_transaction(store_url, tmp_path):
    store = open_store(store_url, tmp_path / "unused.db")
    gate = _hold(store)
    tasks = await _submitted(*(store.commit(store.operator.save_operator_state, CLUSTER, f"p{i}", {"i": i}, 0.0)
                               for i in range(20)))
    assert not any(t.done() for t in tasks)  # none answered before its transaction commits
    gate.set()
    await asyncio.gather(*tasks)
    assert (store.writer.batches, store.writer.writes) == (2, 21)  # the held one, then all 20 at once
    store.close()
    again = open_store(store_url, tmp_path / "unused.db")
    assert again.operator.load_operator_state(CLUSTER) == {f"p{i}": {"i": i} for i in range(20)}
    again.close()


async def test_a_write_whose_caller_gave_up_before_it_ran_is_not_run(store):
    gate = _hold(store)
    kept, dropped = await _submitted(store.commit(store.operator.save_operator_state, CLUSTER, "kept", {"x": 1}, 0.0),
                                     store.commit(store.operator.save_operator_state, CLUSTER, "dropped", {"x": 2}, 0.0))
    dropped.cancel()
    await asyncio.sleep(0)
    gate.set()
    await kept
    assert dropped.cancelled()
    assert store.operator.load_operator_state(CLUSTER) == {"kept": {"x": 1}}


async def test_closing_commits_what_is_queued_then_takes_no_writes(store_url, tmp_path):
    """What a server's drain does: writes waiting behind a commit in progress are committed
    and answered before close returns."""
    store = open_store(store_url, tmp_path / "unused.db")
    store.writer.start()
    gate = _hold(store)
    tasks = await _submitted(*(store.commit(store.operator.save_operator_state, CLUSTER, f"p{i}", {"i": i}, 0.0)
                               for i in range(5)))
    closing = asyncio.create_task(asyncio.to_thread(store.close))
    await asyncio.sleep(0.05)
    assert not closing.done()  # it waits for the queue
    gate.set()
    await closing
    await asyncio.gather(*tasks)
    with pytest.raises(WriterClosed):
        store.writer.start()
    again = open_store(store_url, tmp_path / "unused.db")
    assert again.operator.load_operator_state(CLUSTER) == {f"p{i}": {"i": i} for i in range(5)}
    again.close()


async def test_a_write_that_fails_fails_alone(store):
    def half_then_fail():
        with store.transaction() as cur:  # the group's transaction
            cur.execute(store.sql("INSERT INTO operator_state VALUES (?, ?, ?, ?)"), (CLUSTER, "bad", "{}", 0.0))
        raise ValueError("refused")

    gate = _hold(store)
    good1, bad, good2 = await _submitted(store.commit(store.operator.save_operator_state, CLUSTER, "a", {"x": 1}, 0.0),
                                         store.commit(half_then_fail),
                                         store.commit(store.operator.save_operator_state, CLUSTER, "b", {"x": 2}, 0.0))
    gate.set()
    await good1
    await good2
    with pytest.raises(ValueError, match="refused"):
        await bad
    assert store.operator.load_operator_state(CLUSTER) == {"a": {"x": 1}, "b": {"x": 2}}  # nothing of the bad one


async def test_results_come_back_and_a_closed_store_takes_no_writes(store):
    assert await store.commit(FrontRecords(store).remember_request, "alice/r1", "s-1", CLUSTER, 1.0) == "s-1"
    assert await store.commit(FrontRecords(store).remember_request, "alice/r1", "s-2", CLUSTER, 2.0) == "s-1"
    store.close()
    with pytest.raises(WriterClosed):
        await store.commit(store.operator.save_operator_state, CLUSTER, "late", {"x": 1}, 0.0)


WRITER = textwrap.dedent("""
    import asyncio, sys
    from provisioner.store import open_store

    async def main(url):
        store = open_store(url, "unused.db")
        async def writer(k):
            for i in range(10**6):
                pool = f"w{k}-{i}"
                await store.commit(store.operator.save_operator_state, "c", pool, {"i": i}, 0.0)
                print(pool, flush=True)
        await asyncio.gather(*(writer(k) for k in range(8)))

    asyncio.run(main(sys.argv[1]))
""")


def test_acknowledged_writes_survive_a_sigkill(store_url, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, store_url], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    acked = []
    try:
        for line in proc.stdout:
            acked.append(line.strip())
            if len(acked) == 300:
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait()
    assert len(acked) == 300, "the writer died before it was killed"
    store = open_store(store_url, tmp_path / "unused.db")
    try:
        stored = store.operator.load_operator_state("c")
    finally:
        store.close()
    assert set(acked) <= set(stored)


class _Lost(Exception):
    """What the store raises for a lost connection (StoreUnavailable), here."""


def _flaky(fails: int):
    """A transaction that fails `fails` times as a lost connection would, then works (a list
    stands for the database; a failed transaction leaves nothing in it)."""
    from contextlib import contextmanager

    db, tries = [], []

    @contextmanager
    def transaction():
        tries.append(1)
        pending: list = []
        yield pending
        if len(tries) <= fails:
            raise _Lost("connection lost")
        db.extend(pending)
    return transaction, db, tries


def test_a_batch_lost_with_its_connection_is_run_again_whole():
    from provisioner.store.group_commit import GroupCommit

    transaction, db, tries = _flaky(fails=2)
    waits: list[float] = []
    writer = GroupCommit(transaction, transient=lambda e: isinstance(e, _Lost), ride_out_s=5.0, sleep=waits.append)
    futures = [writer.submit(lambda cur, i=i: cur.append(i) or i) for i in range(3)]
    assert [f.result(10) for f in futures] == [0, 1, 2]
    writer.close()
    assert db == [0, 1, 2]  # each once, whatever the batches were
    assert len(waits) == 2 and waits[0] < waits[1]  # two failures, waited out, backing off


def test_a_batch_lost_for_longer_than_the_ride_out_fails_each_write():
    from provisioner.store.group_commit import GroupCommit

    transaction, db, tries = _flaky(fails=1000)
    waits: list[float] = []
    writer = GroupCommit(transaction, transient=lambda e: isinstance(e, _Lost), ride_out_s=2.0, sleep=waits.append)
    future = writer.submit(lambda cur: cur.append("x"))
    with pytest.raises(_Lost):
        future.result(10)
    writer.close()
    assert db == [] and sum(waits) < 2.0 and len(tries) == len(waits) + 1
