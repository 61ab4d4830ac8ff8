"""What the events being handled changed, gathered into their Step: the records to write (each
once, however often it changed, with its revision bumped at each change) and the queued sessions
whose place alone moved. Pure.
"""

from __future__ import annotations

from provisioner.decide.commands import Command, Step
from provisioner.model.records import Session, Vm


class Changes:
    def __init__(self):
        self._sessions: dict[str, Session] = {}
        self._vms: dict[str, Vm] = {}
        self._moved: dict[str, Session] = {}  # queued sessions whose place alone changed

    def session(self, s: Session) -> None:
        s.revision += 1
        self._sessions[s.id] = s

    def vm(self, vm: Vm) -> None:
        vm.revision += 1
        self._vms[vm.id] = vm

    def moved(self, s: Session) -> None:
        """Its place in the queue moved: told to watchers, not written (a live value)."""
        self._moved[s.id] = s

    def step(self, commands: list[Command], reply: object) -> Step:
        """The step of the events handled since the last one; what they changed is then forgotten."""
        sessions, vms, moved = self._sessions, self._vms, self._moved
        step = Step(commands, list(sessions.values()) if sessions else [], list(vms.values()) if vms else [], reply,
                    [s for sid, s in moved.items() if sid not in sessions] if moved else [])
        if moved:
            self._moved = {}
        if sessions:
            self._sessions = {}
        if vms:
            self._vms = {}
        return step
