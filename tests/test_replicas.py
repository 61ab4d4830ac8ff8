"""Two replicas of one cluster provisioner on one PostgreSQL: only the leader acts; SIGKILL it and
the standby takes over once the leader's term is out (seconds), from the same state, without
acting twice on anything.

Both replicas share the simulated cloud's inventory file, which logs every call with the
calling process, so who acted when is visible from outside.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import grpc
import pytest

from conftest import cluster_channel, front_channel
from provisioner.cluster.leader import GRACE_S
from provisioner.config import default_clusters_dir
from provisioner.v1 import cluster_service_pb2 as c_pb
from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import PROVISIONER, free_port, sim_cloud_vms

CLUSTER = "asia-east1"


async def spawn(argv: list[str], log) -> asyncio.subprocess.Process:
    with open(log, "ab") as err:
        return await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=err)


def calls(data_dir) -> list[tuple[float, int, str, str]]:
    db = sqlite3.connect(data_dir / f"sim-cloud-{CLUSTER}.db")
    try:
        return list(db.execute("SELECT wall, pid, op, vm_id FROM calls ORDER BY rowid"))
    finally:
        db.close()


@pytest.mark.timeout(120)
async def test_only_the_leader_acts_and_the_standby_takes_over(tmp_path, postgres):
    url = postgres.new_database()
    data_dir = tmp_path / "data"
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]

    def argv(address: str) -> list[str]:
        return [str(PROVISIONER), "serve", "cluster", "--name", CLUSTER, "--address", address, "--traces", "none",
                "--clusters", str(default_clusters_dir()), "--data-dir", str(data_dir), "--time-scale", "300",
                "--database-url", url]

    leader = await spawn(argv(addresses[0]), tmp_path / "leader.log")
    standby = None
    try:
        line = await asyncio.wait_for(leader.stdout.readline(), 30)
        assert b"listening on" in line, (tmp_path / "leader.log").read_text()
        standby = await spawn(argv(addresses[1]), tmp_path / "standby.log")
        standby_line = asyncio.ensure_future(standby.stdout.readline())

        async with cluster_channel(data_dir, None, addresses[0], CLUSTER) as ch:
            stub = c_grpc.ClusterServiceStub(ch)
            made = []
            for i in range(4):
                spec = pb.SessionSpec(request_id=f"r{i}", user_id=f"u{i}", accelerator="gpu-p100", image="gpu:latest")
                made.append((await stub.Allocate(c_pb.AllocateRequest(spec=spec), timeout=10)).session)
        for _ in range(300):  # the standby starts (imports, connects) and finds the lease taken
            if "standing by" in (tmp_path / "standby.log").read_text():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # the leader works (fills pools, boots VMs); the standby must not
        assert not standby_line.done(), "the standby started serving while the leader was alive"
        assert "standing by" in (tmp_path / "standby.log").read_text()
        before = calls(data_dir)
        assert before and {pid for _, pid, _, _ in before} == {leader.pid}

        leader.kill()
        killed_at = time.time()
        await leader.wait()
        line = await asyncio.wait_for(standby_line, 20)
        took_over_s = time.time() - killed_at
        assert b"listening on" in line, (tmp_path / "standby.log").read_text()
        print(f"standby serving {took_over_s:.2f} s after the leader was killed")
        # It polls once a second, then waits out the leader's term (cluster/leader.py).
        assert took_over_s < GRACE_S + 5

        async with cluster_channel(data_dir, None, addresses[1], CLUSTER) as ch:
            stub = c_grpc.ClusterServiceStub(ch)
            for s in made:  # the same sessions, from the shared database
                got = (await stub.Get(c_pb.GetRequest(request_id=s.spec.request_id, user_id=s.spec.user_id),
                                      timeout=5)).session
                assert got.id == s.id
            await asyncio.sleep(2.0)  # the new leader carries on the work under way
        after = calls(data_dir)
        by_standby = [c for c in after if c[1] == standby.pid]
        assert by_standby, "the new leader never acted"
        assert max(c[0] for c in after if c[1] == leader.pid) < killed_at < min(c[0] for c in by_standby)
        # Work taken over is resumed by id, never started again under a new one: every VM the
        # standby asked to create is either new or one the old leader had begun.
        created = [vm for _, pid, op, vm in after if op == "create"]
        assert len(sim_cloud_vms(data_dir, CLUSTER)) <= len(set(created))
    finally:
        for proc in (leader, standby):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()


def test_file_lease_admits_one_holder(tmp_path):
    from provisioner.cluster.leader import FileLease

    a, b = FileLease(tmp_path / "c.lease"), FileLease(tmp_path / "c.lease")
    assert a.try_acquire() and a.held()
    assert not b.try_acquire()
    a.release()
    assert b.try_acquire()
    b.release()


def test_postgres_lease_admits_one_holder_per_cluster(postgres):
    from provisioner.cluster.leader import PostgresLease

    url = postgres.new_database()
    a, b, other = PostgresLease(url, "c1"), PostgresLease(url, "c1"), PostgresLease(url, "c2")
    try:
        assert a.try_acquire() and a.held()
        # The server ends the session of a leader cut off by a partition within seconds.
        assert a._db.execute("SHOW tcp_keepalives_idle").fetchone()[0] in ("2", "2s")
        assert not b.try_acquire() and other.try_acquire()  # another cluster has its own lease
        a.release()  # the leader's connection ends (as when its process dies)
        deadline = time.monotonic() + 5  # the server frees the lock once it has seen the connection go
        while not b.try_acquire():
            assert time.monotonic() < deadline, "the lock was not freed"
            time.sleep(0.05)
    finally:
        for lease in (a, b, other):
            lease.release()
    assert not PostgresLease("postgresql://nobody@127.0.0.1:1/x", "c1").try_acquire()  # unreachable: not leading


@pytest.mark.timeout(120)
async def test_two_fronts_on_one_postgresql_make_one_session_per_request_id(tmp_path, postgres):
    """Each request id sent to both fronts at once: both answer with the same session, and no
    cluster keeps a second one (a front that placed one after the other front won discards it)."""
    from test_processes import Fleet, Service

    url = postgres.new_database()
    fleet = Fleet(tmp_path)
    second = Service([*fleet.front.argv[:fleet.front.argv.index("--address") + 1], f"127.0.0.1:{free_port()}",
                      *fleet.front.argv[fleet.front.argv.index("--address") + 2:], "--database-url", url],
                     "", tmp_path / "front2.log")
    second.address = second.argv[second.argv.index("--address") + 1]
    fleet.front.argv += ["--database-url", url]
    try:
        await fleet.start()
        await second.start()
        await fleet.wait_routable(second)  # the second front routes only once it has every cluster's capacity
        from provisioner.v1 import session_service_pb2 as s_pb
        from provisioner.v1 import session_service_pb2_grpc as s_grpc

        async with front_channel(fleet.data_dir, fleet.front.address) as a, \
                front_channel(fleet.data_dir, second.address) as b:
            stubs = [s_grpc.SessionServiceStub(a), s_grpc.SessionServiceStub(b)]

            async def both(i: int) -> set[str]:
                # For even i the copies name different home regions, so the two fronts place them in
                # different clusters and one of the two sessions must go.
                regions = ("us-central1", "asia-east1") if i % 2 == 0 else ("europe-west4", "europe-west4")
                specs = [pb.SessionSpec(request_id=f"twin-{i}", user_id=f"u{i}", accelerator="gpu-p100",
                                        image="gpu:latest", region_hint=r, region_required=True) for r in regions]
                answers = await asyncio.gather(*(s.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=15)
                                                 for s, spec in zip(stubs, specs)))
                return {r.session.id for r in answers}

            ids = await asyncio.gather(*(both(i) for i in range(30)))
        assert all(len(s) == 1 for s in ids), [s for s in ids if len(s) > 1]
        stored: dict[str, int] = {}
        for name in ("us-central1", "europe-west4", "asia-east1"):
            db = sqlite3.connect(tmp_path / "data" / f"cluster-{name}.db")
            for (body,) in db.execute("SELECT body FROM sessions"):
                spec, reason = json.loads(body)["spec"], json.loads(body)["reason"]
                if not reason.startswith("discarded:"):  # a discarded duplicate stays on record, ended
                    stored[spec["request_id"]] = stored.get(spec["request_id"], 0) + 1
            db.close()
        assert stored == {f"twin-{i}": 1 for i in range(30)}
    finally:
        await second.kill()
        for s in fleet.services:
            await s.kill()


def test_replicas_sharing_a_sqlite_file_share_its_lease(tmp_path):
    """Replicas with their own data dirs but one SQLite database contend for one lease."""
    from provisioner.cli.serve import make_lease

    url = f"sqlite:///{tmp_path / 'shared' / 'state.db'}"
    a, b = make_lease(url, tmp_path / "a", "c1"), make_lease(url, tmp_path / "b", "c1")
    assert a.try_acquire() and not b.try_acquire()
    own = make_lease(None, tmp_path / "a", "c1")  # a data dir's own database: its own lease
    assert own.try_acquire()
    for lease in (a, b, own):
        lease.release()
