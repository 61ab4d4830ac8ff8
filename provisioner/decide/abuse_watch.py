"""The cluster core's part in abuse detection: keep each running session's recent usage reports and
touches, judge them at each new report (provisioner/rules/abuse.py), and act on a flag.

The agent's usage comes with its VM's health (`HealthReported`). What the rules still need of a
session is kept in memory only, bounded by time (the longest window plus the gap that breaks a
run) and by count: after a restart a session's history starts again. A flagged session keeps its
decision record (provisioner/model/abuse_record.py), durable with the session, and is judged no more;
unless `abuse.dry_run` it is stopped. The fronts learn of it from the capacity stream.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

from provisioner.rules.abuse import Sample, judge
from provisioner.model.abuse_record import Decision, decision
from provisioner.agent.usage import Usage
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V
from provisioner.config.policy import AbuseConfig
from provisioner.model.records import Session, Vm

# Reports kept per session: the longest default window (an hour) at one report a minute is 61; an
# agent reporting far more often has the oldest cut, which can only make a run shorter.
MAX_SAMPLES = 256


@dataclass(slots=True)
class Watched:
    """One running session's recent reports, and its touches since the first of them. Touches
    with no report between them break a run at the same place, so only the last is kept: there
    are never more touches than reports."""

    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    touches: deque[float] = field(default_factory=deque)

    def touched(self, now: float) -> None:
        if self.touches and self.touches[-1] > self.samples[-1].at:
            self.touches[-1] = now
        else:
            self.touches.append(now)

    def forget_before(self, since: float) -> None:
        samples, touches = self.samples, self.touches
        while samples[0].at < since:
            samples.popleft()
        # A touch at or before the first report breaks no run.
        while touches and touches[0] <= samples[0].at:
            touches.popleft()


class AbuseWatch:
    """What the rules still need of each running session, judged at each of its usage reports."""

    def __init__(self, config: AbuseConfig, sessions: Mapping[str, Session], vms: Mapping[str, Vm],
                 note: Callable[..., None], stop: Callable[[str, str, float], object]):
        self.config = config
        self._sessions, self._vms = sessions, vms  # the core's, read only
        self._note = note  # marks a session: its decision record (decide/sessions.py: Sessions.note)
        self._stop = stop  # stops a session (id, reason, now) as a user's stop does
        self._watched: dict[str, Watched] = {}  # running session id -> what abuse detection still needs

    def reported(self, vm_id: str, usage: Usage | None, now: float) -> None:
        vm = self._vms.get(vm_id)
        if usage is None or vm is None or vm.state is not V.ASSIGNED:
            return
        s = self._sessions.get(vm.session_id)
        if s is None or s.state is not S.RUNNING or s.abuse is not None:
            return
        w = self._watched.get(s.id)
        if w is None:
            w = self._watched[s.id] = Watched()
        w.samples.append(Sample(now, usage))
        w.forget_before(now - self.horizon_s())
        verdict = judge(w.samples, w.touches, s.spec.kind.value, self.config)
        if verdict.flagged:
            self._flag(s, decision(verdict, s.id, s.spec.user_id, now, self.config.dry_run), now)

    def touched(self, s: Session, now: float) -> None:
        # A touch before the session's first report breaks no run: nothing to keep.
        if (w := self._watched.get(s.id)) is not None:
            w.touched(now)

    def left_running(self, session_id: str) -> None:
        """The session no longer runs: nothing of it is judged any more."""
        self._watched.pop(session_id, None)

    def watching(self, session_id: str) -> Watched | None:
        return self._watched.get(session_id)

    def horizon_s(self) -> float:
        cfg = self.config
        return max(cfg.idle_busy_window_s, cfg.batch_busy_window_s, cfg.pool_connection_min_s) + cfg.max_sample_gap_s

    def _flag(self, s: Session, record: Decision, now: float) -> None:
        del self._watched[s.id]
        self._note(s, abuse=record)
        if not record.dry_run:
            self._stop(s.id, f"stopped for abuse: {', '.join(record.rules)}", now)
