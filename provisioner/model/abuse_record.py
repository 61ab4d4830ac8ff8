"""The decision record of a flagged session (provisioner/rules/abuse.py judges, this keeps).

The cluster core makes it when a session is flagged and keeps it on the session's record; the
capacity stream carries it to every front, which records it and blocks the user
(provisioner/front/blocks.py). Pure: no clock, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from provisioner.agent.usage import Connection

Rule = Literal["miner_program", "pool_connection", "busy_without_activity", "unknown_gpu_program"]
MAX_REASON_CHARS = 512
MAX_EVIDENCE_CHARS = 4096  # a finding is at most ~600 characters, and there are four rules
MAX_DETAIL_CHARS = 256
MAX_NAME_CHARS = 64  # a process name or a connection


@dataclass(frozen=True, slots=True)
class Finding:
    rule: Rule
    detail: str
    first_at: float  # the reports that show it: from, to, how many
    last_at: float
    samples: int
    process: str = ""
    connection: Connection | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    findings: tuple[Finding, ...] = ()  # every rule that fired, in the order of the module's doc

    @property
    def flagged(self) -> bool:
        return bool(self.findings)

    @property
    def rule(self) -> str:
        """The first rule that fired ("" when the session is fine)."""
        return self.findings[0].rule if self.findings else ""

    @property
    def reason(self) -> str:
        return "; ".join(f"{f.rule}: {f.detail}" for f in self.findings)



@dataclass(frozen=True, slots=True)
class Decision:
    """What is kept of one flagged session."""

    session_id: str
    user_id: str
    at: float
    rules: tuple[str, ...]
    reason: str  # at most MAX_REASON_CHARS
    evidence: str  # JSON text, at most MAX_EVIDENCE_CHARS
    dry_run: bool

    def to_list(self) -> list:
        return [self.session_id, self.user_id, self.at, list(self.rules), self.reason, self.evidence, self.dry_run]

    @classmethod
    def from_list(cls, v: list) -> Decision:
        session_id, user_id, at, rules, reason, evidence, dry_run = v
        return cls(session_id, user_id, at, tuple(rules), reason, evidence, dry_run)


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
