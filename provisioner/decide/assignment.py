"""Which VM a session gets, and in what order queued sessions are served. Pure functions.

Preference: a warm VM that holds the exact image (running at once), else the warm VM missing the
fewest bytes (a partial pull) unless the standby VM missing the fewest bytes is ready sooner
(started, its disk kept: `standby_sooner`), else that standby VM (with a second one holding the
image started beside it: `hedge_worth`), else a new VM (cold). Candidates come most preferred first and
ties go to the earlier one, so the same inputs always give the same answer. (The core offers the
most recently warmed VMs first: the longest idle then stay idle and are the ones scale-down
takes.)
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Mapping, Sequence

from provisioner.model.images import ImageCatalog
from provisioner.model.records import Session, SessionKind, StartKind, Vm

# Sessions a change of the queue moves one by one before sorting the whole queue costs less.
MOVES_BEFORE_SORT = 64


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


def standby_sooner(warm_missing: int | None, standby_missing: int, start_s: float, bandwidth: float) -> bool:
    """Whether a standby VM missing `standby_missing` bytes of an image, started (`start_s`, its
    median), serves a session sooner than the warm VM missing `warm_missing` bytes of it (None: no
    warm VM is free). A warm VM still filling its disk may lack minutes of pulls where a stopped
    VM kept the whole image."""
    return warm_missing is None or start_s + standby_missing / bandwidth < warm_missing / bandwidth


def hedge_worth(image: str, vm: Vm, catalog: ImageCatalog) -> bool:
    """Whether a second standby VM is started beside the one started for a session, the first of
    the two up serving it (the other joins the pool): one holding the session's whole image. A
    start's tail is long (lognormal, sigma 0.6: a third of starts take over 4/3 of the median, a
    tenth of the first of two do), and a pool that had no warm VM free wants more anyway."""
    return not catalog.missing_bytes(image, vm.cache.layer_ids)


def choose_waiting(vm: Vm, waiting: Iterable[Session], catalog: ImageCatalog, bandwidth_bytes_per_s: float,
                   now: float) -> Session | None:
    """Of the sessions waiting for a VM being made or started for them, the one `vm`, just come
    free, should serve: one whose image it holds (ready now, where the awaited VM is not: a
    standby start's long tail, a create's many minutes), else one whose missing layers it pulls
    before the awaited VM's estimated ready time; the longest waiting first, then by id. None
    when none is ready sooner on it."""
    best: tuple[bool, float, str, Session] | None = None
    for s in waiting:
        missing = catalog.missing_bytes(s.image, vm.cache.layer_ids)
        if missing and now + missing / bandwidth_bytes_per_s >= s.estimated_ready_at:
            continue
        key = (missing > 0, s.created_at, s.id, s)
        if best is None or key[:3] < best[:3]:
            best = key
    return best[3] if best else None


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
    """`queue_order` of one pool's queue, kept change by change instead of sorted again for each:
    a burst queued behind a full pool, then served or stopped one at a time, would otherwise sort
    the whole queue at every step. A session queued is inserted in its place, one leaving is taken
    out, and when what a user holds changes (`shift`) that user's queued sessions move as many
    turns; in each case only the sessions whose turn changed move. A change of the sessions first
    in line, `stale` (a restore), a change that would move more than a quarter of the queue, or
    more moves since the last sort than the queue is long (a burst leaving together) sorts it
    again at the next read. `take_changed` tells the first index changed since it was last asked
    (the queue positions to renumber)."""

    def __init__(self) -> None:
        self._keys: list[tuple] | None = None  # sorted; None: sort the queue at the next read
        self._sessions: list[Session] = []  # in the order of _keys
        self._key_of: dict[str, tuple] = {}  # session id -> its key in _keys
        self._groups: dict[str, dict[int, list[tuple[float, str]]]] = {}  # user -> rank -> queued, by age
        self._first: frozenset[str] = frozenset()
        self._changed = 0
        self._moves = 0  # sessions moved since the last sort

    def stale(self) -> None:
        self._keys = None

    def take_changed(self) -> int:
        """The first index whose session changed since the last call (the whole queue after a sort)."""
        changed, self._changed = self._changed, len(self._sessions) if self._keys is not None else 0
        return changed

    def order(self, queued: Callable[[], Sequence[Session]], holding: Mapping[str, int],
              ranks: Mapping[str, int] | None, first: frozenset[str]) -> list[Session]:
        """The queue in order; `queued()` gives its sessions when it must be sorted again."""
        if not self._kept(first):
            keyed = _keyed(queued(), holding, ranks, first)
            self._keys, self._sessions = [k for k, _ in keyed], [s for _, s in keyed]
            self._key_of = {k[-1]: k for k in self._keys}
            self._first, self._groups, self._changed, self._moves = first, {}, 0, 0
            for (_, neg_rank, _, created_at, sid), s in keyed:  # by age within each group
                self._groups.setdefault(s.spec.user_id, {}).setdefault(-neg_rank, []).append((created_at, sid))
            for by_rank in self._groups.values():
                for group in by_rank.values():
                    group.sort()
        return self._sessions

    def add(self, s: Session, holding: Mapping[str, int], ranks: Mapping[str, int] | None,
            first: frozenset[str]) -> None:
        """Takes `s`, just queued, into the order kept; the group's later sessions come one turn later."""
        if not self._kept(first):
            return
        rank = _rank(s, ranks)
        group = self._groups.setdefault(s.spec.user_id, {}).setdefault(rank, [])
        age = (s.created_at, s.id)
        nth = bisect.bisect(group, age)
        if not self._move(group[nth:], 1):
            return
        group.insert(nth, age)
        self._put((s.id not in first, -rank, holding.get(s.spec.user_id, 0) + nth, *age), s)

    def remove(self, s: Session, first: frozenset[str]) -> None:
        """Takes `s` out of the order kept; the group's later sessions come one turn sooner."""
        if not self._kept(first):
            return
        key = self._key_of[s.id]
        by_rank = self._groups[s.spec.user_id]
        group = by_rank[-key[1]]
        nth = bisect.bisect_left(group, key[3:])
        self._take(s.id)
        del group[nth]
        if self._move(group[nth:], -1) and not group:
            del by_rank[-key[1]]
            if not by_rank:
                del self._groups[s.spec.user_id]

    def shift(self, user: str, turns: int) -> None:
        """What `user` holds changed by `turns`: each of the user's queued sessions moves as many."""
        if self._keys is not None:
            self._move([age for group in self._groups.get(user, {}).values() for age in group], turns)

    def _kept(self, first: frozenset[str]) -> bool:
        """Whether the order kept still stands for these sessions first in line; if not, it is
        dropped (the next read sorts)."""
        if self._keys is None or first != self._first:
            self._keys = None
            return False
        return True

    def _move(self, ages: list[tuple[float, str]], turns: int) -> bool:
        """Moves these sessions `turns` turns; False (the order to be sorted again) when they, or
        the moves since the last sort, are so many that sorting costs less."""
        self._moves += len(ages)
        if len(ages) > max(MOVES_BEFORE_SORT, len(self._sessions) // 4) \
                or self._moves > MOVES_BEFORE_SORT + len(self._sessions):
            self._keys = None
            return False
        for _, sid in ages:
            first_in_line, neg_rank, turn, created_at, _ = self._key_of[sid]
            self._put((first_in_line, neg_rank, turn + turns, created_at, sid), self._take(sid))
        return True

    def _take(self, sid: str) -> Session:
        i = bisect.bisect_left(self._keys, self._key_of.pop(sid))
        del self._keys[i]
        self._changed = min(self._changed, i)
        return self._sessions.pop(i)

    def _put(self, key: tuple, s: Session) -> None:
        i = bisect.bisect(self._keys, key)
        self._keys.insert(i, key)
        self._sessions.insert(i, s)
        self._key_of[key[-1]] = key
        self._changed = min(self._changed, i)
