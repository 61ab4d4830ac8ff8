"""Placing a new session: one session per request key (a user's request id), however often the
client or the front retries and whichever cluster fails in the middle of a call.

For each candidate cluster, best first:
  1. the attempt (request id, cluster, commit_by) is written down before anything is sent;
  2. Allocate carries commit_by, after which the cluster makes nothing for an unknown request
     id; an ambiguous failure (unreachable, timed out, reply lost) is retried with backoff at
     the same cluster, which is safe because Allocate is idempotent by request id;
  3. a session: the request's winner is recorded (first writer wins) and returned. A refusal
     (no capacity, draining, too late): the next candidate. Still ambiguous after the retries:
     the attempt stays unresolved and the next candidate is tried.
Clusters holding an unresolved attempt of the same request come first on a retry, so asking
again there cannot make a second session. A resolver looks at unresolved attempts once their
commit_by has passed: a session made there for a request placed elsewhere is discarded (nobody
was ever told about it); one for a request that failed everywhere becomes its answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import asynccontextmanager
from typing import AsyncIterator

import grpc
from opentelemetry import trace

from provisioner import telemetry
from provisioner.api.status import RemoteError
from provisioner.clock import Clock
from provisioner.errors import Unavailable
from provisioner.front.clusters import ClusterClient
from provisioner.front.retry import ambiguous, call, retrying
from provisioner.front.router import Candidate
from provisioner.model import cluster_of, request_key, split_request_key
from provisioner.store import NONE, UNRESOLVED, SqliteStore
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

# Longest single attempt at one cluster, so a stuck cluster leaves time to try another.
ATTEMPT_TIMEOUT_S = 5.0
# commit_by is wall time (like a gRPC deadline, and unlike the clock, which a demo may speed up),
# judged by the cluster's wall clock; this is how far apart the two may be.
CLOCK_SKEW_S = 1.0
RESOLVE_EVERY_S = 2.0
# Settled attempts are kept this long after their commit_by (to look into), then forgotten.
PRUNE_AFTER_S = 3600.0
# Answers that say the cluster did not make the session and will not.
REFUSALS = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION,
                      grpc.StatusCode.ABORTED})


class Placement:
    def __init__(self, clients: dict[str, ClusterClient], store: SqliteStore, clock: Clock):
        self.clients = clients
        self.store = store
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}
        # What the resolver found: sessions adopted as a request's answer, duplicates discarded.
        self.adopted = self.discarded = 0
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

    def sticky_first(self, request_id: str, candidates: list[Candidate]) -> list[Candidate]:
        """Clusters where an earlier attempt's outcome is unknown come first: asking there again is
        idempotent, asking elsewhere could make a second session."""
        open_at = {cluster for _, cluster, _ in self.store.open_attempts(request_id)}
        return sorted(candidates, key=lambda c: c.cluster not in open_at)  # stable: rank order within

    async def place(self, request: pb.SessionSpec, candidates: list[Candidate], deadline: float) -> pb.Session:
        """Tries the candidates in order until one makes the session; `deadline` is loop time."""
        span = trace.get_current_span()
        rid = request_key(request.user_id, request.request_id)
        last: Exception | None = None
        for cand in self.sticky_first(rid, candidates):
            client = self.clients[cand.cluster]
            budget = min(ATTEMPT_TIMEOUT_S, deadline - _loop_now())
            if budget <= 0.05:
                break
            try:
                session = await self._attempt(client, request, budget, deadline, span)
            except RemoteError as err:
                if not (ambiguous(err) or err.code in REFUSALS):
                    self.outcomes["invalid"] += 1
                    raise  # the request itself is wrong: another cluster would say the same
                last = err
                continue
            # Until this is recorded the attempt stays open, so a retry after a failure here asks the
            # same cluster again (idempotent) instead of placing a second session elsewhere.
            winner = self.store.remember_request(rid, session.id, cand.cluster, self.clock.now())
            if winner != session.id:  # another front replica placed it first
                self.attempt_outcomes[cand.cluster, "duplicate"] += 1
                self.outcomes["duplicate"] += 1
                try:
                    await self._discard(client, rid, f"request placed as {winner}")
                    self.store.settle_attempt(rid, cand.cluster, NONE)
                    log.info("request %s: another front placed it as %s; discarded %s", rid, winner, session.id)
                except grpc.aio.AioRpcError:
                    self.store.settle_attempt(rid, cand.cluster, UNRESOLVED)  # the resolver discards it later
                owner = self.clients[cluster_of(winner)]
                return (await call(owner.sessions.Get, cluster_pb.GetRequest(session_id=winner),
                                    ATTEMPT_TIMEOUT_S)).session
            span.add_event("placed", {"cluster": cand.cluster, "session.id": session.id})
            span.set_attributes({telemetry.ATTR_SESSION_ID: session.id, telemetry.ATTR_CLUSTER: cand.cluster,
                                 telemetry.ATTR_START: pb.StartKind.Name(session.start)
                                 .removeprefix("START_KIND_").lower()})
            self.outcomes["placed"] += 1
            return session
        self.outcomes["failed"] += 1
        if last is not None:
            raise last
        raise Unavailable("no candidate cluster could be tried before the deadline")

    async def _attempt(self, client: ClusterClient, request: pb.SessionSpec, budget: float, deadline: float,
                       span) -> pb.Session:
        rid = request_key(request.user_id, request.request_id)
        commit_by = time.time() + budget
        self.store.note_attempt(rid, client.name, commit_by)
        msg = cluster_pb.AllocateRequest(spec=request)
        msg.commit_by.FromNanoseconds(int(commit_by * 1e9))

        def on_retry(state) -> None:
            err = state.outcome.exception()
            span.add_event("retry", {"cluster": client.name, "code": err.code.name,
                                     "wait_s": round(state.next_action.sleep, 3)})

        try:
            # Retries stay within this attempt's budget: past commit_by the cluster makes nothing new.
            async for try_ in retrying(budget, on_retry=on_retry):
                with try_:
                    span.add_event("attempt", {"cluster": client.name, "try": try_.retry_state.attempt_number})
                    client.breaker.attempt(time.monotonic())
                    timeout = max(0.01, min(budget, deadline - _loop_now()))
                    resp = await call(client.sessions.Allocate, msg, timeout, tries=1)  # retried by the loop above
        except RemoteError as err:
            if ambiguous(err):
                client.breaker.failure(time.monotonic())
                # Ask before moving on: the cluster may have made it and only the reply was lost.
                if (found := await self._ask(client, rid, deadline)) is not None:
                    span.add_event("found", {"cluster": client.name, "session.id": found.id})
                    client.breaker.success()
                    self.attempt_outcomes[client.name, "found"] += 1
                    return found  # settled as made once recorded as the request's answer
                # "Not found" is final only after commit_by: the resolver asks again then.
                self.store.settle_attempt(rid, client.name, UNRESOLVED)
                self.attempt_outcomes[client.name, "unresolved"] += 1
                span.add_event("unresolved", {"cluster": client.name, "code": err.code.name})
            else:
                client.breaker.success()  # it answered
                self.store.settle_attempt(rid, client.name, NONE)
                self.attempt_outcomes[client.name, "refused"] += 1
                span.add_event("refused", {"cluster": client.name, "code": err.code.name})
            raise
        client.breaker.success()
        self.attempt_outcomes[client.name, "placed"] += 1
        return resp.session

    async def _ask(self, client: ClusterClient, key: str, deadline: float) -> pb.Session | None:
        timeout = min(ATTEMPT_TIMEOUT_S, deadline - _loop_now())
        if timeout <= 0.01:
            return None
        try:
            return (await client.sessions.Get(_get_by_key(key), timeout=timeout)).session
        except grpc.aio.AioRpcError:
            return None

    async def _discard(self, client: ClusterClient, key: str, reason: str) -> None:
        user_id, request_id = split_request_key(key)
        await client.sessions.Discard(cluster_pb.DiscardRequest(request_id=request_id, user_id=user_id, reason=reason),
                                      timeout=ATTEMPT_TIMEOUT_S)

    # ---- the resolver ----------------------------------------------------------------------

    async def resolve(self) -> int:
        """Settles unresolved attempts whose commit_by has passed; returns how many it settled."""
        settled = 0
        now = self.clock.now()
        self.store.prune_attempts(time.time() - PRUNE_AFTER_S)
        for rid, cluster, commit_by in self.store.open_attempts():
            client = self.clients.get(cluster)
            if time.time() < commit_by + CLOCK_SKEW_S or rid in self._locks or client is None or not client.healthy:
                continue
            try:
                resp = await client.sessions.Get(_get_by_key(rid), timeout=ATTEMPT_TIMEOUT_S)
            except grpc.aio.AioRpcError as err:
                if err.code() is grpc.StatusCode.NOT_FOUND:
                    self.store.settle_attempt(rid, cluster, NONE)
                    settled += 1
                continue
            winner = self.store.remember_request(rid, resp.session.id, cluster, now)
            if winner == resp.session.id:
                self.adopted += 1
                log.info("request %s: adopted session %s found in %s", rid, winner, cluster)
            else:
                try:
                    await self._discard(client, rid, f"request placed as {winner}")
                except grpc.aio.AioRpcError:
                    continue
                self.store.settle_attempt(rid, cluster, NONE)
                self.discarded += 1
                log.warning("request %s: discarded duplicate %s in %s (placed as %s)",
                            rid, resp.session.id, cluster, winner)
            settled += 1
        return settled

    async def run_resolver(self) -> None:
        while True:
            await asyncio.sleep(RESOLVE_EVERY_S)  # wall time, like commit_by
            try:
                await self.resolve()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("resolving unanswered attempts failed; trying again later")


def _get_by_key(key: str) -> cluster_pb.GetRequest:
    user_id, request_id = split_request_key(key)
    return cluster_pb.GetRequest(request_id=request_id, user_id=user_id)


def _loop_now() -> float:
    return asyncio.get_running_loop().time()
