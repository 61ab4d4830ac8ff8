"""Who holds a pool's VMs, kept as sessions change state: per pool, how many VMs each user's
sessions hold or have coming (a stopping session's until it is wiped), and which sessions of
preemptible classes hold one. The queue's fairness reads the first, a preemption the second:
neither walks the pool. Pure.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from provisioner.config.policy import PriorityConfig
from provisioner.decide.autoscale import queued_demand
from provisioner.decide.pools import PoolState
from provisioner.model.states import SessionState as S
from provisioner.model.records import Session

# Sessions that hold (or have coming) a VM of their pool, so its GPUs.
HOLDING = frozenset({S.PROVISIONING, S.PULLING_IMAGE, S.STARTING, S.RUNNING})
# And those whose VM is still theirs: a stopping session's until it is wiped.
OCCUPYING = HOLDING | {S.STOPPING}
_NONE: Mapping = {}


class Holdings:
    def __init__(self, pools: Mapping[str, PoolState], sessions: Mapping[str, Session], priority: PriorityConfig):
        self._pools = pools  # the core's: a user's queued sessions move in their pool's order
        self._sessions = sessions  # the core's, read only
        self._priority = priority
        self._held: dict[str, dict[str, int]] = {}  # pool -> user -> sessions holding (or getting) a VM there
        self._borrowable: dict[str, dict[str, None]] = {}  # pool -> those sessions of preemptible classes

    def of_pool(self, pool: str) -> Mapping[str, int]:
        """User -> the pool's VMs their sessions hold or have coming."""
        return self._held.get(pool, _NONE)

    def at_ceiling(self, pool: PoolState, s: Session) -> bool:
        """The session's user holds the pool's per-user ceiling of VMs: it waits for one of them."""
        ceiling = pool.policy.max_vms_per_user
        return bool(ceiling) and self.of_pool(pool.config.name).get(s.spec.user_id, 0) >= ceiling

    def queued_demand(self, pool: PoolState) -> int:
        """The queued sessions the autoscaler grows the pool for: with a per-user ceiling, a user's
        count only up to the ceiling less the VMs the user holds."""
        ceiling = pool.policy.max_vms_per_user
        if not ceiling or not pool.queue:
            return len(pool.queue)
        queued: dict[str, int] = defaultdict(int)
        for sid in pool.queue:
            queued[self._sessions[sid].spec.user_id] += 1
        return queued_demand(queued, self.of_pool(pool.config.name), ceiling)

    def borrowable(self, pool: str) -> Mapping[str, None]:
        """The pool's sessions of preemptible classes that hold a VM, by id, oldest first."""
        return self._borrowable.get(pool, _NONE)

    def change(self, s: Session, state: S | None) -> None:
        """`s` goes to `state` (None: it is restored as it is)."""
        new = state if state is not None else s.state
        old = s.state if state is not None else None
        if (old in OCCUPYING) != (new in OCCUPYING):
            held = self._held.setdefault(s.pool, {})
            held[s.spec.user_id] = held.get(s.spec.user_id, 0) + (1 if new in OCCUPYING else -1)
            if not held[s.spec.user_id]:
                del held[s.spec.user_id]
            if pool := self._pools.get(s.pool):
                pool.order.shift(s.spec.user_id, 1 if new in OCCUPYING else -1)  # the user's queued sessions move
        if (old in HOLDING) != (new in HOLDING):
            klass = self._priority.classes.get(s.priority_class)
            if klass is not None and klass.preemptible:
                borrowable = self._borrowable.setdefault(s.pool, {})
                if new in HOLDING:
                    borrowable[s.id] = None
                else:
                    del borrowable[s.id]
            # A preempted session that stops here is preempted no more: decide/sessions.py clears it.
