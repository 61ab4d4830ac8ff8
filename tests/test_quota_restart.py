"""Metered time across crashes: SIGKILL the cluster running a session and the front, restart
both, and GetQuota still counts the session's whole running time (within one tick)."""

from __future__ import annotations

import pytest

from conftest import front_channel
from provisioner.common.clock import RealClock, fleet_clock
from provisioner.config import default_clusters_dir, load_fleet
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import Fleet

TIME_SCALE = 300.0  # as the Fleet's processes run


async def used_s(fleet: Fleet, clock: RealClock) -> tuple[float, float, float]:
    """(model time before the call, GPU-seconds used, model time after)."""
    async with front_channel(fleet.data_dir, fleet.front.address) as ch:
        before = clock.now()
        quota = (await s_grpc.SessionServiceStub(ch).GetQuota(s_pb.GetQuotaRequest(user_id="meter"), timeout=10)).quota
        return before, quota.gpu_hours_used * 3600, clock.now()


async def session(fleet: Fleet, session_id: str) -> pb.Session:
    async with front_channel(fleet.data_dir, fleet.front.address) as ch:
        return (await s_grpc.SessionServiceStub(ch).GetSession(s_pb.GetSessionRequest(session_id=session_id),
                                                               timeout=10)).session


@pytest.mark.long
@pytest.mark.timeout(120)
async def test_a_restart_of_the_cluster_and_the_front_loses_no_metered_time(tmp_path):
    fleet = Fleet(tmp_path)
    try:
        await fleet.start()
        clock = fleet_clock(fleet.data_dir, TIME_SCALE)  # the fleet's model time
        async with front_channel(fleet.data_dir, fleet.front.address) as ch:
            stub = s_grpc.SessionServiceStub(ch)
            # Batch: an interactive session nobody touches would be culled after 12 wall seconds.
            made = (await stub.CreateSession(s_pb.CreateSessionRequest(spec=pb.SessionSpec(
                request_id="metered", user_id="meter", accelerator="gpu-p100", image="gpu:latest",
                kind=pb.SESSION_KIND_BATCH)), timeout=10)).session
            async for update in stub.WatchSession(s_pb.WatchSessionRequest(session_id=made.id), timeout=30):
                if update.session.state == pb.SESSION_STATE_RUNNING:
                    break
        running = await session(fleet, made.id)
        ready = running.ready_time.ToNanoseconds() / 1e9
        config = load_fleet(default_clusters_dir())  # what the Fleet's processes run
        pool = next(p for c in config.clusters if c.name == running.cluster for p in c.pools if p.name == running.pool)
        gpus = pool.accelerator_count * config.settings.quotas.weight(pool.accelerator)
        tick = next(c.tick_s for c in config.clusters if c.name == running.cluster)

        def expected(before: float, used: float, after: float) -> None:
            # The session's time from ready to the moment GetQuota looked, give or take one tick.
            assert (before - ready - tick) * gpus <= used <= (after - ready + tick) * gpus

        expected(*await used_s(fleet, clock))
        await fleet.clusters[running.cluster].kill()  # SIGKILL, mid-session
        await fleet.front.kill()
        await fleet.clusters[running.cluster].start()
        await fleet.front.start()
        await fleet.wait_routable()
        after_restart = await used_s(fleet, clock)
        expected(*after_restart)
        again = await session(fleet, made.id)
        # The same run, carried on: not restarted (no new ready time), still running.
        assert again.state == pb.SESSION_STATE_RUNNING and again.ready_time == running.ready_time
        print(f"{after_restart[1]:.0f} GPU-seconds metered after the restarts, "
              f"{(after_restart[0] - ready) * gpus:.0f}-{(after_restart[2] - ready) * gpus:.0f} expected")
    finally:
        for s in fleet.services:
            await s.kill()
