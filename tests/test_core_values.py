"""What leaves the core is a value as of its step: the records a Step carries, its reply and the
core's reads cannot change afterwards, nor be changed; what enters it (a Restored event's records)
is never changed by it, so the event log keeps events as they came."""

from __future__ import annotations

import pytest
from core_driver import Driver, busy, make_core

from provisioner.decide.core import ClusterCore

from provisioner.decide import events as ev
from provisioner.model.records import FrozenSession, FrozenVm, SessionSpec, SessionState as S, vm_copy
from provisioner.model.states import VmState as V


def request(d: Driver, n: int) -> ev.SessionRequested:
    return ev.SessionRequested(d.now, SessionSpec(request_id=f"r{n}", user_id="ada", accelerator="gpu-p100",
                                                  image="gpu:latest"))


def test_a_steps_records_and_reply_stay_as_they_were_when_the_core_moves_on():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    step = d.send(request(d, 1))
    s, [written], [vm] = step.reply, step.sessions, step.vms
    assert s is written and s.state is S.PROVISIONING and vm.state is V.CREATING
    d.run_until(lambda: d.core.sessions[s.id].state is S.RUNNING, 900)
    # What a writer or a watcher was handed is still the step's, not what the core did since.
    assert s.state is S.PROVISIONING and len(s.history) == 1 and vm.state is V.CREATING
    assert d.core.get(s.id).state is S.RUNNING and d.core.vms[vm.id].state is V.ASSIGNED


def test_nothing_outside_the_core_can_change_a_value_it_gave():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    s = d.send(request(d, 1)).reply
    vm = d.core.vms[s.vm_id]
    with pytest.raises(AttributeError):
        s.state = S.STOPPED
    with pytest.raises((AttributeError, TypeError)):
        s.history.append(s.history[0])
    with pytest.raises(TypeError):
        s.history[0] = s.history[0]
    with pytest.raises(AttributeError):
        vm.session_id = "someone else's"
    with pytest.raises(TypeError):
        vm.cache.add(d.core.catalog.latest, d.core.catalog, d.now)


def test_the_reads_are_the_records_as_the_last_step_left_them():
    """After every step of a busy hour, each read value equals the core's own record."""
    d = Driver(make_core(min_vms=2, max_vms=6))

    def same(driver: Driver) -> None:
        core = driver.core
        records, machines = core._sessions.sessions, core._vms.vms  # the owners' records, for the check
        assert {i: s.to_dict() for i, s in core.sessions.items()} == {i: s.to_dict() for i, s in records.items()}
        assert {i: v.to_dict() for i, v in core.vms.items()} == {i: v.to_dict() for i, v in machines.items()}

    d.checks.append(same)
    busy(d)
    d.advance(900)
    assert d.core.sessions and d.core.vms


def test_a_restored_record_is_copied_in_and_never_changed():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    warm = d.add_warm(d.core.catalog.latest)
    record = vm_copy(d.core.vms[warm.id])  # as a store would give it
    before = record.to_dict()
    fresh = Driver(make_core(min_vms=0, headroom_fraction=0.0), now=d.now)
    fresh.send(ev.Restored(fresh.now, (), (record,)))
    s = fresh.send(request(fresh, 1)).reply
    fresh.run_until(lambda: fresh.core.get(s.id).state is S.RUNNING, 600)
    assert fresh.core.vms[record.id].state is V.ASSIGNED and record.to_dict() == before


class Recording(Driver):
    """Reads each step's records at once, as the replay does, and keeps what they said."""

    def __init__(self, core: ClusterCore):
        super().__init__(core)
        self.read: list[dict] = []
        self.values: list[bool] = []  # whether each record read was a frozen value

    def changes(self, core: ClusterCore, sessions, vms) -> None:
        super().changes(core, sessions, vms)
        for r in [*sessions, *vms]:
            self.read.append(r.to_dict())
            self.values.append(isinstance(r, (FrozenSession, FrozenVm)))


def test_a_core_giving_its_records_live_reads_as_one_giving_values():
    """A shell that reads each step's records at once reads the same with `live_records` (no
    values made) as without, step by step; only the records themselves are handed out."""
    frozen, live = Recording(make_core(min_vms=2, max_vms=6)), Recording(make_core(min_vms=2, max_vms=6,
                                                                                    live_records=True))
    for d in (frozen, live):
        busy(d)
        d.advance(900)
    assert len(live.read) > 100 and live.read == frozen.read
    assert all(frozen.values) and not any(live.values)
