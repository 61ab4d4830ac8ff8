"""The VM and session state machines: the tables themselves, and the guarded `to()` on the models."""

from __future__ import annotations

from collections import deque

import pytest

from provisioner.model.errors import IllegalTransition
from provisioner.model.images import LayerCache
from provisioner.model.records import Session, SessionSpec, Vm
from provisioner.model.states import (
    SESSION_TERMINAL,
    SESSION_TRANSITIONS,
    VM_TRANSITIONS,
    SessionState,
    StateChange,
    VmState,
    check_transition,
)

TABLES = [pytest.param(VM_TRANSITIONS, VmState, id="vm"), pytest.param(SESSION_TRANSITIONS, SessionState, id="session")]


def make_vm() -> Vm:
    return Vm(id="vm-1", cluster="c", pool="p", zone="z", cache=LayerCache(0), created_at=0.0)


def make_session() -> Session:
    spec = SessionSpec(request_id="r", user_id="u", accelerator="p", image="gpu:v160")
    return Session(id="c.s-1", spec=spec, cluster="c", pool="p", image="gpu:v160", created_at=0.0,
                   idle_timeout_s=3600.0, max_runtime_s=86400.0)


@pytest.mark.parametrize("table, states", TABLES)
def test_every_state_has_a_row_and_every_edge_a_reason(table, states):
    assert set(table) == {None, *states}
    for old, edges in table.items():
        for new, reason in edges.items():
            assert isinstance(new, states)
            assert isinstance(reason, str) and reason.strip(), f"{old} -> {new} has no reason"


def test_terminal_states_have_no_way_out():
    assert VM_TRANSITIONS[VmState.DELETED] == {}
    assert SESSION_TERMINAL == {SessionState.STOPPED, SessionState.FAILED}
    for state in SESSION_TERMINAL:
        assert SESSION_TRANSITIONS[state] == {}


@pytest.mark.parametrize("table, states", TABLES)
def test_every_live_state_can_fail(table, states):
    # "any -> failed": whatever is under way can go wrong. Except stopping: a stop ends stopped,
    # whatever its VM's wipe or delete does.
    for old, edges in table.items():
        if old is not None and edges and old not in ("failed", SessionState.STOPPING):
            assert "failed" in edges, old


@pytest.mark.parametrize("table, states", TABLES)
def test_every_state_is_reachable_from_none(table, states):
    seen, todo = set(), deque([None])
    while todo:
        for new in table[todo.popleft()]:
            if new not in seen:
                seen.add(new)
                todo.append(new)
    assert seen == set(states)


def test_documented_lifecycles_are_edges():
    vm_path = [None, "creating", "booting", "warm", "assigned", "recycling", "warm", "deleting", "deleted"]
    for old, new in zip(vm_path, vm_path[1:]):
        assert VmState(new) in VM_TRANSITIONS[VmState(old) if old else None]
    s_path = [None, "queued", "provisioning", "pulling_image", "starting", "running", "stopping", "stopped"]
    for old, new in zip(s_path, s_path[1:]):
        assert SessionState(new) in SESSION_TRANSITIONS[SessionState(old) if old else None]


@pytest.mark.parametrize("table, states", TABLES)
def test_check_transition_refuses_every_missing_edge(table, states):
    for old in table:
        for new in states:
            if new in table[old]:
                check_transition(table, "x", "id", old, new)
            else:
                with pytest.raises(IllegalTransition):
                    check_transition(table, "x", "id", old, new)


def test_illegal_vm_transition_names_both_states_and_changes_nothing():
    vm = make_vm()
    for state in (VmState.CREATING, VmState.BOOTING, VmState.WARM):
        vm.to(state, state.value, 1.0)
    with pytest.raises(IllegalTransition, match=r"vm vm-1: warm -> booting") as info:
        vm.to(VmState.BOOTING, "nope", 2.0)
    assert info.value.grpc_code == "INTERNAL"
    assert vm.state is VmState.WARM and len(vm.history) == 3


def test_illegal_session_transition_names_both_states():
    s = make_session()
    for state in (SessionState.STARTING, SessionState.RUNNING, SessionState.STOPPING, SessionState.STOPPED):
        s.to(state, state.value, 1.0)
    with pytest.raises(IllegalTransition, match=r"session c\.s-1: stopped -> running"):
        s.to(SessionState.RUNNING, "again", 2.0)
    assert s.state is SessionState.STOPPED


def test_history_records_state_reason_time_in_order():
    vm = make_vm()
    vm.to(VmState.CREATING, "asked", 1.0)
    vm.to(VmState.BOOTING, "accepted", 6.0)
    vm.to(VmState.WARM, "booted", 96.0)
    assert vm.history == [StateChange("creating", "asked", 1.0), StateChange("booting", "accepted", 6.0),
                          StateChange("warm", "booted", 96.0)]
    assert (vm.reason, vm.warm_since) == ("booted", 96.0)

    s = make_session()
    s.to(SessionState.QUEUED, "full", 0.0)
    s.queue_position = 3
    s.to(SessionState.PROVISIONING, "creating", 4.0)
    assert [(h.state, h.reason, h.time) for h in s.history] == [("queued", "full", 0.0),
                                                                  ("provisioning", "creating", 4.0)]
    assert s.queue_position == 0  # only a queued session has a place in the queue
