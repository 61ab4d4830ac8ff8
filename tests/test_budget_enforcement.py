"""A running session and its owner's weekly GPU budget: its watchers are warned 30 and 5 minutes
before the budget runs out, it is stopped when it does, and the next create is refused."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import yaml

from conftest import fleet_config, quick_warm_up, warm_fleet
from provisioner.config import load_fleet
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb


def with_budget(tmp_path, gpu_hours: float):
    fleet_config(tmp_path, quick_warm_up)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["quotas"].update(gpu_hours_per_week=gpu_hours, min_budget_to_start_s=60)
    path.write_text(yaml.safe_dump(data))
    return load_fleet(tmp_path / "clusters")


def seconds(ts) -> float:
    return ts.ToNanoseconds() / 1e9


async def test_a_running_session_is_warned_then_stopped_when_the_budget_runs_out(tmp_path):
    # 0.6 GPU hours: a one-GPU session runs out 36 model minutes after it starts (7 s at 300x).
    async with warm_fleet(with_budget(tmp_path, 0.6), tmp_path / "data") as fleet:
        s = await fleet.running(await fleet.create(user_id="spender", accelerator="gpu-p100"))
        seen = await fleet.watch_until(s.id, pb.SESSION_STATE_STOPPED, pb.SESSION_STATE_FAILED, timeout=30)
        end = seen[-1]
        assert end.state == pb.SESSION_STATE_STOPPED and "weekly GPU budget is used up" in end.reason
        budget_end = seconds(end.budget_end_time)
        ready = seconds(end.ready_time)
        assert abs(budget_end - (ready + 0.6 * 3600)) <= 5  # what the front computed, from the ready time
        # Stopped at the end, within a tick (5 s) and the stop's own steps.
        stopping = next(h for h in end.history if h.state == "stopping")
        assert budget_end <= seconds(stopping.time) <= budget_end + 10
        # Two warnings, 30 and 5 minutes ahead (each given within a tick of its time), in the
        # stream before the stop.
        notices = list(end.notices)
        assert [n.kind for n in notices] == ["gpu_budget", "gpu_budget"]
        assert [round((budget_end - seconds(n.time)) / 60) for n in notices] == [30, 5]
        # (the end each warned of: the front's first sweep may see the start a few model seconds
        # early, the front's clock and the cluster's being separate)
        assert all(abs(seconds(n.action_time) - budget_end) <= 5 for n in notices)
        assert "runs out in 30 minutes" in notices[0].message
        warned = [len(r.notices) for r in seen if r.state == pb.SESSION_STATE_RUNNING]
        assert 1 in warned and 2 in warned  # watchers saw each warning while it ran
        # The budget is spent: the next create is refused with the reset time.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await fleet.create(user_id="spender", request_id="again")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        quota = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="spender"))).quota
        assert quota.gpu_hours_left * 3600 < 60 and not quota.HasField("exhaustion_time")


async def test_a_sweep_recomputes_only_the_users_whose_budget_end_may_have_moved(tmp_path):
    """Each sweep lists every cluster once. A user's end is computed again only when a session of
    theirs started running or ended, their quotas changed, or the sweep has never seen them; and
    a user is listed on their own (at every cluster) only until the sweeps' lists carry what the
    front knows of their ended sessions forward. The week known that way is the week listed."""
    from provisioner.front.budget_enforcer import BudgetEnforcer
    from provisioner.v1 import admin_service_pb2 as admin_pb

    async with warm_fleet(with_budget(tmp_path, 100.0), tmp_path / "data") as fleet:
        svc = fleet.fleet.front.sessions
        # The front's own sweep stops: its lists would be counted as this one's.
        fleet.fleet.front.budgets.cancel()
        await asyncio.gather(fleet.fleet.front.budgets, return_exceptions=True)
        enforcer = BudgetEnforcer(svc.weeks, svc.fleet)

        async def sweep() -> tuple[list[str], list[str]]:
            """The users the sweep computed an end for, and those it listed on their own (creates'
            quota checks list users too: not counted)."""
            computed: list[str] = []
            listed: list[str] = []
            enforce, week = enforcer._enforce, svc.weeks.week

            async def spying_enforce(user, *args):
                computed.append(user)
                return await enforce(user, *args)

            async def spying_week(user, *args, **kwargs):
                listed.append(user)
                return await week(user, *args, **kwargs)

            enforcer._enforce, svc.weeks.week = spying_enforce, spying_week
            try:
                await enforcer.sweep()
            finally:
                del enforcer._enforce, svc.weeks.week
            return sorted(computed), sorted(listed)

        await fleet.running(await fleet.create(user_id="alice"))
        await fleet.running(await fleet.create(user_id="bob"))
        assert await sweep() == (["alice", "bob"], ["alice", "bob"])  # never seen
        assert await sweep() == ([], [])  # nothing changed
        await fleet.running(await fleet.create(user_id="alice"))
        assert await sweep() == (["alice"], [])  # a session started; what ended is known
        brief = await fleet.running(await fleet.create(user_id="bob"))  # started and ended between two sweeps
        await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=brief.id))
        await fleet.watch_until(brief.id, pb.SESSION_STATE_STOPPED, pb.SESSION_STATE_FAILED)
        assert await sweep() == (["bob"], [])
        await fleet.admin.SetUserQuota(admin_pb.SetUserQuotaRequest(user_id="bob", gpu_hours_per_week=50.0))
        assert await sweep() == (["bob"], [])  # an operator changed the quotas
        assert await sweep() == ([], [])

        # Bob's week as the sweeps know it, and as listing him tells it.
        q = await svc.weeks.quotas("bob")
        known = enforcer._known_week("bob", q, await enforcer._list_all())
        assert known is not None
        listed = await svc.weeks.week("bob", q)
        now = svc.clock.now()
        assert sorted(r.request_id for r in known[1]) == sorted(r.request_id for r in listed[1]) != []
        assert sorted(s.id for s in known[0]) == sorted(s.id for s in listed[0])
        usage_known, usage_listed = svc.weeks.usage(*known, now, q), svc.weeks.usage(*listed, now, q)
        assert (usage_known.active, usage_known.running_gpus) == (usage_listed.active, usage_listed.running_gpus)
        assert abs(usage_known.used_s - usage_listed.used_s) < 1e-6


class _Unreachable(grpc.aio.UnaryUnaryClientInterceptor):
    """On the front's links: SetBudgetEnd to the sessions of `cluster` fails as an unreachable
    cluster's call does (UNAVAILABLE, never sent); every other call goes through."""

    def __init__(self, cluster: str):
        self.cluster, self.refused = cluster, 0

    async def intercept_unary_unary(self, continuation, details, request):
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method.endswith("/SetBudgetEnd") and request.session_id.startswith(self.cluster + "."):
            self.refused += 1
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="injected: connection refused")
        return await continuation(details, request)


async def test_an_unreachable_cluster_does_not_stop_the_sweep_for_the_others(tmp_path):
    """The sweep tells each running session its end, users in order: the first user's session is
    on a cluster that cannot be reached, the second's on one that can. The second is told (and
    the first is tried again at later sweeps)."""
    import asyncio

    from provisioner.v1 import cluster_service_pb2 as c_pb
    from provisioner.v1 import cluster_service_pb2_grpc as c_grpc

    unreachable = _Unreachable("europe-west4")
    async with warm_fleet(with_budget(tmp_path, 100.0), tmp_path / "data", link_interceptors=[unreachable]) as fleet:
        cut_off = await fleet.create(user_id="a-first", region_hint="europe-west4", region_required=True)
        reached = await fleet.create(user_id="b-second", region_hint="us-central1", region_required=True)
        for s in (cut_off, reached):
            await fleet.watch_until(s.id, pb.SESSION_STATE_RUNNING)
        told = pb.Session()
        async with fleet.cluster_channel("us-central1") as ch:
            stub = c_grpc.ClusterServiceStub(ch)
            for _ in range(100):  # the front sweeps every 60 model seconds: 0.2 s of wall time here
                told = (await stub.Get(c_pb.GetRequest(session_id=reached.id), timeout=5)).session
                if told.HasField("budget_end_time") and unreachable.refused >= 2:
                    break
                await asyncio.sleep(0.1)
        assert unreachable.refused >= 2, "the session on the unreachable cluster was not tried again"
        assert told.HasField("budget_end_time"), "the sweep stopped at the unreachable cluster"
        quota = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="b-second"))).quota
        assert abs(seconds(told.budget_end_time) - seconds(quota.exhaustion_time)) <= 60  # the end the front computes


async def test_a_cluster_refuses_a_budget_end_no_weekly_budget_could_reach(tmp_path):
    """The front's certificate cannot let a session run for ever: a cluster takes budget ends up to
    two weeks ahead (a week's budget after the next reset, at most), not year 9999."""
    from provisioner.v1 import cluster_service_pb2 as cluster_pb
    from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc

    async with warm_fleet(with_budget(tmp_path, 30.0), tmp_path / "data") as fleet:
        s = await fleet.create(user_id="ada", accelerator="gpu-p100")
        async with fleet.cluster_channel(s.cluster) as ch:
            stub = cluster_grpc.ClusterServiceStub(ch)
            far = cluster_pb.SetBudgetEndRequest(session_id=s.id)
            far.end_time.FromSeconds(253_402_300_000)  # 9999-12-31
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SetBudgetEnd(far, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "end_time" in err.value.details()
            near = cluster_pb.SetBudgetEndRequest(session_id=s.id)
            near.end_time.FromSeconds(int(seconds(s.create_time)) + 86_400)
            resp = await stub.SetBudgetEnd(near, timeout=5)
            assert seconds(resp.session.budget_end_time) == seconds(near.end_time)
