"""Users blocked from new GPU sessions, and the abuse detector's decisions that block them.

A block is a row of the front's store (shared by every front replica), read on each create:
an operator's (`provisioner admin user block`) or the detector's, with the reason and, for the
detector's, the evidence. It stays until an operator clears it. `decision` turns a detector's
verdict (provisioner/abuse.py) into the record kept for it; `apply` records it and blocks the
user, or, in a dry run, records it only. Pure but for `check`, `apply` and `Block.read`, which
take the store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from provisioner.abuse import Finding, Verdict
from provisioner.errors import PermissionDenied, quote
from provisioner.store import Store

DETECTOR = "detector"  # who blocked, when the abuse detector did (else the operator's identity)
MAX_REASON_CHARS = 512
MAX_EVIDENCE_CHARS = 4096  # a finding is at most ~600 characters, and there are four rules
MAX_DETAIL_CHARS = 256
MAX_NAME_CHARS = 64  # a process name or a connection


class UserBlocked(PermissionDenied):
    """The user may not start GPU sessions until an operator unblocks them."""

    reason = "USER_BLOCKED"


@dataclass(frozen=True, slots=True)
class Block:
    user_id: str
    blocked_at: float
    blocked_by: str  # an operator's identity, or DETECTOR
    reason: str
    evidence: str  # JSON text, at most MAX_EVIDENCE_CHARS ("" from an operator)

    @classmethod
    def read(cls, store: Store, user_id: str) -> Block | None:
        row = store.user_block(user_id)
        return cls(*row) if row else None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the front keeps of one flagged session."""

    session_id: str
    user_id: str
    at: float
    rules: tuple[str, ...]
    reason: str  # at most MAX_REASON_CHARS
    evidence: str  # JSON text, at most MAX_EVIDENCE_CHARS
    dry_run: bool


def check(store: Store, user_id: str) -> None:
    """Refuses a new session of a blocked user (one indexed read)."""
    if (block := Block.read(store, user_id)) is not None:
        # The user is told that and since when, not the evidence: a miner told which rule caught
        # it learns how to dodge it. Operators see it all (`admin user show`).
        who = "abuse detection" if block.blocked_by == DETECTOR else "an operator"
        raise UserBlocked(f"user {quote(user_id)} may not start GPU sessions: blocked by {who} since "
                          f"{_iso(block.blocked_at)}; an operator can lift the block", field="spec.user_id")


def decision(verdict: Verdict, session_id: str, user_id: str, at: float, dry_run: bool) -> Decision | None:
    """The record of a verdict on a session (None when it flags nothing): its rules, its reason
    and its findings as JSON, both cut to their bounds."""
    if not verdict.flagged:
        return None
    return Decision(session_id, user_id, at, tuple(f.rule for f in verdict.findings),
                    clip(verdict.reason, MAX_REASON_CHARS), evidence(verdict.findings), dry_run)


def evidence(findings: tuple[Finding, ...]) -> str:
    """The findings as JSON text, their free text cut so that it stays within MAX_EVIDENCE_CHARS
    (one finding per rule at most, each well under a quarter of it)."""
    return json.dumps({"findings": [_finding(f) for f in findings]}, sort_keys=True)


def _finding(f: Finding) -> dict:
    out = {"rule": f.rule, "detail": clip(f.detail, MAX_DETAIL_CHARS), "first_at": f.first_at,
           "last_at": f.last_at, "samples": f.samples}
    if f.process:
        out["process"] = clip(f.process, MAX_NAME_CHARS)
    if f.connection is not None:
        out["connection"] = clip(str(f.connection), MAX_NAME_CHARS)
    return out


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


async def apply(store: Store, d: Decision) -> bool:
    """Records the decision, and unless it is a dry run blocks its user (a block already there
    stands), in one durable write. Idempotent by session: whether the decision was new."""
    return await store.commit(store.record_abuse_decision, d.session_id, d.user_id, d.at, ",".join(d.rules),
                              d.reason, d.evidence, not d.dry_run, DETECTOR)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
