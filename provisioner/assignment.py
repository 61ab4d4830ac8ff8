"""Which VM a session gets, and in what order queued sessions are served. Pure functions.

Preference: a warm VM that holds the exact image (running at once), else the warm VM missing the
fewest bytes (a partial pull), else a new VM (cold). Ties go to the lowest VM id, so the same
inputs always give the same answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from provisioner.images import ImageCatalog
from provisioner.model import Session, SessionKind, StartKind, Vm


@dataclass(frozen=True, slots=True)
class Choice:
    start: StartKind
    vm_id: str = ""  # empty for a cold start
    missing_bytes: int = 0


def choose_vm(image: str, warm: Iterable[Vm], catalog: ImageCatalog) -> Choice:
    """Picks among idle warm VMs for `image`; returns a cold choice when none is given."""
    best: tuple[int, str] | None = None
    for vm in warm:
        missing = catalog.missing_bytes(image, vm.cache.layer_ids)
        key = (missing, vm.id)
        if best is None or key < best:
            best = key
    if best is None:
        return Choice(StartKind.COLD)
    missing, vm_id = best
    return Choice(StartKind.WARM if missing == 0 else StartKind.PARTIAL, vm_id, missing)


def queue_order(queued: Sequence[Session]) -> list[Session]:
    """Interactive before batch; then fairness (each user's k-th request waits behind every
    user's (k-1)-th); then age."""
    per_user: dict[tuple[SessionKind, str], list[Session]] = defaultdict(list)
    for s in queued:
        per_user[(s.spec.kind, s.spec.user_id)].append(s)
    keyed = []
    for group in per_user.values():
        group.sort(key=lambda s: (s.created_at, s.id))
        for rank, s in enumerate(group):
            klass = 0 if s.spec.kind is SessionKind.INTERACTIVE else 1
            keyed.append(((klass, rank, s.created_at, s.id), s))
    keyed.sort(key=lambda kv: kv[0])
    return [s for _, s in keyed]
