"""Which VM a session gets, and in what order queued sessions are served. Pure functions.

Preference: a warm VM that holds the exact image (running at once), else the warm VM missing the
fewest bytes (a partial pull), else the standby VM missing the fewest bytes (started, its disk
kept), else a new VM (cold). Candidates come most preferred first and
ties go to the earlier one, so the same inputs always give the same answer. (The core offers the
most recently warmed VMs first: the longest idle then stay idle and are the ones scale-down
takes.)
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Mapping, Sequence

from provisioner.decide.images import ImageCatalog
from provisioner.model import Session, SessionKind, StartKind, Vm


@dataclass(frozen=True, slots=True)
class Choice:
    start: StartKind
    vm_id: str = ""  # empty for a cold start
    missing_bytes: int = 0


def choose_vm(image: str, warm: Iterable[Vm], catalog: ImageCatalog) -> Choice:
    """Picks among idle warm VMs for `image`; returns a cold choice when none is given.

    Stops at the first VM holding the exact image: with most VMs holding most recent images,
    that is usually the first one looked at."""
    best: tuple[int, str] | None = None
    for vm in warm:
        missing = catalog.missing_bytes(image, vm.cache.layer_ids)
        if missing == 0:
            return Choice(StartKind.WARM, vm.id, 0)
        if best is None or missing < best[0]:
            best = (missing, vm.id)
    if best is None:
        return Choice(StartKind.COLD)
    missing, vm_id = best
    return Choice(StartKind.WARM if missing == 0 else StartKind.PARTIAL, vm_id, missing)


def choose_standby(image: str, standby: Iterable[Vm], catalog: ImageCatalog,
                   usable: Callable[[Vm], bool]) -> Vm | None:
    """The usable standby VM missing the fewest bytes of `image` (its disk kept its layers while
    stopped); ties go to the earlier one. None when there is none."""
    best: tuple[int, Vm] | None = None
    for vm in standby:
        if not usable(vm):
            continue
        missing = catalog.missing_bytes(image, vm.cache.layer_ids)
        if best is None or missing < best[0]:
            best = (missing, vm)
            if missing == 0:
                break
    return best[1] if best else None


def queue_order(queued: Sequence[Session], holding: Mapping[str, int] | None = None,
                ranks: Mapping[str, int] | None = None, first: Collection[str] = ()) -> list[Session]:
    """The sessions in `first` (those that preempted others, whose VMs are on their way), then
    the highest priority class (`ranks`: class -> rank; without it interactive before batch);
    then fairness; then age.

    Fairness: a user's k-th VM (counting the VMs the user already holds in the pool, from
    `holding`) waits behind every other user's (k-1)-th, so one user with many requests
    cannot starve the others, even as the queue's head is served.
    """
    return [s for _, s in _keyed(queued, holding or {}, ranks, first)]


def _rank(s: Session, ranks: Mapping[str, int] | None) -> int:
    if ranks is not None and s.priority_class in ranks:
        return ranks[s.priority_class]
    return 1 if s.spec.kind is SessionKind.INTERACTIVE else 0


def _keyed(queued: Sequence[Session], holding: Mapping[str, int], ranks: Mapping[str, int] | None,
           first: Collection[str]) -> list[tuple[tuple, Session]]:
    per_user: dict[tuple[int, str], list[Session]] = defaultdict(list)
    for s in queued:
        per_user[(_rank(s, ranks), s.spec.user_id)].append(s)
    keyed = []
    for (rank, user), group in per_user.items():
        group.sort(key=lambda s: (s.created_at, s.id))
        for nth, s in enumerate(group, start=holding.get(user, 0)):
            keyed.append(((s.id not in first, -rank, nth, s.created_at, s.id), s))
    keyed.sort(key=lambda kv: kv[0])
    return keyed


class QueueOrder:
    """`queue_order` of one pool's queue, kept from one change to the next instead of sorted
    again for each: a burst of requests queued behind a full pool would otherwise sort the whole
    queue once per request. A session queued is inserted in its place (and the later sessions
    of its user and class, whose turn it pushes back, moved); any other change (`stale`: a
    session left the queue, what a user holds changed) makes the next read sort the queue again.
    The holder calls `stale`."""

    def __init__(self) -> None:
        self._sessions: list[Session] | None = None
        self._keys: list[tuple] = []
        self._first: frozenset[str] = frozenset()
        self._groups: dict[tuple[int, str], list[tuple[float, str]]] = {}  # (rank, user) -> queued, by age

    def stale(self) -> None:
        self._sessions = None

    def order(self, queued: Callable[[], Sequence[Session]], holding: Mapping[str, int],
              ranks: Mapping[str, int] | None, first: frozenset[str]) -> list[Session]:
        """The queue in order; `queued()` gives its sessions when it must be sorted again."""
        if self._sessions is None or first != self._first:
            keyed = _keyed(queued(), holding, ranks, first)
            self._keys, self._sessions = [k for k, _ in keyed], [s for _, s in keyed]
            self._first, self._groups = first, {}
            for (_, neg_rank, _, created_at, sid), s in keyed:  # by age within each group
                self._groups.setdefault((-neg_rank, s.spec.user_id), []).append((created_at, sid))
            for group in self._groups.values():
                group.sort()
        return self._sessions

    def add(self, s: Session, holding: Mapping[str, int], ranks: Mapping[str, int] | None,
            first: frozenset[str]) -> int | None:
        """Takes `s`, just queued, into the order kept; the first index whose session changed, or
        None when there is no order kept (the next `order` sorts the queue, `s` included)."""
        if self._sessions is None or first != self._first:
            self._sessions = None
            return None
        rank = _rank(s, ranks)
        group = self._groups.setdefault((rank, s.spec.user_id), [])
        age = (s.created_at, s.id)
        nth = bisect.bisect(group, age)
        base = holding.get(s.spec.user_id, 0)
        # The group's later sessions come one turn later: out, then in again with their new turn.
        changed, by_id = len(self._keys), {s.id: s}
        for k, (created_at, sid) in enumerate(group[nth:], start=nth):
            key = (sid not in first, -rank, base + k, created_at, sid)
            i = bisect.bisect_left(self._keys, key)
            del self._keys[i]
            by_id[sid] = self._sessions.pop(i)
            changed = min(changed, i)
        group.insert(nth, age)
        for k, (created_at, sid) in enumerate(group[nth:], start=nth):
            key = (sid not in first, -rank, base + k, created_at, sid)
            i = bisect.bisect(self._keys, key)
            self._keys.insert(i, key)
            self._sessions.insert(i, by_id[sid])
            changed = min(changed, i)
        return changed
