"""The cluster core's sessions and their queue: requests, placement on a VM, the queue, the states
a session goes through, and how long an ended one is kept in memory. Pure.

The only writer of the session records and of the pools' queues; the VMs are decide/vms.py's (asked
to launch, start, assign, release), a session's notebook decide/notebooks.py's, and the VMs each
user holds decide/holdings.py's.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from provisioner.config import SessionsConfig
from provisioner.config.policy import PriorityConfig
from provisioner.decide.assignment import choose_standby, choose_vm, choose_waiting, hedge_worth, standby_sooner
from provisioner.decide.changes import Changes
from provisioner.decide.culling import Culling, minutes
from provisioner.decide.holdings import HOLDING, Holdings
from provisioner.decide.ids import IdSource
from provisioner.decide.pools import PoolState
from provisioner.decide.preemption import PREEMPTION
from provisioner.decide.queue import Queue, why_waiting
from provisioner.decide.sizing import Sizing
from provisioner.decide.spot_tier import choose_in_tier, standby_in_tier
from provisioner.model.errors import FailedPrecondition, NotFound, ProvisionerError, UserBlocked, quote
from provisioner.model.images import ImageCatalog
from provisioner.model.records import Notice, Session, SessionKind, SessionSpec, StartKind, Vm, session_copy
from provisioner.model.states import SessionState, VmState
from provisioner.rules.validation import priority_class, validate_spec

if TYPE_CHECKING:
    from provisioner.decide.notebooks import Notebooks
    from provisioner.decide.preemption import Preemption
    from provisioner.decide.vms import Vms

S = SessionState
# A session whose VM failed this many times before it ran (a create, boot or pull failed, or
# never answered; a stockout does not count: the session waits for capacity) fails, with the last
# failure as its reason, instead of trying for ever.
PLACEMENT_ATTEMPTS = 3
# A requeued session with less max runtime left than this is not worth a VM's assignment.
MIN_REQUEUED_RUNTIME_S = 60.0
# The fields of a session other parts mark (Sessions.note): budgets, preemption, abuse watch.
_MARKS = frozenset({"budget_ends_at", "preempt_at", "preempted_for", "abuse"})


def find(sessions: Mapping[str, Session], session_id: str, user_id: str = "") -> Session:
    """The session; with `user_id`, only if it is that user's (another user's session is reported
    as missing, not as forbidden, so its existence is not revealed)."""
    s = sessions.get(session_id)
    if s is not None and (not user_id or s.spec.user_id == user_id):
        return s
    raise NotFound(f"session {quote(session_id)} not found", field="session_id")


class Sessions:
    """The cluster's sessions, by id and by request, and their pools' queues."""

    def __init__(self, name: str, config: SessionsConfig, catalog: Callable[[], ImageCatalog], ids: IdSource,
                 priority: PriorityConfig, sizing: Sizing, changes: Changes):
        self._name, self._config, self._catalog, self._ids = name, config, catalog, ids
        self._priority = priority
        self._ranks = {name: c.rank for name, c in priority.classes.items()}  # the queue's order
        self._sizing, self._pools = sizing, sizing.pools  # the pools: read, and their queues written
        self._changes = changes
        self.sessions: dict[str, Session] = {}
        self.by_request: dict[str, str] = {}  # request key (SessionSpec.key) -> session id
        self.failed_tries: dict[str, int] = {}  # session id -> its VMs that failed before it ran
        self.draining = False
        self.blocked_users: frozenset[str] = frozenset()  # as the front last told (none requeued)
        self._forget_due: list[tuple[float, str]] = []  # (time, session id) when an ended one leaves memory

    def connect(self, vms: Vms, notebooks: Notebooks, holdings: Holdings, preemption: Preemption, culling: Culling,
                left_running: Callable[[str], None]) -> None:
        """The parts a session's life goes through: its VM (`vms`, read and asked to act), its
        notebook, the VMs its user holds, preemptions for it, culling once it runs, and abuse
        watching (`left_running`: told when it no longer runs)."""
        self._vm_side, self._vms, self._notebooks = vms, vms.vms, notebooks
        self._holdings, self._preemption, self._culling = holdings, preemption, culling
        self._left_running = left_running
        self._queue = Queue(self._pools, self.sessions, self._config.queue_timeout_s, self._ranks, holdings.of_pool,
                            preemption.claimants, self._changes)

    # ---- requests ------------------------------------------------------------------------

    def allocate(self, spec: SessionSpec, now: float, trace_context: Mapping[str, str]) -> Session:
        """Creates the session (idempotent by request id) and places it at once if it can."""
        if existing := self.by_request.get(spec.key):
            return self.sessions[existing]
        if spec.user_id in self.blocked_users:  # as the front last told: one leaked certificate is not enough
            raise UserBlocked(f"user {quote(spec.user_id)} may not start GPU sessions: blocked; an operator can "
                              "lift the block", field="spec.user_id")
        catalog, config = self._catalog(), self._config
        image = validate_spec(spec, self._pools, catalog, config.max_runtime_limit_s)
        klass = priority_class(spec, self._priority)
        if self.draining:
            raise FailedPrecondition(f"cluster {self._name} is draining")
        if spec.max_runtime_s:
            max_runtime = spec.max_runtime_s
        elif spec.kind is SessionKind.BATCH:
            max_runtime = config.batch_max_runtime_s
        else:
            max_runtime = config.max_runtime_limit_s
        s = Session(
            id=self._new_session_id(), spec=spec, cluster=self._name, pool=spec.accelerator, image=image,
            created_at=now, last_activity_at=now, idle_timeout_s=config.idle_timeout_s,
            max_runtime_s=max_runtime, trace_context=dict(trace_context), priority_class=klass,
            image_digest=catalog.digest(image), access_token=self._ids.secret(),
        )
        self.sessions[s.id] = s
        self.by_request[spec.key] = s.id
        pool = self._pools[s.pool]
        self._sizing.arrived(pool, image, now, spec.kind is SessionKind.BATCH)
        if not self._place(s, now):
            self._wait(s, why_waiting(pool, s, self._holdings.at_ceiling(pool, s)), now)
        return s

    def _new_session_id(self) -> str:
        # 40 random bits: a collision is rare, not impossible, and would merge two users' records.
        while (sid := self._ids.session()) in self.sessions:
            pass
        return sid

    def touch(self, session_id: str, now: float, user_id: str = "") -> Session:
        s = find(self.sessions, session_id, user_id)
        if not s.terminal:
            s.last_activity_at = now
            self._changes.session(s)
        return s

    def stop(self, session_id: str, reason: str, now: float, user_id: str = "") -> Session:
        """Idempotent: a session already stopping or ended is returned as it is."""
        s = find(self.sessions, session_id, user_id)
        if s.terminal or s.state is S.STOPPING:
            return s
        reason = reason or "stopped by the user"
        if s.state is S.QUEUED:
            self._queue.remove(s)
            self.end(s, S.STOPPED, reason, now)
            self._queue.renumber(self._pools[s.pool])
        elif s.state is S.PROVISIONING:
            vm = self._vms.get(s.vm_id)
            if vm is not None:
                self._vm_side.unreserve(vm)  # the VM joins the pool when it boots
            s.vm_id = ""
            self.end(s, S.STOPPED, reason, now)
        else:
            vm, notebook = self._vms[s.vm_id], s.state in (S.STARTING, S.RUNNING)
            self._set_state(s, S.STOPPING, reason, now)
            if notebook:  # its container ends first, then the VM is wiped
                self._notebooks.stop(s, vm, now)
            else:
                self._vm_side.release(vm, now)
        return s

    def forget(self, session_id: str) -> None:
        s = find(self.sessions, session_id)
        if not s.terminal:
            raise FailedPrecondition(f"session {session_id} is {s.state}; only ended sessions can be forgotten")
        del self.sessions[session_id]
        self._changes.forgot(session_id)
        if self.by_request.get(s.spec.key) == session_id:
            del self.by_request[s.spec.key]

    def discard(self, key: str, reason: str, now: float) -> Session | None:
        """Stops the session made for request `key`, which the front never acknowledged. Its
        record stays (ended, with the reason and any GPU time it used), so billing and quotas see
        it and the request key keeps naming it. None if there was none."""
        sid = self.by_request.get(key)
        if sid is None:
            return None
        return self.stop(sid, f"discarded: {reason}", now)

    def requeue(self, v: Session, now: float) -> None:
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
            new = self.allocate(dataclasses.replace(v.spec, request_id=f"requeue-{v.id}", max_runtime_s=left),
                                now, v.trace_context)
        except ProvisionerError as err:  # draining, or the image or pool is gone since
            v.notices.append(Notice(PREEMPTION, f"not queued again: {err.message}", now, now))
            self._changes.session(v)
            return
        v.requeued_as, new.requeued_from = new.id, v.id
        self._changes.session(v)
        self._changes.session(new)

    # ---- states --------------------------------------------------------------------------

    def _set_state(self, s: Session, state: SessionState, reason: str, now: float) -> None:
        self._holdings.change(s, state)
        if s.preempt_at and state not in HOLDING:
            # Preempted, it stops (for this or any other reason) or fails before its grace period
            # ends: it is preempted no more; its heap entry finds nothing to do.
            s.preempt_at = 0.0
        s.to(state, reason, now)
        self._changes.session(s)
        if state is not S.RUNNING:
            self._left_running(s.id)
        if s.terminal:
            self._retain(s, now)

    def end(self, s: Session, state: SessionState, reason: str, now: float) -> None:
        s.ended_at = now
        self.failed_tries.pop(s.id, None)
        self._set_state(s, state, reason, now)

    def starting(self, s: Session, ready_by: float, reason: str, now: float) -> None:
        """Its VM holds its image: its notebook starts, expected up by `ready_by`."""
        self.failed_tries.pop(s.id, None)
        s.estimated_ready_at = ready_by
        self._set_state(s, S.STARTING, reason, now)

    def running(self, s: Session, endpoint: str, reason: str, now: float) -> None:
        """Its notebook answers at `endpoint`: it runs, and is culled once idle or past its runtime."""
        s.ready_at = s.last_activity_at = s.estimated_ready_at = now
        s.endpoint = endpoint
        self._culling.watch(s)
        self._set_state(s, S.RUNNING, reason, now)

    def let_go(self, s: Session | None, now: float) -> None:
        """Its VM was wiped, deleted or failed: a stopping session is over."""
        if s is not None and s.state is S.STOPPING:
            self.end(s, S.STOPPED, s.reason, now)

    def lost_vm(self, s: Session, reason: str, now: float) -> None:
        """The session's VM is gone or failed: a stopping session is over, any other failed."""
        if s.state is S.STOPPING:
            self.end(s, S.STOPPED, s.reason, now)
        elif not s.terminal:
            self.end(s, S.FAILED, reason, now)

    def note(self, s: Session, notice: Notice | None = None, **marks) -> None:
        """What another part marks on a session: a notice for its watchers, and its budget's end,
        its preemption or its abuse decision record (only those)."""
        for name, value in marks.items():
            if name not in _MARKS:
                raise TypeError(f"{name} is not a mark another part may set on a session")
            setattr(s, name, value)
        if notice is not None:
            s.notices.append(notice)
        self._changes.session(s)

    def tick(self, now: float) -> None:
        """Fails sessions queued too long, and forgets those ended long enough ago."""
        if self._queue.due(now):
            timeout = minutes(self._config.queue_timeout_s)
            for s in self._queue.expired(now):
                self.end(s, S.FAILED, f"waited {timeout} in the queue without getting a VM", now)
        if _forget_due(self, now):
            self._forget_ended(now)

    def restore(self, sessions: Iterable[Session], each: Callable[[Session], None]) -> list[Session]:
        """Takes the sessions as the store kept them: a queued one back in its queue, an ended one
        kept in memory for what is left of its retention; `each` tells the other parts of each.
        Returns the records made of them."""
        restored = []
        for s in sessions:
            s = self.sessions[s.id] = session_copy(s)  # the core's own: the event's value stays as it was
            restored.append(s)
            if s.priority_class not in self._priority.classes:  # an older record, or a class since removed
                s.priority_class = self._priority.class_of(s.spec.kind.value)
            self.by_request[s.spec.key] = s.id
            if s.terminal:
                self._retain(s, s.ended_at or s.history[-1].time)
            elif s.state is S.QUEUED:
                self._queue.restore(s)
            each(s)
        self._queue.renumber_all()
        return restored

    def _retain(self, s: Session, ended_at: float) -> None:
        """An ended session stays in memory for sessions.retention_s (0: for ever), then only in
        the store."""
        if retention := self._config.retention_s:
            heapq.heappush(self._forget_due, (ended_at + retention, s.id))

    def _forget_ended(self, now: float) -> None:
        heap = self._forget_due
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            s = self.sessions.get(sid)
            if s is None or not s.terminal:
                continue
            vm = self._vms.get(s.vm_id)
            if vm is not None and vm.session_id == s.id:  # its VM still names it: kept till it lets go
                heapq.heappush(heap, (now + self._config.retention_s, sid))
                continue
            self.forget(sid)

    # ---- placement -----------------------------------------------------------------------

    def _place(self, s: Session, now: float) -> bool:
        """Gives the session a warm VM or launches one; False when it must wait."""
        pool, sizing, catalog = self._pools[s.pool], self._sizing, self._catalog()
        if self._holdings.at_ceiling(pool, s):  # it waits for one of its user's VMs to come free
            return False
        tier, batch = pool.config.spot_tier, s.spec.kind is SessionKind.BATCH  # Spot VMs: batch only
        if tier:
            choice = choose_in_tier(s.image, reversed(pool.ready.values()), catalog, batch)
        else:
            choice = choose_vm(s.image, reversed(pool.ready.values()), catalog)  # newest warm first
        if choice.vm_id and not choice.missing_bytes:
            self.assign(s, self._vms[choice.vm_id], choice.start, now)
            return True
        if self._start_standby(s, pool, tier, batch, choice.missing_bytes if choice.vm_id else None, now):
            return True
        if choice.vm_id:  # a partial pull onto a warm VM beats waiting for one
            self.assign(s, self._vms[choice.vm_id], choice.start, now)
            return True
        if not sizing.can_launch(pool, now):
            return False
        vm = self._vm_side.launch(pool, now, images=(s.image,), reserved_for=s, spot=tier and batch)
        if vm is None:
            return False
        s.vm_id, s.start, s.estimated_ready_at = vm.id, StartKind.COLD, now + sizing.cold_start_s(s.image)
        self._set_state(s, S.PROVISIONING, f"creating VM {vm.id} in {vm.zone}", now)
        return True

    def _start_standby(self, s: Session, pool: PoolState, tier: bool, batch: bool, warm_missing: int | None,
                       now: float) -> bool:
        """Starts a standby VM for the session if it serves sooner than a warm VM missing `warm_missing`
        bytes of its image (None: none free), and maybe a second beside it (assignment.hedge_worth)."""
        sizing, catalog = self._sizing, self._catalog()
        usable = lambda v: pool.stocked_out_until.get(v.zone, 0.0) <= now  # noqa: E731
        pick = lambda: (standby_in_tier(s.image, pool.standby.values(), catalog, usable, batch, either=batch)  # noqa: E731
                        if tier else choose_standby(s.image, pool.standby.values(), catalog, usable))
        if not sizing.can_start(pool) or (standby := pick()) is None:
            return False
        missing = catalog.missing_bytes(s.image, standby.cache.layer_ids)
        start_s, bandwidth = sizing.start_estimate_s(pool), sizing.bandwidth()
        if not standby_sooner(warm_missing, missing, start_s, bandwidth):
            return False
        self._vm_side.start(standby, now, reserved_for=s)
        if sizing.can_start(pool) and (hedge := pick()) is not None and hedge_worth(s.image, hedge, catalog):
            self._vm_side.start(hedge, now)  # the pool's when up, unless it is up first: see _serve_waiting
        s.vm_id, s.start, s.estimated_ready_at = standby.id, StartKind.PARTIAL, now + start_s + missing / bandwidth
        self._set_state(s, S.PROVISIONING, f"starting standby VM {standby.id} in {standby.zone}", now)
        return True

    def _serve_waiting(self, pool: PoolState, vm: Vm, now: float) -> None:
        """A warm VM came free: a session waiting for a VM being made or started for it takes it if
        it is ready sooner on it (decide/assignment.py: choose_waiting); the VM it waited for joins
        the pool when up."""
        batch_only = pool.config.spot_tier and vm.spot  # a Spot VM of a tier serves batch sessions only
        waiting = [s for v in pool.awaited.values() if (s := self.sessions.get(v.reserved_for)) is not None
                   and s.state is S.PROVISIONING and s.vm_id == v.id
                   and (not batch_only or s.spec.kind is SessionKind.BATCH)]
        s = choose_waiting(vm, waiting, self._catalog(), self._sizing.bandwidth(), now) if waiting else None
        if s is not None:
            self._vm_side.unreserve(self._vms[s.vm_id])
            missing = self._catalog().missing_bytes(s.image, vm.cache.layer_ids)
            self.assign(s, vm, StartKind.PARTIAL if missing else StartKind.WARM, now)

    def assign(self, s: Session, vm: Vm, start: StartKind, now: float) -> None:
        """The session gets the warm VM: it pulls the layers it lacks, or its notebook starts."""
        self._vm_side.assign(vm, s.id, now)
        s.vm_id, s.endpoint, s.start = vm.id, vm.endpoint, start
        missing = tuple(vm.cache.missing(s.image, self._catalog()))
        if missing:
            total = sum(layer.size_bytes for layer in missing)
            s.pull_bytes_total, s.pull_bytes_done = total, 0
            s.estimated_ready_at = now + total / self._sizing.bandwidth()
            pulling = f"pulling {len(missing)} layers ({total / 1e9:.1f} GB) on VM {vm.id}"
            self._set_state(s, S.PULLING_IMAGE, pulling, now)
            self._vm_side.hold_image(vm, s.image, missing, s.id, now)
        else:
            self._vm_side.hold_image(vm, s.image, missing, s.id, now)
            self._notebooks.start(s, vm, now)

    def pull_progress(self, s: Session, bytes_done: int, now: float) -> None:
        s.pull_bytes_done = bytes_done
        remaining = max(0, s.pull_bytes_total - bytes_done)
        s.estimated_ready_at = now + remaining / self._sizing.bandwidth()
        self._changes.session(s)

    def pulled(self, s: Session, vm: Vm, now: float) -> None:
        """Its VM holds its image now: its notebook starts."""
        s.pull_bytes_done = s.pull_bytes_total
        self._notebooks.start(s, vm, now)

    def replace(self, s: Session, why: str, now: float, failure: str = "") -> None:
        """The session's VM will not serve it (its create, boot or pull failed): another, or the
        queue. A `failure` counts against the session: after PLACEMENT_ATTEMPTS it fails with it."""
        s.pull_bytes_total = s.pull_bytes_done = 0
        if failure:
            tries = self.failed_tries[s.id] = self.failed_tries.get(s.id, 0) + 1
            if tries >= PLACEMENT_ATTEMPTS:
                self.end(s, S.FAILED, f"no VM could be made ready for it in {tries} tries; the last: {failure}", now)
                return
        if not self._place(s, now):
            self._wait(s, why, now)

    def _wait(self, s: Session, why: str, now: float) -> None:
        """Queues a session its pool cannot place now, after preempting others for it if it may."""
        self._enqueue(s, self._preemption.preempt_for(s, now) or why, now)

    # ---- the queue -----------------------------------------------------------------------

    def _enqueue(self, s: Session, reason: str, now: float) -> None:
        s.vm_id = ""
        s.estimated_ready_at = now + self._sizing.cold_start_s(s.image)
        self._set_state(s, S.QUEUED, reason, now)
        self._queue.add(s, now)

    def dispatch(self, pool: PoolState, now: float, freed: Vm | None = None) -> None:
        """Places the pool's queued sessions in their order, as far as VMs allow; then, if `freed`
        (a VM that came free) is still free, it may serve a session waiting for another VM."""
        if pool.queue:
            self._place_queued(pool, now)
        if freed is not None and pool.awaited and freed.state is VmState.WARM and not freed.session_id:
            self._serve_waiting(pool, freed, now)

    def _place_queued(self, pool: PoolState, now: float) -> None:
        placed = False
        for s in list(self._queue.order(pool)):  # a copy: placing one may change the order kept
            if not self._place(s, now):
                if self._holdings.at_ceiling(pool, s):
                    continue  # its user's ceiling holds it, not the pool: the next may go
                break
            self._queue.remove(s)
            placed = True
        if placed:
            self._queue.renumber(pool)


def tick_due(sessions: Sessions, now: float) -> bool:
    """Whether sessions.tick(now) has anything to do (beside the class, whose public methods are
    as many as a class may have)."""
    return sessions._queue.due(now) or _forget_due(sessions, now)


def _forget_due(sessions: Sessions, now: float) -> bool:
    heap, records = sessions._forget_due, sessions.sessions
    while heap and heap[0][1] not in records:  # forgotten already (a replay forgets at once)
        heapq.heappop(heap)
    return bool(heap) and heap[0][0] <= now
