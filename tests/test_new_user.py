"""What a new user meets when trying the README against a real local fleet: regions the fleet does
not have, operators listing sessions by cluster and state, touching an ended session, `up`'s
readiness with sessions running."""

from __future__ import annotations

import asyncio
import json

import pytest

from provisioner import cli
from provisioner import client as api
from provisioner.cli.servers import pool_readiness
from provisioner.client.credentials import local_ca
from provisioner.v1 import admin_service_pb2 as admin_pb


def _client(fleet, subject: str = "local-operator") -> api.AsyncClient:
    return api.AsyncClient(fleet.front_address, token=fleet.token(subject), ca=local_ca(fleet.data_dir))


async def test_regions_the_fleet_lacks_are_invalid_and_a_drained_one_says_so(local_fleet):
    async with _client(local_fleet) as c:
        for required in (False, True):
            with pytest.raises(api.InvalidArgument) as e:
                await c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:latest",
                                       region="mars-west1", region_required=required)
            assert e.value.field == "spec.region_hint" and "europe-west4" in e.value.message
        await local_fleet.admin.DrainCluster(admin_pb.DrainClusterRequest(cluster="europe-west4"))
        with pytest.raises(api.Unavailable) as e:
            await c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:latest",
                                   region="europe-west4", region_required=True)
        assert e.value.message == "no cluster in europe-west4 can take gpu-p100 sessions now: europe-west4 is draining"


async def test_sessions_by_cluster_and_state(local_fleet, capsys):
    async with _client(local_fleet) as c:
        made = {}
        for user, region in (("ada", "us-central1"), ("bob", "asia-east1"), ("cy", "us-central1")):
            s = await c.create_session(user_id=user, accelerator="gpu-p100", image="gpu:latest", region=region,
                                       region_required=True)
            made[user] = await c.wait_until_running(s.id, timeout=30)
        await c.stop_session(made["cy"].id)
        running = await c.list_sessions(cluster="us-central1", states=[api.SessionState.RUNNING])
        assert [s.id for s in running] == [made["ada"].id]
        assert {s.id for s in await c.list_sessions()} == {s.id for s in made.values()}
        with pytest.raises(api.NotFound):
            await c.list_sessions(cluster="mars-west1")
    async with _client(local_fleet, "bob") as c:  # a user lists its own, whatever it asks
        assert [s.id for s in await c.list_sessions()] == [made["bob"].id]

    argv = ["--json", "--front", local_fleet.front_address, "session", "list", "--cluster", "us-central1",
            "--state", "running", "--data-dir", str(local_fleet.data_dir)]
    assert await asyncio.to_thread(cli.main, argv) == 0
    assert [s["id"] for s in json.loads(capsys.readouterr().out)["sessions"]] == [made["ada"].id]


async def test_touching_a_stopped_session(local_fleet, capsys):
    async with _client(local_fleet) as c:
        s = await c.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:latest")
        await c.stop_session(s.id)
        with pytest.raises(api.SessionEnded):
            await c.touch_session(s.id)
    argv = ["session", "touch", s.id, "--front", local_fleet.front_address, "--data-dir", str(local_fleet.data_dir)]
    assert await asyncio.to_thread(cli.main, argv) == 1
    assert "touching it keeps nothing alive" in capsys.readouterr().err


async def test_up_counts_vms_in_use_toward_a_pools_minimum(local_fleet):
    done, line = pool_readiness(local_fleet.fleet)
    assert done and "(+" not in line
    async with _client(local_fleet) as c:
        for user in ("ada", "bob"):  # the pool's minimum is 2
            s = await c.create_session(user_id=user, accelerator="gpu-p100", image="gpu:latest",
                                       region="us-central1", region_required=True)
            await c.wait_until_running(s.id, timeout=30)
    done, line = pool_readiness(local_fleet.fleet)
    assert done and "us-central1/gpu-p100" in line and "in use)" in line
