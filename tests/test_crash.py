"""Crash recovery: SIGKILL the cluster process at random moments under load, 20 times.

The cluster runs as its own process on the simulated cloud, whose VMs persist in a file under
the data dir like a real cloud's. Clients keep creating and stopping sessions. After every kill
the store must hold every acknowledged session, with no VM serving two sessions; after every
restart each acknowledged session is there through the API, and an acknowledged stop is never
undone. At the end, once the cluster has reconciled, its records and the cloud agree: no VM is
leaked and no record points to a VM that does not exist.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections import Counter

import grpc
import pytest

from conftest import cluster_channel
from provisioner.config import default_clusters_dir
from provisioner.v1 import cluster_service_pb2 as c_pb
from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import PROVISIONER, Service, free_port, sim_cloud_vms

CLUSTER = "us-central1"
KILLS = 20
LIVE = ("provisioning", "pulling_image", "running")
STOPPED_PB = (pb.SESSION_STATE_STOPPING, pb.SESSION_STATE_STOPPED)
AT_REST = ("warm", "standby", "deleted")  # a VM no session holds and no cloud work is under way on
CALLS_AT_ONCE = 16  # the checks after a restart and the last stops: hundreds of calls, a few at a time


async def at_most(n: int, coroutines: list) -> None:
    """Awaits every coroutine, `n` at a time (each starts its call when awaited); the first
    failure fails the test."""
    gate = asyncio.Semaphore(n)

    async def one(coroutine):
        async with gate:
            await coroutine

    await asyncio.gather(*(one(c) for c in coroutines))


def read_store(data_dir) -> tuple[dict, dict]:
    db = sqlite3.connect(data_dir / f"cluster-{CLUSTER}.db")
    try:
        sessions = {json.loads(b)["spec"]["request_id"]: json.loads(b) for (b,) in db.execute("SELECT body FROM sessions")}
        vms = {json.loads(b)["id"]: json.loads(b) for (b,) in db.execute("SELECT body FROM vms")}
        return sessions, vms
    finally:
        db.close()


def check_store(data_dir, acked: dict[str, str], stopped: set[str]) -> None:
    sessions, vms = read_store(data_dir)
    missing = [rid for rid in acked if rid not in sessions]
    assert not missing, f"acknowledged sessions lost: {missing[:5]}"
    assert all(sessions[rid]["id"] == sid for rid, sid in acked.items())
    assert all(sessions[rid]["state"] in ("stopping", "stopped") for rid in stopped)
    assigned = Counter(v["session_id"] for v in vms.values() if v["state"] == "assigned" and v["session_id"])
    assert [sid for sid, n in assigned.items() if n > 1] == [], "a VM assigned to two sessions"
    on = Counter(s["vm_id"] for s in sessions.values() if s["state"] in LIVE and s["vm_id"])
    assert [vm for vm, n in on.items() if n > 1] == [], "two live sessions on one VM"
    for s in sessions.values():
        if s["state"] == "running":
            vm = vms[s["vm_id"]]
            assert vm["state"] == "assigned" and vm["session_id"] == s["id"], (s["id"], vm["state"])


@pytest.mark.timeout(300)
async def test_sigkill_at_random_moments_loses_nothing_and_leaks_nothing(tmp_path):
    data_dir = tmp_path / "data"
    address = f"127.0.0.1:{free_port()}"
    service = Service([str(PROVISIONER), "serve", "cluster", "--name", CLUSTER, "--address", address,
                       "--traces", "none", "--clusters", str(default_clusters_dir()), "--data-dir", str(data_dir),
                       "--time-scale", "300"], address, tmp_path / "cluster.log")
    rng = random.Random(2026)
    acked: dict[str, str] = {}  # request id -> session id, for every create that was answered
    stopped: set[str] = set()  # request ids whose stop was answered
    users: dict[str, str] = {}  # request id -> its user (request ids are scoped by user)
    counter = iter(range(1_000_000))

    async def worker(stub, k: int, stop: asyncio.Event) -> None:
        wrng = random.Random(k * 7919 + len(acked))
        while not stop.is_set():
            try:
                if acked and wrng.random() < 0.3:
                    rid = wrng.choice(list(acked))
                    await stub.Stop(c_pb.StopRequest(session_id=acked[rid], reason="done"), timeout=5)
                    stopped.add(rid)
                else:
                    rid = f"crash-{next(counter)}"
                    users[rid] = f"u{wrng.randrange(40)}"
                    spec = pb.SessionSpec(request_id=rid, user_id=users[rid],
                                          accelerator=wrng.choice(("gpu-p100", "gpu-t4x2")),
                                          image=wrng.choice(("gpu:latest", "gpu:v150", "gpu:v158")))
                    resp = await stub.Allocate(c_pb.AllocateRequest(spec=spec), timeout=5)
                    acked[rid] = resp.session.id
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.01)  # the process is being killed: not acknowledged
            await asyncio.sleep(wrng.uniform(0.0, 0.02))

    try:
        for round_ in range(KILLS):
            await service.start()
            async with cluster_channel(data_dir, None, address, CLUSTER) as ch:
                stub = c_grpc.ClusterServiceStub(ch)
                async def still_there(rid: str, sid: str) -> None:  # everything acknowledged before
                    got = (await stub.Get(c_pb.GetRequest(request_id=rid, user_id=users[rid]), timeout=5)).session
                    assert got.id == sid
                    if rid in stopped:
                        assert got.state in STOPPED_PB

                await at_most(CALLS_AT_ONCE, [still_there(rid, sid) for rid, sid in acked.items()])
                stop = asyncio.Event()
                workers = [asyncio.create_task(worker(stub, k, stop)) for k in range(4)]
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                await service.kill()  # SIGKILL, mid-whatever
                stop.set()
                await asyncio.gather(*workers)
            check_store(data_dir, acked, stopped)
        print(f"{KILLS} kills; {len(acked)} sessions acknowledged, {len(stopped)} stops")
        assert len(acked) >= 200

        # Last start: the cluster reconciles. Every session is stopped so the pools come to rest,
        # then its records and the cloud must agree VM for VM.
        await service.start()
        async with cluster_channel(data_dir, None, address, CLUSTER) as ch:
            stub = c_grpc.ClusterServiceStub(ch)

            async def stop_it(sid: str) -> None:  # a coroutine: the call starts once at_most lets it
                await stub.Stop(c_pb.StopRequest(session_id=sid, reason="test over"), timeout=5)

            await at_most(CALLS_AT_ONCE, [stop_it(sid) for rid, sid in acked.items() if rid not in stopped])
        deadline = time.monotonic() + 90
        while True:
            before = sim_cloud_vms(data_dir, CLUSTER)
            _, vms = read_store(data_dir)
            cloud = sim_cloud_vms(data_dir, CLUSTER)
            records = {vid for vid, v in vms.items() if v["state"] != "deleted"}
            settled = before == cloud and all(v["state"] in AT_REST for v in vms.values())
            if (settled and records == cloud) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        unsettled = {vid: (v["state"], v["reason"]) for vid, v in vms.items() if v["state"] not in AT_REST}
        assert unsettled == {}, "VMs still busy with every session stopped"
        assert cloud - records == set(), "VMs in the cloud that no record claims (leaked)"
        assert records - cloud == set(), "records pointing to VMs the cloud does not have"
    finally:
        await service.kill()
