"""ClusterCore's part in priority and preemption: a session within its owner's share that finds
its pool full makes preemptible sessions give their GPUs back (decide/preempt.py chooses which
and in what order), each after a grace period in which its watchers are warned.

While in its grace period a victim keeps running, and the session it makes room for waits at the
head of the queue, so the victim's VM, once wiped, goes to it. At the end of the grace period the
victim is stopped with reason `preempted`, and a new session with its spec is queued in its place
if its caller asked for that. A preemption no longer needed by then (the waiting session was
placed some other way, or ended) is withdrawn, and the victim runs on: none is stopped in vain.
"""

from __future__ import annotations

import dataclasses
import heapq

from provisioner.decide.preempt import (STOP_REASON, Held, Request, Share, Victim, choose_victims, grace_plan,
                                        mark_over_share)
from provisioner.model.states import SessionState as S
from provisioner.model.errors import FailedPrecondition, ProvisionerError
from provisioner.model.records import Notice, Session

PREEMPTION = "preemption"  # the kind of the notices a preempted session's watchers get
_THEN = "; it stops in "  # a preemption's notice is its stop reason, then when
# A requeued session with less max runtime left than this is not worth a VM's assignment.
MIN_REQUEUED_RUNTIME_S = 60.0
# Sessions that hold (or have coming) a VM of their pool, so its GPUs.
_HOLDING = frozenset({S.PROVISIONING, S.PULLING_IMAGE, S.STARTING, S.RUNNING})
# And those whose VM is still theirs: a stopping session's until it is wiped.
_OCCUPYING = _HOLDING | {S.STOPPING}


class Preemption:
    def _preempt_for(self, s: Session, now: float) -> str:
        """Preempts sessions for `s`, queued because its pool cannot place it; the reason it waits,
        or "" when it may not preempt (its owner would go over their share, no share is set, too
        few preemptible GPUs) or already did."""
        share = self.priority.share_gpus(s.pool)
        pool = self.pools[s.pool]
        if not share or s.id in self._claims or self._at_user_ceiling(pool, s):
            return ""
        gpus = pool.config.accelerator_count
        user = s.spec.user_id
        holding = self._held.get(s.pool, {})
        claimed = sum(1 for r in self._waiting_claimants() if r.spec.user_id == user)
        mine = (holding.get(user, 0) + claimed) * gpus  # what the owner holds and will hold
        borrowable = self._borrowable.get(s.pool)
        if mine + gpus > share or not borrowable:
            return ""  # over its share, or nothing to take: no need to look at the pool
        candidates = [self.sessions[sid] for sid in borrowable]
        held = [Held(c.id, c.spec.user_id, c.priority_class, gpus, c.ready_at or c.created_at) for c in candidates]
        preemptible: dict[str, int] = {}
        for h in held:
            preemptible[h.owner] = preemptible.get(h.owner, 0) + 1
        # What each owner holds that is not up for preemption (sessions of never-preempted classes,
        # stopping sessions' VMs until wiped) fills the share first.
        ahead = {owner: (holding[owner] - n) * gpus for owner, n in preemptible.items()}
        shares = {owner: Share(share, holding[owner] * gpus) for owner in preemptible}
        shares[user] = Share(share, mine)
        running = [r for r in mark_over_share(held, share, self.priority.classes, ahead)
                   if r.id not in self._preempting]
        victims = choose_victims(Request(s.spec.user_id, s.priority_class, gpus), running, shares,
                                 self.priority.classes)
        if not victims:
            return ""
        grace = self.priority.grace_period_s
        self._claims.add(s.id)
        for v in victims:
            victim = self.sessions[v.session_id]
            plan = grace_plan(v, now, grace, victim.spec.requeue)
            self._warn_preempted(victim, v, shares[v.owner], s, plan.stop_at, now)
        n = len(victims)
        return (f"waiting for {n} preempted session{'s' if n > 1 else ''} to give back their GPUs "
                f"(a {grace:g} s grace period)")

    def _warn_preempted(self, v: Session, victim: Victim, theirs: Share, s: Session, stop_at: float,
                        now: float) -> None:
        # The victim is told why, not who: the other session and its user are not its business.
        if victim.cause == "over_share":
            why = (f"its user holds {theirs.used} GPUs of {s.pool}, over the {theirs.gpus}-GPU share each user "
                   "is guaranteed")
        else:
            why = f"its class {v.priority_class} ranks below {s.priority_class}"
        v.preempt_at, v.preempted_for = stop_at, s.id
        v.notices.append(Notice(PREEMPTION, f"{STOP_REASON}: {why}, and a session within its user's share needs "
                                            f"the GPU{_THEN}{stop_at - now:g} s", now, stop_at))
        self._session_changed(v)
        self._preempting[v.id] = s.id
        heapq.heappush(self._preempt_due, (stop_at, v.id))

    def _enforce_preemptions(self, now: float) -> None:
        heap = self._preempt_due
        while heap and heap[0][0] <= now:
            _, vid = heapq.heappop(heap)
            requester = self._preempting.pop(vid, None)
            v = self.sessions.get(vid)
            if requester is None or v is None or v.preempt_at == 0 or v.state not in _HOLDING:
                continue  # ended, or withdrawn, in the meantime
            waiting = self.sessions.get(requester)
            if waiting is None or waiting.state is not S.QUEUED:
                self._withdraw(v, now)
                continue
            notice = v.notices[-1] if v.notices and v.notices[-1].kind == PREEMPTION else None
            reason = notice.message.partition(_THEN)[0] if notice else STOP_REASON
            v.preempt_at = 0.0
            self._stop(v.id, reason, now)
            if v.spec.requeue:
                self._requeue(v, now)

    def _holding_changes(self, s: Session, state: S | None) -> None:
        """Keeps, per pool, how many VMs each user's sessions hold or have coming (a stopping
        session's VM until it is wiped) and which sessions of preemptible classes hold one, as a
        session changes state (`state` None: it is restored as it is). The queue's fairness reads
        the first, a preemption the second: neither walks the pool."""
        new = state if state is not None else s.state
        old = s.state if state is not None else None
        if (old in _OCCUPYING) != (new in _OCCUPYING):
            held = self._held.setdefault(s.pool, {})
            held[s.spec.user_id] = held.get(s.spec.user_id, 0) + (1 if new in _OCCUPYING else -1)
            if not held[s.spec.user_id]:
                del held[s.spec.user_id]
            if pool := self.pools.get(s.pool):
                pool.order.shift(s.spec.user_id, 1 if new in _OCCUPYING else -1)  # the user's queued sessions move
        if (old in _HOLDING) != (new in _HOLDING):
            klass = self.priority.classes.get(s.priority_class)
            if klass is not None and klass.preemptible:
                borrowable = self._borrowable.setdefault(s.pool, {})
                if new in _HOLDING:
                    borrowable[s.id] = None
                else:
                    del borrowable[s.id]
            if new not in _HOLDING and s.preempt_at:
                # Preempted, it stops (for this or any other reason) or fails before its grace
                # period ends: it is preempted no more; its heap entry finds nothing to do.
                s.preempt_at = 0.0

    def _withdraw(self, v: Session, now: float) -> None:
        v.preempt_at, v.preempted_for = 0.0, ""
        v.notices.append(Notice(PREEMPTION, "preemption withdrawn: the GPU is no longer needed; the session "
                                            "runs on", now, now))
        self._session_changed(v)

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
            self._session_changed(v)
            return
        v.requeued_as, new.requeued_from = new.id, v.id
        self._session_changed(v)
        self._session_changed(new)

    def _waiting_claimants(self) -> list[Session]:
        """The sessions that preempted others and still wait for their VMs. A claim lasts until
        its session leaves the queue: through the victims' grace periods and their VMs' wipes."""
        waiting = []
        for sid in list(self._claims):
            s = self.sessions.get(sid)
            if s is None or s.state is not S.QUEUED:
                self._claims.discard(sid)
            else:
                waiting.append(s)
        return waiting

    def _claimants(self, pool_name: str) -> frozenset[str]:
        """The queued sessions of the pool that preempted others: first in its queue."""
        return frozenset(s.id for s in self._waiting_claimants() if s.pool == pool_name)

    def _restore_preemption(self, s: Session) -> None:
        """A victim keeps naming the session it made room for until it has ended."""
        if s.preempted_for:
            self._claims.add(s.preempted_for)
        if s.preempt_at and s.state in _HOLDING:
            self._preempting[s.id] = s.preempted_for
            heapq.heappush(self._preempt_due, (s.preempt_at, s.id))
