"""Which VM a session gets, and in what order queued sessions are served. Pure functions.

Preference: a warm VM that holds the exact image (running at once), else the warm VM missing the
fewest bytes (a partial pull), else the standby VM missing the fewest bytes (started, its disk
kept), else a new VM (cold). Candidates come most preferred first and
ties go to the earlier one, so the same inputs always give the same answer. (The core offers the
most recently warmed VMs first: the longest idle then stay idle and are the ones scale-down
takes.)
"""

from __future__ import annotations

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
    holding = holding or {}
    per_user: dict[tuple[int, str], list[Session]] = defaultdict(list)
    for s in queued:
        if ranks is not None and s.priority_class in ranks:
            rank = ranks[s.priority_class]
        else:
            rank = 1 if s.spec.kind is SessionKind.INTERACTIVE else 0
        per_user[(rank, s.spec.user_id)].append(s)
    keyed = []
    for (rank, user), group in per_user.items():
        group.sort(key=lambda s: (s.created_at, s.id))
        for nth, s in enumerate(group, start=holding.get(user, 0)):
            keyed.append(((s.id not in first, -rank, nth, s.created_at, s.id), s))
    keyed.sort(key=lambda kv: kv[0])
    return [s for _, s in keyed]
