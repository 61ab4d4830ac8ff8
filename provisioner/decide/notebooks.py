"""The cluster core's notebook step: once a session's VM holds its image, the session's notebook
container is started on it, and the session runs only when that container's endpoint answers;
a stop ends the container before the VM is wiped.

Part of ClusterCore (provisioner/decide/core.py), split out by concern; pure like the rest.
"""

from __future__ import annotations

from provisioner.cloud.base import CloudFailure
from provisioner.decide.commands import StartNotebook, StopNotebook
from provisioner.model.states import SessionState, VmState
from provisioner.model.records import Session, StartKind, Vm

S, V = SessionState, VmState
_HOW = {StartKind.WARM: "a warm VM that held the image", StartKind.PARTIAL: "a warm VM that pulled the layers it "
        "lacked", StartKind.COLD: "a new VM"}


class NotebookSteps:
    """ClusterCore's notebook side."""

    def _start_notebook(self, s: Session, vm: Vm, now: float) -> None:
        """The VM holds the session's image: its notebook starts."""
        self._failed_tries.pop(s.id, None)
        s.estimated_ready_at = now + self.config.sim.notebook_start_s
        how = _HOW[s.start or StartKind.COLD]
        # The VM's id in parentheses, not run into the sentence ("... the image vm-3f2a").
        self._set_session(s, S.STARTING, f"starting its notebook on {how} (VM {vm.id})", now)
        self._issue_start(s, vm, now)

    def _issue_start(self, s: Session, vm: Vm, now: float) -> None:
        self._in_flight.issue(StartNotebook, now, vm.id, vm.zone, s.id, s.spec.user_id, s.image, s.image_digest,
                    self.catalog.repository)

    def _notebook_started(self, cmd: StartNotebook, endpoint: str, now: float) -> None:
        s = self.sessions.get(cmd.session_id)
        if s is None or s.state is not S.STARTING or s.vm_id != cmd.vm_id:
            return  # stopped or ended meanwhile: the stop or the wipe ends the container
        vm = self.vms[cmd.vm_id]
        s.ready_at = s.last_activity_at = s.estimated_ready_at = now
        s.endpoint = endpoint or vm.endpoint
        self.culling.watch(s)
        self._set_session(s, S.RUNNING, f"running on {_HOW[s.start or StartKind.COLD]} (VM {vm.id})", now)

    def _notebook_start_failed(self, cmd: StartNotebook, failure: CloudFailure, now: float) -> None:
        """The session fails with the runtime's reason; its VM is wiped (or deleted) as after any session."""
        s = self.sessions.get(cmd.session_id)
        if s is None or s.state is not S.STARTING or s.vm_id != cmd.vm_id:
            return
        self._end(s, S.FAILED, f"the notebook did not start: {failure.message}", now)
        vm = self.vms[cmd.vm_id]
        if vm.state is V.ASSIGNED and vm.session_id == s.id:
            self._release(vm, now)

    def _stop_notebook(self, s: Session, vm: Vm, now: float) -> None:
        """A stopping session's notebook ends first; its VM is released when it has."""
        self._in_flight.issue(StopNotebook, now, vm.id, vm.zone, s.id)

    def _notebook_stopped(self, cmd: StopNotebook, now: float) -> None:
        """Done or failed alike: the wipe after it ends whatever is left of the container."""
        vm = self.vms[cmd.vm_id]
        if vm.state is V.ASSIGNED and vm.session_id == cmd.session_id:
            self._release(vm, now)

    def _reissue_notebook(self, vm: Vm, now: float) -> bool:
        """After a restart: the notebook step an assigned VM's session was in, again (a start is
        idempotent by session id). False when there was none."""
        s = self.sessions.get(vm.session_id)
        if vm.state is not V.ASSIGNED or s is None:
            return False
        if s.state is S.STARTING:
            self._issue_start(s, vm, now)
        elif s.state is S.STOPPING:
            self._stop_notebook(s, vm, now)
        else:
            return False
        return True

    def _vm_lost_under(self, s: Session, reason: str, now: float) -> None:
        """The session's VM is gone or failed: a stopping session is over, any other failed."""
        if s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)
        elif not s.terminal:
            self._end(s, S.FAILED, reason, now)
