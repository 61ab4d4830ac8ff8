"""Group commit: durable writes from concurrent requests, many to one transaction.

A writer thread takes the writes queued while its last transaction was committing (up to
`max_batch`, after waiting at most `max_wait_s` for more), runs them in one transaction and only
then answers each caller, so one disk sync (or one PostgreSQL commit) acknowledges them all and
none waits on the event loop. If the batch fails, its writes are run again one transaction each,
so every caller gets its own outcome: one bad write fails alone. A write must therefore be safe to
run again after a rollback (the store's writes are: upserts and guarded updates).

A batch that fails for a reason that is no write's fault (`transient`: the database was lost) is
run again whole, after a wait, until `ride_out_s` has passed; then each of its writes fails with
that error. If the connection was lost during the commit itself, the batch may have committed:
run again, each write then finds its own effect (an upsert writes the same; a guarded update
finds its guard moved and reports that it did not apply, which its caller treats as a change
made by someone else, the safe reading).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

DEFAULT_MAX_BATCH = 256
DEFAULT_MAX_WAIT_S = 0.0  # the queue fills while the previous batch commits; no extra wait


class WriterClosed(RuntimeError):
    pass


@dataclass
class _Write:
    run: Callable[[Any], Any]  # given the batch's cursor
    future: Future | asyncio.Future
    loop: asyncio.AbstractEventLoop | None = None  # an asyncio future's, answered on it

    def start(self) -> bool:
        """False if its caller gave up before it ran: it is not run."""
        if self.loop is None:
            return self.future.set_running_or_notify_cancel()
        return not self.future.cancelled()  # a racy read, and harmless: a write may run unawaited


class GroupCommit:
    """One writer thread over `transaction` (a cursor in one transaction: committed on exit,
    rolled back on an error), started by `start` or the first write."""

    def __init__(self, transaction: Callable[[], AbstractContextManager[Any]], *, max_batch: int = DEFAULT_MAX_BATCH,
                 max_wait_s: float = DEFAULT_MAX_WAIT_S, name: str = "group-commit",
                 transient: Callable[[BaseException], bool] = lambda e: False, ride_out_s: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep):
        """`sleep` (wall time on purpose: a database away is back in real seconds) waits between the
        tries of a batch: in the writer thread, whose every write
        would fail the same way meanwhile."""
        self._transaction = transaction
        self._transient, self._ride_out_s, self._sleep = transient, ride_out_s, sleep
        self.max_batch, self.max_wait_s, self._name = max_batch, max_wait_s, name
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.batches = self.writes = 0  # transactions committed, and the writes they carried

    def start(self) -> None:
        """Starts the writer thread now rather than with the first write (a server starts it with
        itself). Idempotent."""
        with self._lock:
            self._start()

    def submit(self, run: Callable[[Any], Any]) -> Future:
        """Queues `run(cursor)`; the future holds its result once its transaction is durable."""
        future: Future = Future()
        self._put(_Write(run, future))
        return future

    def submit_async(self, run: Callable[[Any], Any]) -> asyncio.Future:
        """The same for a caller on an event loop: the batch's answers come back to the loop in
        one hand-off, not one per write."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._put(_Write(run, future, loop))
        return future

    def _put(self, write: _Write) -> None:
        with self._lock:
            self._start()
            self._queue.put(write)

    def _start(self) -> None:
        if self._closed:
            raise WriterClosed("the store is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Commits what is queued, then stops the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            batch, stop = self._take()
            if batch:
                self._commit(batch)
            if stop:
                return

    def _take(self) -> tuple[list[_Write], bool]:
        """The next batch: a first write (waiting for it), then what else is queued, waiting up
        to max_wait_s for more while the batch has room. True if the writer is to stop after it."""
        first = self._queue.get()
        if first is None:
            return [], True
        batch = [first]
        deadline = time.monotonic() + self.max_wait_s  # wall time on purpose: batching waits on the disk, not the model
        while len(batch) < self.max_batch:
            try:
                remaining = deadline - time.monotonic()
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _commit(self, batch: list[_Write]) -> None:
        live = [w for w in batch if w.start()]
        waits = backoff(self._ride_out_s)
        while True:
            try:
                with self._transaction() as cur:
                    results = [w.run(cur) for w in live]
                break
            except BaseException as e:  # noqa: BLE001 - each write is retried alone below
                wait = next(waits, None) if self._transient(e) else None
                if wait is not None:
                    self._sleep(wait)
                    continue
                if len(live) == 1 or self._transient(e):
                    _answer([(w, None, e) for w in live])
                else:
                    self._one_by_one(live)
                return
        self.batches += 1
        self.writes += len(live)
        _answer([(w, result, None) for w, result in zip(live, results)])

    def _one_by_one(self, batch: list[_Write]) -> None:
        outcomes = []
        for w in batch:
            try:
                with self._transaction() as cur:
                    result = w.run(cur)
            except BaseException as e:  # noqa: BLE001 - the caller's to handle
                outcomes.append((w, None, e))
            else:
                self.batches += 1
                self.writes += 1
                outcomes.append((w, result, None))
        _answer(outcomes)


FIRST_WAIT_S, MAX_WAIT_S = 0.05, 0.5


def backoff(bound_s: float):
    """The waits between tries of a batch, doubling to MAX_WAIT_S, while they add up to less than
    `bound_s`."""
    spent, wait = 0.0, FIRST_WAIT_S
    while spent + wait < bound_s:
        yield wait
        spent += wait
        wait = min(MAX_WAIT_S, wait * 2)


def _answer(outcomes: list[tuple[_Write, Any, BaseException | None]]) -> None:
    """Sets each write's future: a thread's at once, a loop's all in one call on that loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for w, result, error in outcomes:
        if w.loop is not None:
            by_loop.setdefault(w.loop, []).append((w.future, result, error))
        elif error is not None:
            w.future.set_exception(error)
        else:
            w.future.set_result(result)
    for loop, answers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, answers)
        except RuntimeError:  # its loop is closed: nobody is waiting any more
            pass


def _settle(answers: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    for future, result, error in answers:
        if future.done():  # its caller was cancelled meanwhile
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
