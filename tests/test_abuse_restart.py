"""A flag is not lost with the process that made it: a cluster SIGKILLed after flagging a miner,
before any front heard of it, sends the flag again from its store once restarted, and a front
that starts then blocks the user."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest
import yaml

from conftest import TIME_SCALE, cluster_channel, fleet_config, quick_warm_up
from provisioner import client as api
from provisioner.client.credentials import local_ca
from provisioner.common.clock import ManualClock, RealClock
from provisioner.cloud.sim import Inventory, SimCloud
from provisioner.config import load_fleet
from provisioner.model.records import request_key
from provisioner.security.client import dev_token
from provisioner.cli.serve import start_front
from provisioner.front.records import FrontRecords
from provisioner.store import SqliteStore
from provisioner.v1 import cluster_service_pb2 as c_pb
from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
from provisioner.v1 import types_pb2 as pb
from test_abuse_fleet import until
from test_processes import cluster_process

CLUSTER = "us-central1"


def stopped_with_flag(data_dir, session_id: str) -> list | None:
    """The session's flag as its record in the store holds it, once it has stopped."""
    db = sqlite3.connect(data_dir / f"cluster-{CLUSTER}.db")
    try:
        (body,) = db.execute("SELECT body FROM sessions WHERE id = ?", (session_id,)).fetchone()
        record = json.loads(body)
        return record.get("abuse") if record["state"] == "stopped" else None
    finally:
        db.close()


@pytest.mark.timeout(120)
async def test_a_cluster_killed_after_flagging_sends_the_flag_again_once_restarted(tmp_path):
    fleet_config(tmp_path, quick_warm_up)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    # Ended sessions stay in memory (and are sent) for a model day: the restarts' wall time is no
    # concern of this test.
    data["sessions"]["retention_s"] = 86400
    path.write_text(yaml.safe_dump(data))
    config = load_fleet(tmp_path / "clusters")
    data_dir = tmp_path / "data"
    cluster = cluster_process(CLUSTER, tmp_path / "clusters", data_dir, tmp_path / "cluster.log", TIME_SCALE)
    address = cluster.address
    await cluster.start()
    try:
        async with cluster_channel(data_dir, config.settings.security, address, CLUSTER) as channel:
            stub = c_grpc.ClusterServiceStub(channel)
            spec = pb.SessionSpec(request_id="r1", user_id="mal", accelerator="gpu-p100", image="gpu:latest")
            s = (await stub.Allocate(c_pb.AllocateRequest(spec=spec), timeout=10)).session
            async for resp in stub.Watch(c_pb.WatchRequest(session_id=s.id), timeout=30):
                if resp.session.state == pb.SESSION_STATE_RUNNING:
                    s = resp.session
                    break
        # Made as a front places it: the fronts' store knows whose session it is (a flag for a
        # session no front made blocks nobody: front/cluster_reports.py).
        store = SqliteStore(data_dir / "front.db")
        FrontRecords(store).remember_request(request_key("mal", "r1"), s.id, CLUSTER, 0.0)
        store.close()
        # The simulated cloud persists in a file, as a real one does; a process reads it at start,
        # so the miner is marked while the cluster is down and seen once it is back.
        await cluster.kill()
        cloud = SimCloud(config.cluster(CLUSTER).sim, ManualClock(), tracer=None,
                         inventory=Inventory(data_dir / f"sim-cloud-{CLUSTER}.db"))
        cloud.mark_miner(s.vm_id, seed=7)
        await cloud.close()
        await cluster.start()
        # Stopped, so that nothing of it changes after the restart: only the restore sends it.
        flag = await until(lambda: asyncio.to_thread(stopped_with_flag, data_dir, s.id), what="flagged and stopped")
        await cluster.kill()  # no front has heard of it
        assert flag[0] == s.id and flag[3] == ["miner_program"] and flag[6] is False

        await cluster.start()
        front = await start_front(config, RealClock(TIME_SCALE), data_dir, address="127.0.0.1:0",
                                  cluster_addresses={CLUSTER: address})
        try:
            await until(lambda: asyncio.to_thread(front.store.blocks.user_block, "mal"), what="the user is blocked")
            assert [d[0] for d in front.store.blocks.abuse_decisions("mal", 10)] == [s.id]
            async with api.AsyncClient(front.address, token=dev_token(data_dir, "local-operator"),
                                       ca=local_ca(data_dir)) as c:
                with pytest.raises(api.UserBlocked):
                    await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
                ended = await c.get_session(s.id)
                assert ended.state is api.SessionState.STOPPED
                assert "stopped for abuse: miner_program" in [h.reason for h in ended.history]
        finally:
            await front.stop(0.5)
    finally:
        await cluster.kill()
