"""The cluster core's part in priority and preemption: a session within its owner's share that finds
its pool full makes preemptible sessions give their GPUs back (decide/preemption_rules.py chooses which
and in what order), each after a grace period in which its watchers are warned.

While in its grace period a victim keeps running, and the session it makes room for waits at the
head of the queue, so the victim's VM, once wiped, goes to it. At the end of the grace period the
victim is stopped with reason `preempted`, and a new session with its spec is queued in its place
if its caller asked for that. A preemption no longer needed by then (the waiting session was
placed some other way, or ended) is withdrawn, and the victim runs on: none is stopped in vain.
"""

from __future__ import annotations

import heapq
from typing import Callable, Mapping

from provisioner.decide.preemption_rules import (STOP_REASON, Held, Request, Share, Victim, choose_victims, grace_plan,
                                        mark_over_share)
from provisioner.model.states import SessionState as S
from provisioner.config.policy import PriorityConfig
from provisioner.decide.holdings import HOLDING, Holdings
from provisioner.decide.pools import PoolState
from provisioner.model.records import Notice, Session

PREEMPTION = "preemption"  # the kind of the notices a preempted session's watchers get
_THEN = "; it stops in "  # a preemption's notice is its stop reason, then when


class Preemption:
    """The preemptions under way: victims in their grace periods, and the sessions they make room for."""

    def __init__(self, sessions: Mapping[str, Session], pools: Mapping[str, PoolState], priority: PriorityConfig,
                 holdings: Holdings, at_ceiling: Callable[[PoolState, Session], bool],
                 note: Callable[..., None], stop: Callable[[str, str, float], object],
                 requeue: Callable[[Session, float], None]):
        self._sessions, self._pools = sessions, pools  # the core's, read only
        self._priority = priority
        self._holdings = holdings
        self._at_ceiling = at_ceiling  # its user holds the pool's per-user ceiling of VMs
        self._note = note  # marks a session: a notice, a preemption (decide/sessions.py: Sessions.note)
        self._stop = stop  # stops a session (id, reason, now) as a user's stop does
        self._requeue = requeue  # queues a new session with a preempted one's spec
        self._due: list[tuple[float, str]] = []  # (end of a grace period, preempted session id)
        self._preempting: dict[str, str] = {}  # preempted session in its grace period -> whom it makes room for
        self._claims: set[str] = set()  # queued sessions that preempted others, until they leave the queue

    def preempt_for(self, s: Session, now: float) -> str:
        """Preempts sessions for `s`, queued because its pool cannot place it; the reason it waits,
        or "" when it may not preempt (its owner would go over their share, no share is set, too
        few preemptible GPUs) or already did."""
        share = self._priority.share_gpus(s.pool)
        pool = self._pools[s.pool]
        if not share or s.id in self._claims or self._at_ceiling(pool, s):
            return ""
        gpus = pool.config.accelerator_count
        user = s.spec.user_id
        holding = self._holdings.of_pool(s.pool)
        claimed = sum(1 for r in self._waiting_claimants() if r.spec.user_id == user)
        mine = (holding.get(user, 0) + claimed) * gpus  # what the owner holds and will hold
        borrowable = self._holdings.borrowable(s.pool)
        if mine + gpus > share or not borrowable:
            return ""  # over its share, or nothing to take: no need to look at the pool
        candidates = [self._sessions[sid] for sid in borrowable]
        held = [Held(c.id, c.spec.user_id, c.priority_class, gpus, c.ready_at or c.created_at) for c in candidates]
        preemptible: dict[str, int] = {}
        for h in held:
            preemptible[h.owner] = preemptible.get(h.owner, 0) + 1
        # What each owner holds that is not up for preemption (sessions of never-preempted classes,
        # stopping sessions' VMs until wiped) fills the share first.
        ahead = {owner: (holding[owner] - n) * gpus for owner, n in preemptible.items()}
        shares = {owner: Share(share, holding[owner] * gpus) for owner in preemptible}
        shares[user] = Share(share, mine)
        running = [r for r in mark_over_share(held, share, self._priority.classes, ahead)
                   if r.id not in self._preempting]
        victims = choose_victims(Request(s.spec.user_id, s.priority_class, gpus), running, shares,
                                 self._priority.classes)
        if not victims:
            return ""
        grace = self._priority.grace_period_s
        self._claims.add(s.id)
        for v in victims:
            victim = self._sessions[v.session_id]
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
        self._note(v, Notice(PREEMPTION, f"{STOP_REASON}: {why}, and a session within its user's share needs "
                                         f"the GPU{_THEN}{stop_at - now:g} s", now, stop_at),
                   preempt_at=stop_at, preempted_for=s.id)
        self._preempting[v.id] = s.id
        heapq.heappush(self._due, (stop_at, v.id))

    def enforce(self, now: float) -> None:
        heap = self._due
        while heap and heap[0][0] <= now:
            _, vid = heapq.heappop(heap)
            requester = self._preempting.pop(vid, None)
            v = self._sessions.get(vid)
            if requester is None or v is None or v.preempt_at == 0 or v.state not in HOLDING:
                continue  # ended, or withdrawn, in the meantime
            waiting = self._sessions.get(requester)
            if waiting is None or waiting.state is not S.QUEUED:
                self._withdraw(v, now)
                continue
            notice = v.notices[-1] if v.notices and v.notices[-1].kind == PREEMPTION else None
            reason = notice.message.partition(_THEN)[0] if notice else STOP_REASON
            self._stop(v.id, reason, now)  # it no longer holds its VM: preempted no more (decide/sessions.py)
            if v.spec.requeue:
                self._requeue(v, now)

    def _withdraw(self, v: Session, now: float) -> None:
        self._note(v, Notice(PREEMPTION, "preemption withdrawn: the GPU is no longer needed; the session runs on",
                             now, now), preempt_at=0.0, preempted_for="")

    def _waiting_claimants(self) -> list[Session]:
        """The sessions that preempted others and still wait for their VMs. A claim lasts until
        its session leaves the queue: through the victims' grace periods and their VMs' wipes."""
        waiting = []
        for sid in list(self._claims):
            s = self._sessions.get(sid)
            if s is None or s.state is not S.QUEUED:
                self._claims.discard(sid)
            else:
                waiting.append(s)
        return waiting

    def claimants(self, pool_name: str) -> frozenset[str]:
        """The queued sessions of the pool that preempted others: first in its queue."""
        if not self._claims:
            return frozenset()
        return frozenset(s.id for s in self._waiting_claimants() if s.pool == pool_name)

    def due(self, now: float) -> bool:
        return bool(self._due) and self._due[0][0] <= now

    def restore(self, s: Session) -> None:
        """A victim keeps naming the session it made room for until it has ended."""
        if s.preempted_for:
            self._claims.add(s.preempted_for)
        if s.preempt_at and s.state in HOLDING:
            self._preempting[s.id] = s.preempted_for
            heapq.heappush(self._due, (s.preempt_at, s.id))
