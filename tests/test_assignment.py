"""Property tests of the assignment decisions: which VM a session gets, and queue order."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from unittest import mock

from core_driver import Driver, fleet, make_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.decide import assignment
from provisioner.decide.assignment import QueueOrder, choose_vm, choose_waiting, queue_order
from provisioner.model.errors import FailedPrecondition
from provisioner.model.images import LayerCache
from provisioner.model.records import Session, SessionKind, SessionSpec, StartKind, Vm
from provisioner.model.states import SESSION_HOLDS_VM, SessionState, VmState

CATALOG = fleet().catalog
# A window of recent versions, so that random caches and requests overlap often.
RECENT = CATALOG.versions()[-10:]
CACHE_BYTES = 100 * 10**9


def warm_vm(i: int, versions: list[str]) -> Vm:
    # Added oldest-first into a bounded LRU cache: big draws leave partial older images behind.
    cache = LayerCache(CACHE_BYTES)
    for t, v in enumerate(versions):
        cache.add(v, CATALOG, float(t))
    return Vm(id=f"vm-{i:02d}", cluster="c", pool="p", zone="z", cache=cache, created_at=0.0,
              state=VmState.WARM)


caches = st.lists(st.lists(st.sampled_from(RECENT), max_size=5), max_size=8)
images = st.sampled_from(CATALOG.versions()[-12:])


@settings(max_examples=150, deadline=None)
@given(caches, images, st.data())
def test_choose_vm_prefers_exact_then_fewest_missing_bytes(cache_lists, image, data):
    vms = data.draw(st.permutations([warm_vm(i, c) for i, c in enumerate(cache_lists)]))
    choice = choose_vm(image, vms, CATALOG)
    if not vms:
        assert choice.start is StartKind.COLD and choice.vm_id == ""
        return
    missing = {vm.id: CATALOG.missing_bytes(image, vm.cache.layer_ids) for vm in vms}
    assert choice.missing_bytes == missing[choice.vm_id] == min(missing.values())
    exact = [vm for vm in vms if vm.cache.has_image(image, CATALOG)]
    if exact:
        assert choice.start is StartKind.WARM and choice.missing_bytes == 0
        assert choice.vm_id in {vm.id for vm in exact}
    else:
        assert choice.start is StartKind.PARTIAL and choice.missing_bytes > 0
    # Among equally good VMs, the one offered first.
    assert choice.vm_id == next(vm.id for vm in vms if missing[vm.id] == choice.missing_bytes)
    assert choose_vm(image, list(vms), CATALOG) == choice  # the same inputs, the same answer


def test_choose_vm_ties_go_to_the_first_offered():
    vms = [warm_vm(i, ["gpu:v160"]) for i in (7, 3, 5)]
    assert choose_vm("gpu:v160", vms, CATALOG).vm_id == "vm-07"
    assert choose_vm("gpu:v160", vms[::-1], CATALOG).vm_id == "vm-05"


# ---- a VM come free serves a session waiting for another --------------------------------

def waiting(i: int, image: str, created_at: float, ready_at: float) -> Session:
    s = queued(i, i, SessionKind.INTERACTIVE, created_at)
    s.image, s.estimated_ready_at = image, ready_at
    return s


def test_choose_waiting_prefers_a_session_whose_image_the_vm_holds_then_the_longest_waiting():
    vm = warm_vm(1, ["gpu:v158", "gpu:v160"])
    exact_late, exact_early = waiting(1, "gpu:v160", 30.0, 700.0), waiting(2, "gpu:v158", 20.0, 40.0)
    partial = waiting(3, "gpu:v159", 0.0, 1_000.0)
    assert choose_waiting(vm, [partial, exact_late, exact_early], CATALOG, 4e7, 50.0) is exact_early
    # A session whose own VM is ready before the layers it lacks here would be pulled keeps waiting.
    missing = CATALOG.missing_bytes("gpu:v159", vm.cache.layer_ids)
    assert missing > 0
    assert choose_waiting(vm, [partial], CATALOG, 4e7, 50.0) is partial
    assert choose_waiting(vm, [waiting(4, "gpu:v159", 0.0, 50.0 + missing / 4e7)], CATALOG, 4e7, 50.0) is None


def test_a_session_waiting_for_a_new_vm_takes_a_warm_vm_holding_its_image_that_comes_free():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    d.add_warm("gpu:v160")
    first = d.allocate("u1", "gpu:v160")
    second = d.allocate("u2", "gpu:v160")  # no warm VM left: a new one is made for it (minutes)
    assert second.state is SessionState.PROVISIONING and second.start is StartKind.COLD
    made_for_it = second.vm_id
    d.advance(30.0)
    d.stop(first)
    d.run_until(lambda: second.state is SessionState.RUNNING, 3600)
    # It ran on the VM the first left, wiped, long before its own would have booted and pulled.
    assert second.vm_id == first.vm_id and second.start is StartKind.WARM
    assert second.ready_at - second.created_at < 120.0
    d.run_until(lambda: d.vms[made_for_it].state is VmState.WARM, 3600)  # it joins the pool
    assert not d.vms[made_for_it].reserved_for


# ---- queue order ------------------------------------------------------------------------

def queued(i: int, user: int, kind: SessionKind, created_at: float) -> Session:
    spec = SessionSpec(request_id=f"r{i}", user_id=f"u{user}", accelerator="p", image="gpu:v160", kind=kind)
    return Session(id=f"c.s-{i:03d}", spec=spec, cluster="c", pool="p", image="gpu:v160",
                   created_at=created_at, idle_timeout_s=3600.0, max_runtime_s=86400.0)


queues = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(SessionKind), st.integers(0, 20)), max_size=25)


@settings(max_examples=200, deadline=None)
@given(queues, st.data())
def test_queue_order_is_class_then_fair_share_then_age(rows, data):
    sessions = [queued(i, u, k, float(t)) for i, (u, k, t) in enumerate(rows)]
    order = queue_order(data.draw(st.permutations(sessions)))
    assert sorted(s.id for s in order) == sorted(s.id for s in sessions)

    def klass(s: Session) -> int:
        return 0 if s.spec.kind is SessionKind.INTERACTIVE else 1

    # Rank: how many older requests the same user has in the same class.
    rank = {}
    for s in sessions:
        rank[s.id] = sum(1 for o in sessions if klass(o) == klass(s) and o.spec.user_id == s.spec.user_id
                         and (o.created_at, o.id) < (s.created_at, s.id))
    for a, b in zip(order, order[1:]):
        assert klass(a) <= klass(b), "interactive before batch"
        if klass(a) == klass(b):
            assert rank[a.id] <= rank[b.id], "a user's k-th request never precedes another's (k-1)-th"
            if rank[a.id] == rank[b.id]:
                assert (a.created_at, a.id) <= (b.created_at, b.id), "older first"
    assert queue_order(list(reversed(sessions))) == order


ops = st.lists(st.one_of(
    st.tuples(st.just("queue"), st.integers(0, 3), st.sampled_from(SessionKind), st.integers(0, 5)),
    st.tuples(st.just("hold"), st.integers(0, 3), st.integers(-1, 1)),  # what a user holds changes
    st.tuples(st.just("leave"), st.integers(0, 30)),  # a session leaves the queue (placed, stopped)
    st.tuples(st.just("claim"), st.integers(0, 30)),  # a session preempted others: first in the queue
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_order_kept_between_changes_is_the_order_sorted_whole(steps):
    """QueueOrder, as the core drives it, always gives queue_order of the queue as it stands, and
    the index it reports as the first changed leaves every session before it in place."""
    _drive_queue_order(steps)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_order_kept_is_right_when_it_gives_up_moving_and_sorts_again(steps):
    """The same, with a queue order that sorts again after a move or two (the fallback a long
    queue takes when a change, or a burst of them, would move more than sorting costs)."""
    with mock.patch.object(assignment, "MOVES_BEFORE_SORT", 1):
        _drive_queue_order(steps)


def _drive_queue_order(steps) -> None:
    kept, queue, holding, first = QueueOrder(), [], {}, frozenset()
    shown = []  # the order as last read
    for i, step in enumerate(steps):
        match step:
            case ("queue", user, kind, t):
                s = queued(i, user, kind, float(t))
                queue.append(s)
                kept.add(s, holding, None, first)
            case ("hold", user, delta):
                had = holding.get(f"u{user}", 0)
                holding = {**holding, f"u{user}": max(0, had + delta)}
                kept.shift(f"u{user}", holding[f"u{user}"] - had)
            case ("leave", n) if queue:
                kept.remove(queue.pop(n % len(queue)), first)
            case ("claim", n) if queue:
                first = first | {queue[n % len(queue)].id}
        order = kept.order(lambda: queue, holding, None, first)
        changed = kept.take_changed()
        assert order[:changed] == shown[:changed], "sessions before the first changed stay put"
        shown = list(order)  # a copy: the kept one changes in place
        assert shown == queue_order(queue, holding, None, first)


def test_a_change_moves_only_the_sessions_whose_turn_it_changes():
    """Two users with two queued sessions each, alternating. The second user's first session
    leaving moves its second one turn up, ahead of the first user's second; that user then getting
    a VM puts it back. Nothing before the first change moves, and the queue is never read again
    (the order is kept, not sorted)."""
    kept = QueueOrder()
    a1, b1, a2, b2 = (queued(i, u, SessionKind.INTERACTIVE, float(i)) for i, u in enumerate((0, 1, 0, 1)))
    assert kept.order(lambda: [a1, b1, a2, b2], {}, None, frozenset()) == [a1, b1, a2, b2]
    kept.take_changed()
    kept.remove(b1, frozenset())
    assert kept.take_changed() == 1
    assert kept.order(lambda: [], {}, None, frozenset()) == [a1, b2, a2]
    kept.shift("u1", 1)  # u1 got a VM: its queued sessions wait one turn more
    assert kept.order(lambda: [], {"u1": 1}, None, frozenset()) == [a1, a2, b2]
    assert kept.take_changed() == 1


# ---- no VM is ever given to two sessions --------------------------------------------------

def one_session_per_vm(d: Driver) -> None:
    core = d.core
    holders: dict[str, list[str]] = defaultdict(list)
    for s in core.sessions.values():
        if not s.terminal and s.vm_id:
            holders[s.vm_id].append(s.id)
        if s.state in SESSION_HOLDS_VM:
            assert s.vm_id in core.vms, f"{s.id} ({s.state}) holds a VM the core no longer has"
    for vm_id, ids in holders.items():
        assert len(ids) == 1, f"VM {vm_id} held by {ids}"
    for vm in core.vms.values():
        if vm.state is VmState.ASSIGNED:
            s = core.sessions[vm.session_id]
            assert s.vm_id == vm.id and not s.terminal, f"{vm.id} assigned to {s.id} ({s.state}, vm {s.vm_id})"


ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 3), st.sampled_from(["gpu:latest", *RECENT[-3:]]),
              st.sampled_from(SessionKind)),
    st.tuples(st.just("stop"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 6.0, 30.0, 120.0, 400.0])),
    st.tuples(st.just("stockout"), st.booleans()),
    st.tuples(st.just("unhealthy"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.integers(0, 50)),
    st.tuples(st.just("wipes_fail"), st.booleans()),
    st.tuples(st.just("pulls_fail"), st.booleans()),
), max_size=30)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(1, 4), st.integers(0, 1), st.sampled_from([0.0, 0.5]), st.booleans())
def test_a_vm_is_never_held_by_two_live_sessions(steps, max_vms, min_vms, headroom, recycle):
    # Two zones, one of which may stock out: launches fail over between them.
    zone = "us-central1-c"
    d = Driver(make_core(max_vms=max_vms, min_vms=min_vms, headroom_fraction=headroom, recycle=recycle,
                         zones=(zone, "us-central1-f")))
    d.checks.append(one_session_per_vm)
    for op, *args in steps:
        if op == "alloc":
            user, image, kind = args
            d.allocate(f"u{user}", image, kind)
        elif op == "stop" and d.core.sessions:
            d.stop(list(d.core.sessions.values())[args[0] % len(d.core.sessions)])
        elif op == "advance":
            d.advance(args[0])
        elif op == "stockout":
            d.fail_zones = {zone: "stockout"} if args[0] else {}
        elif op == "unhealthy" and d.core.vms:
            d.health(sorted(d.core.vms)[args[0] % len(d.core.vms)], False, "xid 79")
        elif op == "evict" and d.core.vms:
            with contextlib.suppress(FailedPrecondition):  # only warm, assigned or failed VMs
                d.evict(sorted(d.core.vms)[args[0] % len(d.core.vms)])
        elif op == "wipes_fail":
            d.fail_wipes = args[0]
        elif op == "pulls_fail":
            d.fail_pulls = args[0]
    d.fail_zones, d.fail_wipes, d.fail_pulls = {}, False, False
    d.advance(1200.0)
    # Every stop finished, whatever failed on the way.
    assert not [s.id for s in d.core.sessions.values() if s.state is SessionState.STOPPING]
    assert not [vm.id for vm in d.core.vms.values() if vm.state is VmState.RECYCLING]
