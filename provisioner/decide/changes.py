"""What the events being handled changed, gathered into their Step, and the records as the last
step left them: the core's read model. Pure.

A step carries frozen values (provisioner/model/records.py: FrozenSession, FrozenVm), one per record
changed, made once when the step is taken: the records to write (each once, however often it
changed, with its revision bumped at each change) and the queued sessions whose place alone moved.
Those same values are what the core's reads return until the record changes again, so nothing
outside the core ever holds a record the core will change.

A shell that reads each step's records at once and keeps none of them past the step (the replay
engine, provisioner/sim/replay.py) may ask for the records themselves (`live`): no value is made,
and what it reads is the same, since nothing changes a record between two steps.
"""

from __future__ import annotations

from provisioner.decide.commands import Command, Step
from provisioner.model.records import FrozenSession, FrozenVm, Session, Vm, frozen_session, frozen_vm


def _itself(record):
    return record


class Changes:
    def __init__(self, live: bool = False):
        # What a step publishes of each record changed: its frozen value, or the record (`live`).
        self._session_value = _itself if live else frozen_session
        self._vm_value = _itself if live else frozen_vm
        self._sessions: dict[str, Session] = {}
        self._vms: dict[str, Vm] = {}
        self._moved: dict[str, Session] = {}  # queued sessions whose place alone changed
        self._forgotten: list[str] = []  # sessions no longer kept in memory
        self._deleted: set[str] = set()  # VMs deleted: their last values go out with the step
        # The read model: each record's value as of the last step.
        self.sessions: dict[str, FrozenSession] = {}
        self.vms: dict[str, FrozenVm] = {}

    def session(self, s: Session) -> None:
        s.revision += 1
        self._sessions[s.id] = s

    def vm(self, vm: Vm) -> None:
        vm.revision += 1
        self._vms[vm.id] = vm

    def moved(self, s: Session) -> None:
        """Its place in the queue moved: told to watchers, not written (a live value)."""
        self._moved[s.id] = s

    def forgot(self, session_id: str) -> None:
        self._forgotten.append(session_id)

    def deleted(self, vm: Vm) -> None:
        self.vm(vm)
        self._deleted.add(vm.id)

    def restored(self, sessions: list[Session], vms: list[Vm]) -> None:
        """Records taken from the store: read as they are, not written again."""
        for s in sessions:
            self.sessions[s.id] = self._session_value(s)
        for vm in vms:
            self.vms[vm.id] = self._vm_value(vm)

    def step(self, commands: list[Command], reply: object) -> Step:
        """The step of the events handled since the last one, with what they changed as values;
        the reads then see those values, and what changed is forgotten."""
        if not (self._sessions or self._vms or self._moved or self._forgotten):  # most ticks change nothing
            return Step(commands, [], [], reply if reply is None else self._value_of(reply), [])
        sessions = self._publish_sessions() if self._sessions else []
        vms = self._publish_vms() if self._vms else []
        moved = []
        if self._moved:
            published, value_of = self.sessions, self._session_value
            for sid, s in self._moved.items():
                if sid not in self._sessions:
                    value = published[sid] = value_of(s)
                    moved.append(value)
            self._moved = {}
        if self._forgotten:
            for sid in self._forgotten:
                self.sessions.pop(sid, None)
            self._forgotten.clear()
        if self._sessions:
            self._sessions = {}
        if self._vms:
            self._vms = {}
        return Step(commands, sessions, vms, reply if reply is None else self._value_of(reply), moved)

    def _publish_sessions(self) -> list[FrozenSession]:
        values, published, value_of = [], self.sessions, self._session_value
        for sid, s in self._sessions.items():
            value = published[sid] = value_of(s)
            values.append(value)
        return values

    def _publish_vms(self) -> list[FrozenVm]:
        values, published, value_of = [], self.vms, self._vm_value
        for vid, vm in self._vms.items():
            value = published[vid] = value_of(vm)
            values.append(value)
        if self._deleted:  # their last values go out with the step, and leave the reads
            for vid in self._deleted:
                published.pop(vid, None)
            self._deleted = set()
        return values

    def _value_of(self, reply: object) -> object:
        """A reply naming a record is its value as of this step."""
        if isinstance(reply, Session):
            return self.sessions.get(reply.id) or self._session_value(reply)
        if isinstance(reply, Vm):
            return self.vms.get(reply.id) or self._vm_value(reply)
        return reply
