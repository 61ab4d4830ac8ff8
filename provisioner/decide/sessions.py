"""The cluster core's sessions: requests, placement, the queue, culling.

Part of ClusterCore (provisioner/decide/core.py), split out by concern; pure like the rest.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import defaultdict
from typing import Mapping

from provisioner.decide.assignment import choose_standby, choose_vm
from provisioner.decide.autoscale import queued_demand
from provisioner.decide.culling import minutes
from provisioner.decide.pools import PoolState
from provisioner.model.states import SessionState, VmState
from provisioner.decide.preemption import PREEMPTION
from provisioner.model.errors import FailedPrecondition, NotFound, ProvisionerError, UserBlocked, quote
from provisioner.model.records import Notice, Session, SessionKind, SessionSpec, StartKind, Vm
from provisioner.rules.validation import priority_class, validate_spec

S, V = SessionState, VmState
# A session whose VM failed this many times before it ran (a create, boot or pull failed, or
# never answered; a stockout does not count: the session waits for capacity) fails, with the last
# failure as its reason, instead of trying for ever.
PLACEMENT_ATTEMPTS = 3
# A requeued session with less max runtime left than this is not worth a VM's assignment.
MIN_REQUEUED_RUNTIME_S = 60.0


class Sessions:
    """ClusterCore's session side."""

    # ---- reads ---------------------------------------------------------------------------

    def validate(self, spec: SessionSpec) -> str:
        """Checks a request against this cluster; returns the resolved image version."""
        return validate_spec(spec, self.pools, self.catalog, self.sessions_config.max_runtime_limit_s)

    def get(self, session_id: str, user_id: str = "") -> Session:
        """The session; with `user_id`, only if it is that user's (another user's session is
        reported as missing, not as forbidden, so its existence is not revealed)."""
        s = self.sessions.get(session_id)
        if s is not None and (not user_id or s.spec.user_id == user_id):
            return s
        raise NotFound(f"session {quote(session_id)} not found", field="session_id")

    def get_by_request(self, key: str) -> Session:
        if sid := self.by_request.get(key):
            return self.sessions[sid]
        raise NotFound("no session for this request id", field="request_id")

    # ---- requests ------------------------------------------------------------------------

    def _allocate(self, spec: SessionSpec, now: float, trace_context: Mapping[str, str]) -> Session:
        """Creates the session (idempotent by request id) and places it at once if it can."""
        if existing := self.by_request.get(spec.key):
            return self.sessions[existing]
        if spec.user_id in self.blocked_users:  # as the front last told: one leaked certificate is not enough
            raise UserBlocked(f"user {quote(spec.user_id)} may not start GPU sessions: blocked; an operator can "
                              "lift the block", field="spec.user_id")
        image = self.validate(spec)
        klass = priority_class(spec, self.priority)
        if self.draining:
            raise FailedPrecondition(f"cluster {self.name} is draining")
        if spec.max_runtime_s:
            max_runtime = spec.max_runtime_s
        elif spec.kind is SessionKind.BATCH:
            max_runtime = self.sessions_config.batch_max_runtime_s
        else:
            max_runtime = self.sessions_config.max_runtime_limit_s
        s = Session(
            id=self._new_session_id(), spec=spec, cluster=self.name, pool=spec.accelerator, image=image,
            created_at=now, last_activity_at=now, idle_timeout_s=self.sessions_config.idle_timeout_s,
            max_runtime_s=max_runtime, trace_context=dict(trace_context), priority_class=klass,
            image_digest=self.catalog.digest(image), access_token=self.ids.secret(),
        )
        self.sessions[s.id] = s
        self.by_request[spec.key] = s.id
        pool = self.pools[s.pool]
        pool.demand.count(image, now)
        pool.forecast.arrival(now)
        if not self._place(s, now):
            self._wait(s, self._why_waiting(pool, s), now)
        return s

    def _new_session_id(self) -> str:
        # 40 random bits: a collision is rare, not impossible, and would merge two users' records.
        while (sid := self.ids.session()) in self.sessions:
            pass
        return sid

    def _touch(self, session_id: str, now: float, user_id: str = "") -> Session:
        s = self.get(session_id, user_id)
        if not s.terminal:
            s.last_activity_at = now
            self._changes.session(s)
        return s

    def _stop(self, session_id: str, reason: str, now: float, user_id: str = "") -> Session:
        """Idempotent: a session already stopping or ended is returned as it is."""
        s = self.get(session_id, user_id)
        if s.terminal or s.state is S.STOPPING:
            return s
        reason = reason or "stopped by the user"
        if s.state is S.QUEUED:
            self._dequeue(s)
            self._end(s, S.STOPPED, reason, now)
            self._renumber_queue(self.pools[s.pool])
        elif s.state is S.PROVISIONING:
            vm = self.vms.get(s.vm_id)
            if vm is not None:
                vm.reserved_for = ""  # the VM joins the pool when it boots
                self._changes.vm(vm)
            s.vm_id = ""
            self._end(s, S.STOPPED, reason, now)
        else:
            vm, notebook = self.vms[s.vm_id], s.state in (S.STARTING, S.RUNNING)
            self._set_session(s, S.STOPPING, reason, now)
            if notebook:  # its container ends first, then the VM is wiped
                self._stop_notebook(s, vm, now)
            else:
                self._release(vm, now)
        return s

    def _forget(self, session_id: str) -> None:
        s = self.get(session_id)
        if not s.terminal:
            raise FailedPrecondition(f"session {session_id} is {s.state}; only ended sessions can be forgotten")
        del self.sessions[session_id]
        if self.by_request.get(s.spec.key) == session_id:
            del self.by_request[s.spec.key]

    def _retain(self, s: Session, ended_at: float) -> None:
        """An ended session stays in memory for sessions.retention_s (0: for ever), then only in
        the store."""
        if retention := self.sessions_config.retention_s:
            heapq.heappush(self._forget_due, (ended_at + retention, s.id))

    def _forget_ended(self, now: float) -> None:
        heap = self._forget_due
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            s = self.sessions.get(sid)
            if s is None or not s.terminal:
                continue
            vm = self.vms.get(s.vm_id)
            if vm is not None and vm.session_id == s.id:  # its VM still names it: kept till it lets go
                heapq.heappush(heap, (now + self.sessions_config.retention_s, sid))
                continue
            self._forget(sid)

    def _discard(self, key: str, reason: str, now: float) -> Session | None:
        """Stops the session made for request `key`, which the front never acknowledged. Its
        record stays (ended, with the reason and any GPU time it used), so billing and quotas see
        it and the request key keeps naming it. None if there was none."""
        sid = self.by_request.get(key)
        if sid is None:
            return None
        return self._stop(sid, f"discarded: {reason}", now)

    def _end(self, s: Session, state: SessionState, reason: str, now: float) -> None:
        s.ended_at = now
        self._failed_tries.pop(s.id, None)
        self._set_session(s, state, reason, now)

    def _requeue(self, v: Session, now: float) -> None:
        """A new session with the preempted one's spec, under a request id of its own, and with
        what is left of its max runtime: a chain of requeues runs no longer than the first
        session may. None for a blocked user (the front's list): a block stops every way to GPU
        time, requeues too."""
        left = v.max_runtime_s - (now - v.ready_at if v.ready_at else 0.0)
        if v.spec.user_id in self.blocked_users:
            why = "its user is blocked from GPU sessions"
        elif left < MIN_REQUEUED_RUNTIME_S:
            why = "its max runtime is used up"
        else:
            why = ""
        try:
            if why:
                raise FailedPrecondition(why)
            new = self._allocate(dataclasses.replace(v.spec, request_id=f"requeue-{v.id}", max_runtime_s=left),
                                 now, v.trace_context)
        except ProvisionerError as err:  # draining, or the image or pool is gone since
            v.notices.append(Notice(PREEMPTION, f"not queued again: {err.message}", now, now))
            self._changes.session(v)
            return
        v.requeued_as, new.requeued_from = new.id, v.id
        self._changes.session(v)
        self._changes.session(new)

    # ---- placement -----------------------------------------------------------------------

    def _place(self, s: Session, now: float) -> bool:
        """Gives the session a warm VM or launches one; False when it must wait."""
        pool = self.pools[s.pool]
        if self._at_user_ceiling(pool, s):  # it waits for one of its user's VMs to come free
            return False
        choice = choose_vm(s.image, reversed(pool.ready.values()), self.catalog)  # newest warm first
        if choice.vm_id:
            vm = self.vms[choice.vm_id]
            self._assign(s, vm, choice.start, now)
            return True
        if self._can_start(pool):
            standby = choose_standby(s.image, pool.standby.values(), self.catalog,
                                     lambda v: pool.stocked_out_until.get(v.zone, 0.0) <= now)
            if standby is not None:
                self._start(standby, now, reserved_for=s)
                s.vm_id = standby.id
                s.start = StartKind.PARTIAL
                missing = self.catalog.missing_bytes(s.image, standby.cache.layer_ids)
                s.estimated_ready_at = now + self._start_estimate_s(pool) + missing / self._bandwidth()
                self._set_session(s, S.PROVISIONING, f"starting standby VM {standby.id} in {standby.zone}", now)
                return True
        if not self._can_launch(pool, now):
            return False
        vm = self._launch(pool, now, images=(s.image,), reserved_for=s)
        if vm is None:
            return False
        s.vm_id = vm.id
        s.start = StartKind.COLD
        s.estimated_ready_at = now + self._cold_start_s(s.image)
        self._set_session(s, S.PROVISIONING, f"creating VM {vm.id} in {vm.zone}", now)
        return True

    def _assign(self, s: Session, vm: Vm, start: StartKind, now: float) -> None:
        vm.session_id, vm.reserved_for = s.id, ""
        self._set_vm(vm, V.ASSIGNED, f"assigned to session {s.id}", now)
        s.vm_id, s.endpoint, s.start = vm.id, vm.endpoint, start
        missing = tuple(vm.cache.missing(s.image, self.catalog))
        if missing:
            total = sum(layer.size_bytes for layer in missing)
            s.pull_bytes_total, s.pull_bytes_done = total, 0
            s.estimated_ready_at = now + total / self._bandwidth()
            self._set_session(s, S.PULLING_IMAGE, f"pulling {len(missing)} layers ({_gb(total)}) on VM {vm.id}", now)
            # A prewarm of this very image is already under way: wait for it. Otherwise this pull
            # supersedes whatever prewarm the VM was doing.
            if vm.pulling != s.image:
                vm.pulling = s.image
                self._pull(now, vm, s.image, missing, s.id)
        else:
            vm.cache.touch(s.image, self.catalog, now)
            self._start_notebook(s, vm, now)

    def _replace(self, s: Session, why: str, now: float, failure: str = "") -> None:
        """The session's VM will not serve it (its create, boot or pull failed): another, or the
        queue. A `failure` counts against the session: after PLACEMENT_ATTEMPTS it fails with it."""
        s.pull_bytes_total = s.pull_bytes_done = 0
        if failure:
            tries = self._failed_tries[s.id] = self._failed_tries.get(s.id, 0) + 1
            if tries >= PLACEMENT_ATTEMPTS:
                self._end(s, S.FAILED, f"no VM could be made ready for it in {tries} tries; the last: {failure}", now)
                return
        if not self._place(s, now):
            self._wait(s, why, now)

    def _wait(self, s: Session, why: str, now: float) -> None:
        """Queues a session its pool cannot place now, after preempting others for it if it may."""
        self._enqueue(s, self.preemption.preempt_for(s, now) or why, now)

    def _enqueue(self, s: Session, reason: str, now: float) -> None:
        pool = self.pools[s.pool]
        pool.queue[s.id] = None
        s.vm_id = ""
        s.estimated_ready_at = now + self._cold_start_s(s.image)
        self._set_session(s, S.QUEUED, reason, now)
        pool.order.add(s, self._holding(pool), self._ranks, self._first(pool))
        self._renumber_queue(pool)
        self._watch_queue(s, now)

    def _dequeue(self, s: Session) -> None:
        pool = self.pools[s.pool]
        del pool.queue[s.id]
        pool.order.remove(s, self._first(pool))

    def _watch_queue(self, s: Session, since: float) -> None:
        if timeout := self.sessions_config.queue_timeout_s:
            heapq.heappush(self._queue_due, (since + timeout, s.id))

    def _expire_queue(self, now: float) -> None:
        """Fails sessions queued longer than the queue allows (sessions.queue_timeout_s)."""
        heap, timeout = self._queue_due, self.sessions_config.queue_timeout_s
        left: dict[str, PoolState] = {}  # renumbered once each, not once per session: a burst times out together
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            s = self.sessions.get(sid)
            # Queued again since this entry was made: a later entry stands for it.
            if s is None or s.state is not S.QUEUED or s.history[-1].time + timeout > now:
                continue
            self._dequeue(s)
            self._end(s, S.FAILED, f"waited {minutes(timeout)} in the queue without getting a VM", now)
            left[s.pool] = self.pools[s.pool]
        for pool in left.values():
            self._renumber_queue(pool)

    def _renumber_queue(self, pool: PoolState) -> None:
        """Sets the positions of the queue's sessions from the first that moved since the last
        renumbering on (those before kept theirs). A place is a live value, not part of the
        session's record: a move alone makes no new revision and nothing to write (one session
        leaving the head of a long queue would otherwise rewrite every other), only a report to
        the session's watchers."""
        order = self._queue_order(pool)
        for pos in range(pool.order.take_changed(), len(order)):
            s = order[pos]
            if s.queue_position != pos + 1:
                s.queue_position = pos + 1
                self._changes.moved(s)

    def _holding(self, pool: PoolState) -> dict[str, int]:
        """The pool's VMs each user's sessions hold or have coming (a stopping session's until it
        is wiped), from counts kept as sessions change state (decide/preemption.py)."""
        return self.holdings.of_pool(pool.config.name)

    def _at_user_ceiling(self, pool: PoolState, s: Session) -> bool:
        ceiling = pool.policy.max_vms_per_user
        return bool(ceiling) and self._holding(pool).get(s.spec.user_id, 0) >= ceiling

    def _why_waiting(self, pool: PoolState, s: Session) -> str:
        if self._at_user_ceiling(pool, s):
            return (f"waiting for one of its user's sessions to end: user {quote(s.spec.user_id)} holds the "
                    f"pool's per-user ceiling of {pool.policy.max_vms_per_user} VMs")
        return "waiting for capacity: the pool is at its maximum or stocked out"

    def _queue_order(self, pool: PoolState) -> list[Session]:
        return pool.order.order(lambda: [self.sessions[i] for i in pool.queue], self._holding(pool), self._ranks,
                                self._first(pool))

    def _first(self, pool: PoolState) -> frozenset[str]:
        return self.preemption.claimants(pool.config.name)

    def _queued_demand(self, pool: PoolState) -> int:
        """The queued sessions the autoscaler grows the pool for: with a per-user ceiling, a user's
        count only up to the ceiling less the VMs the user holds."""
        ceiling = pool.policy.max_vms_per_user
        if not ceiling or not pool.queue:
            return len(pool.queue)
        queued: dict[str, int] = defaultdict(int)
        for sid in pool.queue:
            queued[self.sessions[sid].spec.user_id] += 1
        return queued_demand(queued, self._holding(pool), ceiling)

    def _dispatch_queue(self, pool: PoolState, now: float) -> None:
        if not pool.queue:
            return
        placed = False
        for s in list(self._queue_order(pool)):  # a copy: placing one may change the order kept
            if not self._place(s, now):
                if self._at_user_ceiling(pool, s):
                    continue  # its user's ceiling holds it, not the pool: the next may go
                break
            self._dequeue(s)
            placed = True
        if placed:
            self._renumber_queue(pool)


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB"
