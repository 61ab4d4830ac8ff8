"""A flood: one user sends 500 creates in a few seconds while 20 others ask for one session each.

The pools hold enough warm VMs for everyone's fair share (10 P100s per cluster, 30 in all);
without enforcement the flooder's sessions would take them all and the others would wait for
cold VMs (a boot and a full pull: minutes of model time). With it, the flooder gets its cap and
is refused the rest (by the cap or the rate limit), and every other session runs within 60 s.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb

from conftest import fleet_config, quick_warm_up, warm_fleet

FLOOD, OTHERS, CAP = 500, 20, 4
FLOOD_S = 2.5  # wall seconds over which the flooder sends its creates


def reason(err: grpc.aio.AioRpcError) -> str:
    info = error_details_pb2.ErrorInfo()
    for d in rpc_status.from_call(err).details:
        if d.Is(info.DESCRIPTOR):
            d.Unpack(info)
    return info.reason


def spec(user: str, request_id: str) -> s_pb.CreateSessionRequest:
    return s_pb.CreateSessionRequest(spec=pb.SessionSpec(request_id=request_id, user_id=user,
                                                         accelerator="gpu-p100", image="gpu:latest"))


def ten_p100s(cluster: dict) -> None:
    quick_warm_up(cluster)  # cold starts still take model minutes
    for pool in cluster["pools"]:
        if pool["name"] == "gpu-p100":
            pool["min_vms"] = 10


@pytest.mark.long
async def test_a_flood_of_creates_leaves_every_other_user_served(tmp_path):
    # x30: the others' 60 model seconds are 2 s of wall time, which a loaded machine can keep.
    async with warm_fleet(fleet_config(tmp_path, ten_p100s), tmp_path / "data", time_scale=30.0) as fleet:
        flood_channel = fleet.front_channel(token=fleet.token("flooder"))  # the flooder's own token
        flooder = s_grpc.SessionServiceStub(flood_channel)

        async def flood_one(i: int):
            try:
                return (await flooder.CreateSession(spec("flooder", f"f-{i}"), timeout=30)).session
            except grpc.aio.AioRpcError as err:
                return err

        async def other(u: int):
            # The notebook backend, a service, creates each user's session.
            started = time.monotonic()
            made = (await fleet.sessions.CreateSession(spec(f"user-{u}", "r"), timeout=30)).session
            return made, time.monotonic() - started

        flood, others = [], []
        started = time.monotonic()
        for batch in range(FLOOD // 10):  # 10 at a time, every FLOOD_S / 50
            flood += [asyncio.create_task(flood_one(batch * 10 + i)) for i in range(10)]
            if batch == 10:  # the others ask while the flood is on
                others = [asyncio.create_task(other(u)) for u in range(OTHERS)]
            await asyncio.sleep(FLOOD_S / (FLOOD // 10))
        flood = await asyncio.gather(*flood)
        flood_s = time.monotonic() - started
        others = await asyncio.gather(*others)

        made = [r for r in flood if isinstance(r, pb.Session)]
        refused = [r for r in flood if not isinstance(r, pb.Session)]
        by_reason = {}
        for err in refused:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            by_reason[reason(err)] = by_reason.get(reason(err), 0) + 1
        waits = []
        for session, _ in others:
            running = await fleet.watch_until(session.id, pb.SESSION_STATE_RUNNING, pb.SESSION_STATE_FAILED)
            assert running[-1].state == pb.SESSION_STATE_RUNNING, running[-1]
            waits.append((running[-1].ready_time.ToNanoseconds() - running[-1].create_time.ToNanoseconds()) / 1e9)
        walls = sorted(wall for _, wall in others)
        print(f"flood of {FLOOD} creates in {flood_s:.1f} s: {len(made)} made, refused {by_reason}; "
              f"the {OTHERS} others waited at most {max(waits):.1f} model s to run, "
              f"their creates took {walls[len(walls) // 2] * 1000:.0f} ms (median), {walls[-1] * 1000:.0f} ms (max)")
        assert len(made) == CAP
        assert sum(by_reason.values()) == FLOOD - CAP and set(by_reason) <= {"QUOTA_EXCEEDED", "RATE_LIMITED"}
        assert max(waits) <= 60.0
        await flood_channel.close()
