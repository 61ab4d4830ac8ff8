"""The cluster core's notebook steps: once a session's VM holds its image, the session's notebook
container is started on it, and the session runs only when that container's endpoint answers;
a stop ends the container before the VM is wiped. Pure.

It owns no records: it issues the notebook commands and, on their answers, asks the session side
(decide/sessions.py) to move the session on and the VM side (decide/vms.py) to release the VM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from provisioner.cloud.base import CloudFailure
from provisioner.decide.commands import StartNotebook, StopNotebook
from provisioner.decide.in_flight import InFlight
from provisioner.model.images import ImageCatalog
from provisioner.model.records import Session, StartKind, Vm
from provisioner.model.states import SessionState, VmState

if TYPE_CHECKING:
    from provisioner.decide.sessions import Sessions
    from provisioner.decide.vms import Vms

S, V = SessionState, VmState
_HOW = {StartKind.WARM: "a warm VM that held the image", StartKind.PARTIAL: "a warm VM that pulled the layers it "
        "lacked", StartKind.COLD: "a new VM"}


class Notebooks:
    """The sessions' notebook containers: started, answered, stopped."""

    def __init__(self, start_s: float, catalog: Callable[[], ImageCatalog], in_flight: InFlight):
        self._start_s = start_s  # a notebook's start, its estimate
        self._catalog = catalog
        self._in_flight = in_flight

    def connect(self, sessions: Sessions, vms: Vms) -> None:
        self._session_side, self._sessions = sessions, sessions.sessions  # the records read only
        self._vm_side, self._vms = vms, vms.vms

    def start(self, s: Session, vm: Vm, now: float) -> None:
        """The VM holds the session's image: its notebook starts."""
        how = _HOW[s.start or StartKind.COLD]
        # The VM's id in parentheses, not run into the sentence ("... the image vm-3f2a").
        self._session_side.starting(s, now + self._start_s, f"starting its notebook on {how} (VM {vm.id})", now)
        self._issue_start(s, vm, now)

    def _issue_start(self, s: Session, vm: Vm, now: float) -> None:
        self._in_flight.issue(StartNotebook, now, vm.id, vm.zone, s.id, s.spec.user_id, s.image, s.image_digest,
                              self._catalog().repository)

    def started(self, cmd: StartNotebook, endpoint: str, now: float) -> None:
        s = self._sessions.get(cmd.session_id)
        if s is None or s.state is not S.STARTING or s.vm_id != cmd.vm_id:
            return  # stopped or ended meanwhile: the stop or the wipe ends the container
        vm = self._vms[cmd.vm_id]
        self._session_side.running(s, endpoint or vm.endpoint,
                                   f"running on {_HOW[s.start or StartKind.COLD]} (VM {vm.id})", now)

    def start_failed(self, cmd: StartNotebook, failure: CloudFailure, now: float) -> None:
        """The session fails with the runtime's reason; its VM is wiped (or deleted) as after any session."""
        s = self._sessions.get(cmd.session_id)
        if s is None or s.state is not S.STARTING or s.vm_id != cmd.vm_id:
            return
        self._session_side.end(s, S.FAILED, f"the notebook did not start: {failure.message}", now)
        vm = self._vms[cmd.vm_id]
        if vm.state is V.ASSIGNED and vm.session_id == s.id:
            self._vm_side.release(vm, now)

    def stop(self, s: Session, vm: Vm, now: float) -> None:
        """A stopping session's notebook ends first; its VM is released when it has."""
        self._in_flight.issue(StopNotebook, now, vm.id, vm.zone, s.id)

    def stopped(self, cmd: StopNotebook, now: float) -> None:
        """Done or failed alike: the wipe after it ends whatever is left of the container."""
        vm = self._vms[cmd.vm_id]
        if vm.state is V.ASSIGNED and vm.session_id == cmd.session_id:
            self._vm_side.release(vm, now)

    def reissue(self, vm: Vm, now: float) -> bool:
        """After a restart: the notebook step an assigned VM's session was in, again (a start is
        idempotent by session id). False when there was none."""
        s = self._sessions.get(vm.session_id)
        if vm.state is not V.ASSIGNED or s is None:
            return False
        if s.state is S.STARTING:
            self._issue_start(s, vm, now)
        elif s.state is S.STOPPING:
            self.stop(s, vm, now)
        else:
            return False
        return True
