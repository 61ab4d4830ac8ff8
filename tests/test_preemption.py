"""Preemption in the cluster core (decide/preemption.py): a session within its owner's share that
finds its pool full makes preemptible sessions over their share give their GPUs back, after a
warned grace period; interactive sessions are never preempted."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_driver import Driver, make_core

from provisioner.decide import events as ev
from provisioner.model.states import SessionState as S
from provisioner.model.records import Session, SessionKind, Vm

GRACE = 120.0
BATCH, INTERACTIVE = SessionKind.BATCH, SessionKind.INTERACTIVE


def full_pool(share: int = 1, vms: int = 4, requeue: bool = False, grace: float = GRACE) -> tuple[Driver, list[Session]]:
    """A pool of `vms` VMs at its maximum, each running a batch session of ben's (the first within
    his share, the rest over it), started a minute apart."""
    core = make_core(max_vms=vms, min_vms=0, headroom_fraction=0.0,
                     priority={"share_gpus_per_user": share, "grace_period_s": grace})
    d = Driver(core)
    for _ in range(vms):
        d.add_warm(core.catalog.latest)
    batches = []
    for _ in range(vms):
        batches.append(d.allocate("ben", kind=BATCH, requeue=requeue))
        d.advance(60)
    assert all(s.state is S.RUNNING for s in batches)
    return d, batches


def test_an_interactive_session_within_its_share_preempts_the_youngest_over_share_batch():
    d, batches = full_pool()
    arrived = d.now
    dee = d.allocate("dee")
    assert dee.state is S.QUEUED and "preempted" in dee.reason and dee.queue_position == 1
    youngest = batches[-1]
    [notice] = youngest.notices
    assert notice.kind == "preemption" and notice.time == arrived and notice.action_time == arrived + GRACE
    assert "over the 1-GPU share" in notice.message and "dee" not in notice.message  # why, not who
    assert youngest.preempt_at == arrived + GRACE
    assert all(not s.notices for s in batches[:-1])

    d.advance(GRACE - d.core.config.tick_s)
    assert youngest.state is S.RUNNING  # the grace period is the notebook's to checkpoint
    d.run_until(lambda: youngest.state is not S.RUNNING, 2 * d.core.config.tick_s)
    assert youngest.reason.startswith("preempted: ")
    d.run_until(lambda: dee.state is S.RUNNING, 600)
    # The victim's VM, wiped, is the one dee gets: within the grace period plus a wipe (and a tick).
    assert dee.vm_id == youngest.vm_id
    assert dee.ready_at - arrived <= GRACE + d.core.config.sim.wipe_s + 2 * d.core.config.tick_s
    assert youngest.state is S.STOPPED and youngest.reason.startswith("preempted")
    assert all(s.state is S.RUNNING for s in batches[:-1])


def test_no_share_means_no_preemption():
    d, batches = full_pool(share=0)
    dee = d.allocate("dee")
    d.advance(600)
    assert dee.state is S.QUEUED and "waiting for capacity" in dee.reason
    assert all(s.state is S.RUNNING and not s.notices for s in batches)


def test_a_requester_over_its_own_share_waits_and_a_batch_takes_only_borrowed_gpus():
    d, batches = full_pool(share=1)
    ben_again = d.allocate("ben")  # ben holds 4 GPUs of a 1-GPU share: interactive or not, he waits
    assert ben_again.state is S.QUEUED and not any(s.notices for s in batches)
    cho = d.allocate("cho", kind=BATCH)  # within cho's share: takes a batch over ben's share
    assert cho.state is S.QUEUED and batches[-1].preempt_at
    d.run_until(lambda: cho.state is S.RUNNING, 600)
    assert batches[0].state is S.RUNNING  # ben's one batch within his share is never taken by a batch


def test_the_grace_period_is_withdrawn_when_the_waiting_session_no_longer_needs_it():
    d, batches = full_pool()
    dee = d.allocate("dee")
    d.advance(30)
    d.stop(dee)
    d.advance(GRACE)
    victim = batches[-1]
    assert victim.state is S.RUNNING and victim.preempt_at == 0
    assert [n.message.split(":")[0] for n in victim.notices] == ["preempted", "preemption withdrawn"]


def test_a_victim_stopped_in_its_grace_period_is_preempted_no_more():
    d, batches = full_pool(requeue=True)
    dee = d.allocate("dee")
    victim = batches[-1]
    d.advance(30)
    d.stop(victim)  # its user stops it first (a checkpoint done early, say)
    assert victim.preempt_at == 0 and victim.reason == "stopped by the user"
    d.run_until(lambda: dee.state is S.RUNNING, 600)
    assert dee.ready_at - dee.created_at < GRACE  # the VM came free before the grace period ended
    d.advance(GRACE)
    assert not victim.requeued_as and victim.reason == "stopped by the user"  # not requeued: not preempted


def test_a_preempted_session_asked_to_be_requeued_is_queued_again_as_a_new_session():
    d, batches = full_pool(requeue=True)
    dee = d.allocate("dee")
    victim = batches[-1]
    d.run_until(lambda: victim.state is not S.RUNNING, GRACE + 10)
    again = d.live(d.core.sessions[victim.requeued_as])
    assert again.requeued_from == victim.id and again.spec.user_id == "ben" and again.spec.kind is BATCH
    assert again.spec.request_id == f"requeue-{victim.id}" and again.state is S.QUEUED
    assert again.queue_position == 2  # behind dee, who waits for the victim's VM to be wiped
    d.run_until(lambda: dee.state is S.RUNNING, 600)
    assert again.state is S.QUEUED and again.queue_position == 1  # ben's batch waits for the next VM
    d.stop(batches[0])
    d.run_until(lambda: again.state is S.RUNNING, 600)


def test_two_requesters_take_two_victims_and_each_gets_a_vm():
    d, batches = full_pool()
    dee, eve = d.allocate("dee"), d.allocate("eve")
    assert [s.preempted_for for s in batches[-2:]] == [eve.id, dee.id]  # the youngest goes first
    d.run_until(lambda: dee.state is S.RUNNING and eve.state is S.RUNNING, GRACE + 600)
    assert {dee.vm_id, eve.vm_id} == {batches[-1].vm_id, batches[-2].vm_id}
    assert batches[0].state is S.RUNNING and batches[1].state is S.RUNNING


def test_a_preemption_survives_a_restart_of_the_core():
    d, batches = full_pool()
    dee = d.allocate("dee")
    d.advance(30)
    # A new core from the records as the store keeps them.
    sessions = tuple(Session.from_dict(s.to_dict()) for s in d.core.sessions.values())
    vms = tuple(Vm.from_dict(vm.to_dict()) for vm in d.core.vms.values())
    fresh = Driver(make_core(max_vms=4, min_vms=0, headroom_fraction=0.0,
                             priority={"share_gpus_per_user": 1, "grace_period_s": GRACE}), now=d.now)
    fresh.send(ev.Restored(fresh.now, sessions, vms))
    victim = fresh.live(fresh.core.sessions[batches[-1].id])
    waiting = fresh.live(fresh.core.sessions[dee.id])
    assert waiting.queue_position == 1
    fresh.run_until(lambda: victim.state is not S.RUNNING, GRACE)
    assert victim.reason.startswith("preempted") and fresh.now <= batches[-1].preempt_at + fresh.core.config.tick_s
    fresh.run_until(lambda: waiting.state is S.RUNNING, 600)


def test_a_session_whose_class_left_the_config_is_restored_in_its_kinds():
    d, batches = full_pool()
    record = batches[0].to_dict()
    record["priority_class"] = "bronze"  # a class the fleet's config no longer declares
    fresh = Driver(make_core(max_vms=4, min_vms=0, headroom_fraction=0.0,
                             priority={"share_gpus_per_user": 1, "grace_period_s": GRACE}), now=d.now)
    fresh.send(ev.Restored(fresh.now, (Session.from_dict(record),), ()))
    assert fresh.core.sessions[batches[0].id].priority_class == "batch"


def test_a_session_may_not_name_a_class_above_its_kinds():
    d, _ = full_pool()
    for kind, klass in ((BATCH, "interactive"), (INTERACTIVE, "batch"), (BATCH, "gold")):
        try:
            d.allocate("ann", kind=kind, priority_class=klass)
        except Exception as err:
            assert getattr(err, "field", "") == "spec.priority_class", err
        else:
            raise AssertionError(f"{kind} may not run as {klass}")
    assert d.allocate("ann", kind=BATCH, priority_class="batch").priority_class == "batch"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["ana", "ben", "cho", "dee"]), st.sampled_from([BATCH, INTERACTIVE]),
                          st.integers(0, 300), st.booleans()), min_size=1, max_size=25),
       st.integers(0, 2))
def test_no_interactive_session_is_ever_preempted(arrivals, share):
    core = make_core(max_vms=4, min_vms=0, headroom_fraction=0.0,
                     priority={"share_gpus_per_user": share, "grace_period_s": 60.0})
    d = Driver(core)
    sessions = []
    for user, kind, wait, stop_one in arrivals:
        sessions.append(d.allocate(user, kind=kind))
        d.advance(wait)
        if stop_one and (live := [s for s in sessions if s.state is S.RUNNING]):
            d.stop(live[0])
    d.advance(1800)
    for s in d.sessions.values():
        if s.spec.kind is INTERACTIVE:
            assert not s.preempt_at and not s.reason.startswith("preempted")
            assert all(n.kind != "preemption" for n in s.notices)
        # Every preemption went through: no victim is left waiting past its grace period.
        assert not s.preempt_at or s.preempt_at > d.now
    # The counts preemption reads instead of walking the pool agree with a walk.
    holding = [s for s in d.core.sessions.values() if s.state in (S.PROVISIONING, S.PULLING_IMAGE, S.RUNNING)]
    users: dict[str, int] = {}
    for vm in d.core.pools["gpu-p100"].vms.values():  # as the VMs name them
        if (s := d.core.sessions.get(vm.session_id or vm.reserved_for)) is not None and not s.terminal:
            users[s.spec.user_id] = users.get(s.spec.user_id, 0) + 1
    assert d.core.holdings.of_pool("gpu-p100") == users
    assert set(d.core.holdings.borrowable("gpu-p100")) == {s.id for s in holding if s.spec.kind is BATCH}


def test_a_requeued_session_keeps_what_is_left_of_its_max_runtime():
    d, batches = full_pool(requeue=True)
    victim = batches[-1]
    d.allocate("dee")
    d.run_until(lambda: victim.state is not S.RUNNING, GRACE + 10)
    again = d.core.sessions[victim.requeued_as]
    ran_for = victim.ended_at - victim.ready_at if victim.ended_at else d.now - victim.ready_at
    assert abs(again.max_runtime_s - (victim.max_runtime_s - ran_for)) <= 10  # within a tick of the stop
    assert again.max_runtime_s < victim.max_runtime_s


def test_a_blocked_users_preempted_session_is_not_requeued():
    d, batches = full_pool(requeue=True)
    d.send(ev.BlockedUsersSet(d.now, frozenset({"ben"})))
    victim = batches[-1]
    d.allocate("dee")
    d.run_until(lambda: victim.state is not S.RUNNING, GRACE + 10)
    assert not victim.requeued_as
    assert victim.notices[-1].message == "not queued again: its user is blocked from GPU sessions"
    assert not [s for s in d.core.sessions.values() if s.spec.request_id.startswith("requeue-")]
    d.send(ev.BlockedUsersSet(d.now, frozenset()))  # lifted: the next preemption requeues again
    assert d.core.blocked_users == frozenset()
