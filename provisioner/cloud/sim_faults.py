"""Faults injected into the simulated cloud by tests and demos: the next calls of an operation
(in a zone, if given) fail with a code, as a real cloud's would.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.cloud.base import CloudFailure
from provisioner.model.errors import InvalidArgument, NoCapacity, NotFound, ProvisionerError, QuotaExceeded, Unavailable

OPS = frozenset({"create", "wait_ready", "pull", "wipe", "stop", "start", "delete", "list_vms", "start_notebook",
                 "stop_notebook"})
CODES = frozenset({"stockout", "quota", "rate_limited", "unavailable", "not_found", "invalid", "internal"})


@dataclass(slots=True)
class _Fault:
    code: str
    remaining: int
    zone: str | None


# list_vms returns a list, not a failure, so its injected faults are raised as typed errors.
RAISE_AS: dict[str, type[ProvisionerError]] = {
    "stockout": NoCapacity,
    "quota": QuotaExceeded,
    "rate_limited": Unavailable,
    "unavailable": Unavailable,
    "not_found": NotFound,
    "invalid": InvalidArgument,
    "internal": ProvisionerError,
}


class Faults:
    """Pending injected faults, by operation: each is taken by the calls it applies to."""

    def __init__(self):
        self._pending: dict[str, list[_Fault]] = {}

    def inject(self, op: str, code: str, count: int = 1, zone: str | None = None) -> None:
        """The next `count` calls of `op` (in `zone`, if given) fail with `code`."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; one of {sorted(OPS)}")
        if code not in CODES:
            raise ValueError(f"unknown failure code {code!r}; one of {sorted(CODES)}")
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._pending.setdefault(op, []).append(_Fault(code, count, zone))

    def take(self, op: str, zone: str) -> CloudFailure | None:
        """The failure of this call of `op` in `zone`, if a fault is pending for it."""
        if not self._pending:
            return None
        pending = self._pending.get(op)
        if not pending:
            return None
        for i, f in enumerate(pending):
            if f.zone is None or f.zone == zone:
                f.remaining -= 1
                if f.remaining <= 0:
                    del pending[i]
                    if not pending:
                        del self._pending[op]
                return CloudFailure(f.code, f"injected {f.code} fault on {op}", zone)  # type: ignore[arg-type]
        return None
