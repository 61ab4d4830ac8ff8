"""The cluster core's commands in flight: each command's id, its deadline, and which VM's work it
is. A command stays in flight until its final answer, its failure or its deadline; an answer to
one no longer in flight is dropped by the core (provisioner/decide/core.py). Pure.
"""

from __future__ import annotations

import heapq

from provisioner.config import ClusterConfig
from provisioner.decide.commands import Command, Delete, Launch, Pull, Start, StartNotebook, Stop, StopNotebook, Wipe
from provisioner.decide.deadlines import Limits


class InFlight:
    def __init__(self, cluster: ClusterConfig):
        self.limits = Limits(cluster)
        self._next_id = 1
        self._commands: dict[int, Command] = {}
        self._of_vm: dict[str, dict[int, None]] = {}  # vm id -> its commands in flight
        self._due: list[tuple[float, int]] = []  # (deadline, command id)
        self._issued: list[Command] = []  # by the events being handled, for their step

    def issue(self, kind: type, now: float, *args) -> Command:
        cmd = kind(self._next_id, *args)
        self._next_id += 1
        self._commands[cmd.id] = cmd
        self._of_vm.setdefault(cmd.vm_id, {})[cmd.id] = None
        heapq.heappush(self._due, (now + self.limit_s(cmd), cmd.id))
        self._issued.append(cmd)
        return cmd

    def take_issued(self) -> list[Command]:
        """The commands issued since the last call: the step's to carry out."""
        issued, self._issued = self._issued, []
        return issued

    def get(self, command_id: int) -> Command | None:
        return self._commands.get(command_id)

    def all(self) -> list[Command]:
        return list(self._commands.values())

    def settle(self, cmd: Command) -> None:
        """The command got its final answer: no other answer to it applies."""
        del self._commands[cmd.id]
        mine = self._of_vm[cmd.vm_id]
        del mine[cmd.id]
        if not mine:
            del self._of_vm[cmd.vm_id]

    def settle_vm(self, vm_id: str) -> None:
        """The VM's work in flight no longer applies (it is leaving, or stopping into standby)."""
        for cid in self._of_vm.pop(vm_id, ()):
            del self._commands[cid]

    def due(self, now: float) -> bool:
        due, commands = self._due, self._commands
        while due and due[0][1] not in commands:  # answered since: its deadline is nothing to wake for
            heapq.heappop(due)
        return bool(due) and due[0][0] <= now

    def next_expired(self, now: float) -> Command | None:
        """The next command past its deadline, settled; None when there is none. One at a time:
        failing one may take others of its VM out of flight."""
        due = self._due
        while due and due[0][0] <= now:
            _, cid = heapq.heappop(due)
            cmd = self._commands.get(cid)
            if cmd is not None:
                self.settle(cmd)
                return cmd
        return None

    def restart_ids(self, now: float) -> None:
        """After a restore, ids go on from the restore's time (in microseconds), past any the
        previous process issued unless it issued more than a million a second: an id in a log or
        a trace names one command only."""
        self._next_id = max(self._next_id, int(now * 1e6))

    def limit_s(self, cmd: Command) -> float:
        kind = type(cmd)
        if kind is Pull:
            return self.limits.pull_s(sum(layer.size_bytes for layer in cmd.layers))
        if (name := _LIMIT_OF.get(kind)) is None:
            raise TypeError(cmd)
        return getattr(self.limits, name)


# Each command's limit (decide/deadlines.py: Limits), by the command's type: asked at every issue.
_LIMIT_OF = {Launch: "launch_s", Wipe: "wipe_s", Delete: "delete_s", Stop: "stop_s", Start: "start_s",
             StartNotebook: "notebook_start_s", StopNotebook: "notebook_stop_s"}
