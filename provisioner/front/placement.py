"""Placing a new session: one session per request key (a user's request id), however often the
client or the front retries and whichever cluster fails in the middle of a call.

The protocol's decisions are the state machine in front/attempts.py; this is its shell: it carries
each action out (the store, the cluster's gRPC services, the circuit breaker, the trace) and feeds
the outcome back. Every time it reads comes from its clock, which runs at wall speed: commit_by
is a deadline between processes, judged by the cluster's wall clock, and the caller's deadline
and the breaker's waits are network time.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

import grpc
from opentelemetry import trace

from provisioner.observability import telemetry
from provisioner.api.status import RemoteError
from provisioner.common.clock import Clock
from provisioner.model.errors import Unavailable
from provisioner.front import cluster_reports
from provisioner.front.attempts import (ATTEMPT_TIMEOUT_S, Allocated, Ask, Discard, Discarded, Done, FetchWinner,
                                        Fetched, Found, GiveUp, Invalid, Leave, NoReply, NotFound, PlacementRun,
                                        Record, Recorded, Refused, Remember, Remembered, ResolveRun, Send, Settle,
                                        Settled, Start, sticky_first)
from provisioner.front.clusters import ClusterClient
from provisioner.front.retry import ambiguous, call
from provisioner.front.router import Candidate
from provisioner.front.records import FrontRecords
from provisioner.model.records import cluster_of, request_key, split_request_key
from provisioner.store import Store
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

__all__ = ["ATTEMPT_TIMEOUT_S", "AdmissionChanged", "Placement"]

log = logging.getLogger(__name__)

RESOLVE_EVERY_S = 2.0
# Settled attempts are kept this long after their commit_by (to look into), then forgotten.
PRUNE_AFTER_S = 3600.0
# Answers that say the cluster did not make the session and will not.
REFUSALS = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION,
                      grpc.StatusCode.ABORTED})


class AdmissionChanged(Exception):
    """Another create of the user was recorded since this one's quota check: nothing was sent, and
    the create checks again."""


class Placement:
    def __init__(self, clients: dict[str, ClusterClient], store: Store, clock: Clock,
                 rng: random.Random | None = None):
        self.clients = clients
        self.store = store
        self.records = FrontRecords(store)  # the front's requests and attempts, over the store's engine
        self.clock = clock  # wall speed: see the module's docstring
        self.rng = rng or random.Random()  # backoff jitter
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}
        # What the resolver found: sessions adopted as a request's answer, duplicates discarded.
        self.adopted = self.discarded = 0
        # Answers given before their record (the claim's), by user: the record being written.
        self._recording: dict[str, asyncio.Task] = {}
        self._background: set[asyncio.Task] = set()  # writes after the call: those and claims waived
        # For metrics: attempts by (cluster, outcome), and placements by outcome.
        self.attempt_outcomes: Counter[tuple[str, str]] = Counter()
        self.outcomes: Counter[str] = Counter()

    @asynccontextmanager
    async def exclusive(self, request_id: str) -> AsyncIterator[None]:
        """One placement per request id at a time in this front: a retry waits for the first."""
        lock = self._locks.setdefault(request_id, asyncio.Lock())
        self._waiters[request_id] = self._waiters.get(request_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._waiters[request_id] -= 1
            if not self._waiters[request_id]:
                del self._waiters[request_id], self._locks[request_id]

    async def place(self, request: pb.SessionSpec, candidates: list[Candidate], deadline: float,
                    admitted: int | None, made_at: float | None, sticky: frozenset[str]) -> pb.Session:
        """Tries the candidates in order until one makes the session; `deadline` is the clock's time.
        `admitted`: the user's admission version the quota check read; the first attempt is recorded
        only if it is unchanged, else AdmissionChanged. `made_at`: the time the store records for
        the session (the fleet's; default this clock's). `sticky`: the clusters where an earlier
        attempt at the request may have made it, tried first (read with the admission)."""
        span = trace.get_current_span()
        key = request_key(request.user_id, request.request_id)
        run = PlacementRun(sticky_first(sticky, [c.cluster for c in candidates]), deadline, self.rng)
        try:
            return await self._place(run, key, request, admitted, made_at, span)
        except asyncio.CancelledError:
            if run.claimed:  # its caller is gone: it never answered, so others may record elsewhere
                self._in_background(self.store.commit(self.records.waive_claim, key, run.cluster),
                                    lambda task: _log_failure(task, f"request {key}: could not waive its claim "
                                                                    "(the resolver settles it)"))
            raise

    async def _place(self, run: PlacementRun, key: str, request: pb.SessionSpec, admitted: int | None,
                     made_at: float | None, span) -> pb.Session:
        msg = cluster_pb.AllocateRequest(spec=request)
        action = run.handle(Start(), self.clock.now())
        while True:
            match action:
                case Done(session=session, outcome=outcome, then=then):
                    self.outcomes[outcome] += 1
                    if then is not None:
                        self._record_later(key, then, made_at)
                    if outcome == "placed":
                        span.add_event("placed", {"cluster": run.cluster, "session.id": session.id})
                        span.set_attributes({telemetry.ATTR_SESSION_ID: session.id,
                                             telemetry.ATTR_CLUSTER: run.cluster,
                                             telemetry.ATTR_START: pb.StartKind.Name(session.start)
                                             .removeprefix("START_KIND_").lower()})
                    # A duplicate's answer is the winner's session, fetched from the winner's cluster.
                    return cluster_reports.checked(run.cluster if outcome == "placed" else cluster_of(session.id),
                                                   session)
                case GiveUp(outcome="held"):
                    self.outcomes["held"] += 1
                    raise Unavailable("this request's first placement may still make its session; retry",
                                      retry_after_s=0.5)
                case GiveUp(error=error, outcome=outcome):
                    self.outcomes[outcome] += 1
                    raise error or Unavailable("no candidate cluster could be tried before the deadline")
                case Send():
                    event = await self._send(key, msg, action, run, span)
                case Ask():
                    self.clients[action.cluster].breaker.failure(self.clock.now())  # its tries all failed
                    event = await self._ask(key, action, final=False)
                    if isinstance(event, Found):
                        self.clients[action.cluster].breaker.success()
                        self.attempt_outcomes[action.cluster, "found"] += 1
                        span.add_event("found", {"cluster": action.cluster, "session.id": event.session_id})
                case Discard():
                    self.attempt_outcomes[action.cluster, "duplicate"] += 1
                    event = await self._carry_out(key, action)
                case Record(cluster=cluster, commit_by=commit_by):
                    # Durable before the cluster is called: the resolver's record of a maybe-made session.
                    noted = await self.store.commit(self.records.note_attempt, key, cluster, commit_by, admitted)
                    if noted is None:
                        raise AdmissionChanged()
                    admitted, event = None, Recorded(noted.state, noted.first)
                case Remember(cluster=cluster, session_id=sid, wait_s=wait_s):
                    if wait_s:
                        span.add_event("held", {"cluster": cluster, "wait_s": wait_s})
                        await self.clock.sleep(wait_s)
                    event = await self._remember(key, cluster, sid, made_at)
                case Settle():
                    event = await self._settle(key, action)
                    if action.outcome in ("refused", "unresolved"):
                        span.add_event(action.outcome, {"cluster": action.cluster,
                                                        "code": getattr(run.last, "code", grpc.StatusCode.UNKNOWN).name})
                case _:
                    event = await self._carry_out(key, action)
            action = run.handle(event, self.clock.now())

    async def _send(self, key: str, msg: cluster_pb.AllocateRequest, send: Send, run: PlacementRun, span):
        client = self.clients[send.cluster]
        if send.try_no > 1:
            span.add_event("retry", {"cluster": send.cluster, "code": run.last.code.name, "wait_s": round(send.wait_s, 3)})
            await self.clock.sleep(send.wait_s)
        span.add_event("attempt", {"cluster": send.cluster, "try": send.try_no})
        client.breaker.attempt(self.clock.now())
        msg.commit_by.FromNanoseconds(int(send.commit_by * 1e9))
        try:
            resp = await call(client.sessions.Allocate, msg, send.timeout, tries=1)  # the machine retries
        except RemoteError as err:
            if ambiguous(err):
                return NoReply(err)
            client.breaker.success()  # it answered
            return Refused(err) if err.code in REFUSALS else Invalid(err)
        client.breaker.success()
        self.attempt_outcomes[send.cluster, "placed"] += 1
        return Allocated(resp.session.id, resp.session)

    async def _ask(self, key: str, ask: Ask, final: bool):
        """Found, NotFound, or (`final`: only NOT_FOUND is an answer) NoReply."""
        try:
            resp = await self.clients[ask.cluster].sessions.Get(_get_by_key(key), timeout=ask.timeout)
        except grpc.aio.AioRpcError as err:
            return NoReply(RemoteError(err)) if final and err.code() is not grpc.StatusCode.NOT_FOUND else NotFound()
        return Found(resp.session.id, resp.session)

    async def _settle(self, key: str, settle: Settle) -> Settled:
        applied = await self.store.commit(self.records.settle_attempt, key, settle.cluster, settle.to,
                                          settle.expected, settle.commit_by, settle.waive)
        if settle.outcome in ("refused", "unresolved"):
            self.attempt_outcomes[settle.cluster, settle.outcome] += 1
        return Settled(applied)

    def _record_later(self, key: str, remember: Remember, made_at: float | None) -> None:
        """The request's record, after its answer (the claim's placement): if it is never written
        (a crash), the resolver finds the session once commit_by has passed and records it."""
        user, sid = split_request_key(key)[0], remember.session_id
        self._recording[user] = self._in_background(self._remember(key, remember.cluster, sid, made_at),
                                                    lambda task: self._recorded(user, key, sid, task))

    def _recorded(self, user: str, key: str, session_id: str, task: asyncio.Task) -> None:
        if self._recording.get(user) is task:
            del self._recording[user]
        if task.cancelled() or task.exception() is not None:
            log.warning("request %s: could not record its answer %s yet (the resolver will): %s", key, session_id,
                        "cancelled" if task.cancelled() else task.exception())
        elif task.result().winner != session_id:  # the claim rules this out
            log.error("request %s: answered %s, but %s was recorded", key, session_id, task.result().winner)

    async def recorded(self, user_id: str) -> None:
        """Waits for the record of the user's last answer given before it (its quota check counts
        the session as made, not as being placed)."""
        if (task := self._recording.get(user_id)) is not None:
            await asyncio.wait([task])

    def _in_background(self, write, done: Callable[[asyncio.Task], None]) -> asyncio.Task:
        """`write` (a store commit) as a task of its own, which `flush` waits for; `done` is given
        it once it has ended."""
        task = asyncio.create_task(write)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(done)
        return task

    async def flush(self) -> None:
        """Waits for the writes in the background (before the store closes): the records of
        answers already given, the claims waived."""
        await asyncio.gather(*self._background, return_exceptions=True)

    async def _remember(self, key: str, cluster: str, session_id: str, made_at: float | None = None) -> Remembered:
        # Durable before the answer, except for the claim's placement: two placements of one
        # request at once (two replicas, a retry reaching another replica) can each make a session
        # at a different cluster, and this first-writer-wins record, with the claim, is what makes
        # both answer the same one. The cluster's request key settles one cluster's outcome, not
        # which of two clusters' sessions is the answer.
        return Remembered(await self.store.commit(self.records.remember_request, key, session_id, cluster,
                                                  self.clock.now() if made_at is None else made_at))

    async def _carry_out(self, key: str, action):
        match action:
            case Remember(cluster=cluster, session_id=sid):
                return await self._remember(key, cluster, sid)
            case Discard(cluster=cluster, winner=winner):
                user_id, request_id = split_request_key(key)
                try:
                    await self.clients[cluster].sessions.Discard(cluster_pb.DiscardRequest(
                        request_id=request_id, user_id=user_id, reason=f"request placed as {winner}"),
                        timeout=ATTEMPT_TIMEOUT_S)
                except grpc.aio.AioRpcError as err:
                    log.info("request %s: could not discard its duplicate in %s yet: %s", key, cluster, err.code().name)
                    return Discarded(False)
                log.info("request %s: placed as %s; discarded its duplicate in %s", key, winner, cluster)
                return Discarded(True)
            case FetchWinner(session_id=sid):
                sid = sid or await self.store.read(self.records.session_for_request, key)
                owner = self.clients[cluster_of(sid)]
                return Fetched((await call(owner.sessions.Get, cluster_pb.GetRequest(session_id=sid),
                                           ATTEMPT_TIMEOUT_S)).session)
        raise TypeError(f"no way to carry out {action!r}")

    # ---- the resolver ----------------------------------------------------------------------

    async def resolve(self) -> int:
        """Settles open attempts whose commit_by has passed; returns how many it settled."""
        settled = 0
        await self.store.commit(self.records.prune_attempts, self.clock.now() - PRUNE_AFTER_S)
        for key, cluster, state, commit_by in await self.store.read(self.records.attempts_to_resolve):
            client = self.clients.get(cluster)
            if key in self._locks or client is None or not client.healthy:
                continue  # being placed here now, or the cluster cannot answer
            run = ResolveRun(cluster, state, commit_by)
            action = run.handle(Start(), self.clock.now())
            while not isinstance(action, (Done, Leave)):
                match action:
                    case Ask():
                        event = await self._ask(key, action, final=True)
                    case Settle():
                        event = await self._settle(key, action)
                    case _:
                        event = await self._carry_out(key, action)
                action = run.handle(event, self.clock.now())
            if isinstance(action, Done):
                settled += 1
                if action.outcome == "adopted":
                    self.adopted += 1
                    log.info("request %s: adopted session %s found in %s", key, run.session_id, cluster)
                elif action.outcome == "discarded":
                    self.discarded += 1
        return settled

    async def run_resolver(self) -> None:
        while True:
            await self.clock.sleep(RESOLVE_EVERY_S)
            try:
                await self.resolve()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("resolving unanswered attempts failed; trying again later")


def _log_failure(task: asyncio.Task, what: str) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s: %s", what, task.exception())


def _get_by_key(key: str) -> cluster_pb.GetRequest:
    user_id, request_id = split_request_key(key)
    return cluster_pb.GetRequest(request_id=request_id, user_id=user_id)
