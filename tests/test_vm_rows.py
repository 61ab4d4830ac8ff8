"""A VM's disk cache and history are rows of their own: a write carries what changed, a load puts
the VM back together, and VMs written whole (in one body, by the release before) still load.
SQLite and a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from core_driver import Driver, make_core
from provisioner.model.records import vm_copy
from provisioner.model.states import StateChange, VmState
from provisioner.store import open_store

IMAGES = ("gpu:v150", "gpu:v155", "gpu:v160")


@pytest.fixture
def store(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "unused.db")
    yield s
    s.close()


def some_vms():
    d = Driver(make_core())
    vms = [vm_copy(d.add_warm(*IMAGES)), vm_copy(d.add_warm(*IMAGES[:1]))]  # records of the test's own
    return d.core, vms


def _stored(store, cluster: str) -> dict[str, dict]:
    return {vm.id: vm.to_dict() for vm in store.sessions.load_vms(cluster)}


def _tamper(store, statement: str, args: tuple) -> None:
    """Changes a row behind the store's back: a later write that leaves it so did not rewrite it."""
    with store.transaction() as cur:
        cur.execute(store.sql(statement), args)


def _body(store, vm_id: str) -> dict:
    return json.loads(store.rows("SELECT body FROM vms WHERE id = ?", (vm_id,))[0][0])


def test_vms_come_back_whole_and_bodies_leave_out_layers_and_history(store):
    core, vms = some_vms()
    store.sessions.save([], vms)
    assert _stored(store, core.name) == {vm.id: vm.to_dict() for vm in vms}
    body = _body(store, vms[0].id)
    assert "layers" not in body["cache"] and "history" not in body


def test_a_write_carries_only_what_changed(store):
    core, (vm, _) = some_vms()
    store.sessions.save([], [vm])
    newest = set(core.catalog.layer_ids(IMAGES[-1]))
    untouched = sorted(set(vm.cache.layer_ids) - newest)[0]
    _tamper(store, "UPDATE vm_layers SET used_at = ? WHERE vm_id = ? AND layer_id = ?", (-1.0, vm.id, untouched))
    _tamper(store, "UPDATE vm_history SET reason = ? WHERE vm_id = ? AND seq = 0", ("tampered", vm.id))
    vm.cache.touch(IMAGES[-1], core.catalog, 5000.0)  # a session started on it
    vm.history.append(StateChange("assigned", "session s-1", 5000.0))
    store.sessions.save([], [vm])
    (stored,) = [v for v in store.sessions.load_vms(core.name) if v.id == vm.id]
    used = {lid: at for lid, _, at in stored.cache.to_dict()["layers"]}
    assert used[untouched] == -1.0  # not written again
    assert all(used[lid] == 5000.0 for lid in newest)
    assert stored.history[0].reason == "tampered" and stored.history[1:] == vm.history[1:]


def test_evictions_and_a_rewritten_history_are_written_as_they_are(store):
    core, (vm, _) = some_vms()
    store.sessions.save([], [vm])
    vm.cache.clear()
    vm.cache.add(IMAGES[0], core.catalog, 6000.0)
    vm.history[:] = [vm.history[-1], StateChange("warm", "kept short", 6000.0)]
    store.sessions.save([], [vm])
    assert _stored(store, core.name)[vm.id] == vm.to_dict()


def test_a_deleted_vm_keeps_no_layers(store):
    core, (vm, other) = some_vms()
    store.sessions.save([], [vm, other])
    vm.state = VmState.DELETED
    store.sessions.save([], [vm])
    assert set(_stored(store, core.name)) == {other.id}
    assert store.rows("SELECT count(*) FROM vm_layers WHERE vm_id = ?", (vm.id,)) == [(0,)]


def test_vms_written_whole_still_load_and_move_to_rows_when_next_written(store_url, tmp_path, store):
    core, vms = some_vms()
    with store.transaction() as cur:  # as the release before wrote them
        cur.executemany(store.sql("INSERT INTO vms (id, cluster, pool, state, revision, body) VALUES (?, ?, ?, ?, ?, ?)"),
                        [(v.id, v.cluster, v.pool, v.state.value, v.revision, json.dumps(v.to_dict())) for v in vms])
    reopened = open_store(store_url, tmp_path / "unused.db")
    try:
        loaded = reopened.sessions.load_vms(core.name)
        assert {v.id: v.to_dict() for v in loaded} == {vm.id: vm.to_dict() for vm in vms}
        reopened.sessions.save([], loaded)
        assert "layers" not in _body(reopened, vms[0].id)["cache"]
        assert _stored(reopened, core.name) == {vm.id: vm.to_dict() for vm in vms}
    finally:
        reopened.close()


async def test_a_write_whose_batch_failed_is_written_whole(store):
    """What the store remembers having written changes only once a transaction commits: a save
    whose batch rolled back is run again alone, and writes all it changed."""
    core, (vm, _) = some_vms()
    store.sessions.save([], [vm])

    def fail():
        raise ValueError("refused")

    gate = threading.Event()
    store.writer.submit(lambda _cur: gate.wait(10))
    vm.history.append(StateChange("assigned", "in a batch that failed", 8000.0))
    saved = asyncio.create_task(store.sessions.commit_save([], [vm]))
    failed = asyncio.create_task(store.commit(fail))
    await asyncio.sleep(0)
    gate.set()
    await saved
    with pytest.raises(ValueError):
        await failed
    assert _stored(store, core.name)[vm.id] == vm.to_dict()


async def test_commit_save_writes_objects_as_they_were_when_called(store):
    core, (vm, _) = some_vms()
    gate = threading.Event()
    store.writer.submit(lambda _cur: gate.wait(10))
    as_called = vm.to_dict()
    saved = asyncio.create_task(store.sessions.commit_save([], [vm]))
    await asyncio.sleep(0)
    vm.history.append(StateChange("assigned", "after the call", 9000.0))  # the loop goes on
    gate.set()
    await saved
    assert _stored(store, core.name)[vm.id] == as_called
