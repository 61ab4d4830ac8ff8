"""Refusals held before they are answered (common/pacing.py): at the front, a call with a token that
does not check out and a read over its rate; at the metrics port, a scrape over its rate."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import yaml

from conftest import fleet_config, warm_fleet
from provisioner.common.pacing import Pacer
from provisioner.config import load_fleet
from provisioner.observability.metrics import Metrics
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc


class Sleeps:
    """A sleep that records each pause and waits until released (or not at all)."""

    def __init__(self, hold: bool = False):
        self.pauses: list[float] = []
        self.release = asyncio.Event()
        if not hold:
            self.release.set()

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await self.release.wait()


async def test_pauses_held_at_once_are_bounded():
    sleeps = Sleeps(hold=True)
    pacer = Pacer(0.25, max_paused=3, sleep=sleeps)
    held = [asyncio.create_task(pacer.pause()) for _ in range(3)]
    await asyncio.sleep(0)
    assert pacer.paused == 3
    await asyncio.wait_for(pacer.pause(), 1)  # past the bound: no pause
    assert sleeps.pauses == [0.25] * 3
    sleeps.release.set()
    await asyncio.gather(*held)
    assert pacer.paused == 0
    await Pacer(0, sleep=sleeps).pause()  # a pause of 0 pauses nothing
    assert len(sleeps.pauses) == 3


@pytest.fixture
async def fleet(tmp_path):
    fleet_config(tmp_path)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["rate_limits"].update(reads_per_user_per_s=1, read_burst_per_user=2)
    path.write_text(yaml.safe_dump(data))
    async with warm_fleet(load_fleet(tmp_path / "clusters"), tmp_path / "data") as handle:
        yield handle


async def test_refusals_of_bad_tokens_and_of_reads_over_the_rate_wait_before_their_answer(fleet):
    pacer = fleet.fleet.front.sessions.pacer
    assert pacer.pause_s == 0.25  # the default
    sleeps = Sleeps()
    pacer._sleep = sleeps
    async with fleet.front_channel(token="not-a-token") as channel:
        anonymous = s_grpc.SessionServiceStub(channel)
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await anonymous.GetQuota(s_pb.GetQuotaRequest(user_id="ada"), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert sleeps.pauses == [0.25] * 3
    async with fleet.front_channel(token=fleet.token("ada")) as channel:
        ada = s_grpc.SessionServiceStub(channel)
        codes = []
        for _ in range(5):
            try:
                await ada.GetQuota(s_pb.GetQuotaRequest(), timeout=10)
                codes.append("OK")
            except grpc.aio.AioRpcError as e:
                codes.append(e.code().name)
    refused = codes.count("RESOURCE_EXHAUSTED")
    assert refused >= 2 and set(codes) == {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert sleeps.pauses == [0.25] * (3 + refused)  # only refusals wait; answered calls do not


async def test_a_scrape_over_the_rate_waits_before_its_answer():
    metrics = Metrics()
    sleeps = Sleeps()
    metrics._pacer = Pacer(0.25, sleep=sleeps)
    server = await metrics.serve("127.0.0.1:0")
    try:
        statuses = []
        for _ in range(25):  # past the burst of 20
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            statuses.append((await reader.read()).split(b" ", 2)[1])
            writer.close()
    finally:
        await server.close()
    assert statuses.count(b"200") >= 20 and b"429" in statuses
    assert len(sleeps.pauses) == statuses.count(b"429")
