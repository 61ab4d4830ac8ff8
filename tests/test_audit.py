"""The audit log: durable records on SQLite and PostgreSQL, newest first, paged and filtered; read
over gRPC from the front (its own log, or a cluster's) and with `provisioner admin audit`."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from opentelemetry import trace
from opentelemetry.util._once import Once

from provisioner import cli
from provisioner.store.audit_log import MAX_PAGE_SIZE, MAX_TEXT, AuditLog, AuditRecord
from provisioner.common.clock import ManualClock
from provisioner.model.errors import InvalidArgument
from provisioner.store import open_store
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc

DRAIN = "/provisioner.v1.AdminService/DrainCluster"
POLICY = "/provisioner.v1.AdminService/SetPoolPolicy"
CREATE = "/provisioner.v1.SessionService/CreateSession"


@pytest.fixture
def store(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "unused.db")
    yield s
    s.close()


@pytest.fixture
def clock():
    return ManualClock(1_700_000_000.0)


async def fill(log: AuditLog, clock: ManualClock, n: int) -> None:
    """n records one second apart: every third a denied CreateSession by mallory, the others
    drains (ok) and policy changes (NOT_FOUND) by the operator."""
    for i in range(n):
        if i % 3 == 0:
            log.append("mallory", ("user",), CREATE, "user=alice", "denied", f"call {i}")
        elif i % 3 == 1:
            log.append("ops@example.com", ("admin",), DRAIN, "cluster=europe-west4", "ok", f"call {i}")
        else:
            log.append("ops@example.com", ("admin", "service"), POLICY, "cluster=us-central1 pool=gpu-x",
                       "NOT_FOUND", f"call {i}")
        await clock.advance(1.0)


async def test_records_round_trip_newest_first(store, store_url, tmp_path, clock):
    log = AuditLog(store, clock)
    log.append("ops@example.com", ("admin",), DRAIN, "cluster=europe-west4", "ok", "maintenance")
    await clock.advance(5)
    log.append("mallory", (), CREATE, "user=alice", "denied")
    records, token = log.list()
    assert token == ""
    assert records == [
        AuditRecord(1_700_000_005.0, "mallory", (), CREATE, "user=alice", "denied", ""),
        AuditRecord(1_700_000_000.0, "ops@example.com", ("admin",), DRAIN, "cluster=europe-west4", "ok",
                    "maintenance"),
    ]
    # Durable: another connection to the same database (a restarted process) reads the same.
    again = open_store(store_url, tmp_path / "unused.db")
    try:
        assert AuditLog(again, clock).list()[0] == records
    finally:
        again.close()


async def test_pages_cover_every_record_once_in_order(store, clock):
    log = AuditLog(store, clock)
    await fill(log, clock, 23)
    # Two records at the same instant still page apart cleanly.
    log.append("a", (), DRAIN, "cluster=x", "ok", "same instant 1")
    log.append("b", (), DRAIN, "cluster=x", "ok", "same instant 2")
    seen, token, pages = [], "", 0
    while True:
        records, token = log.list(page_size=5, page_token=token)
        assert len(records) <= 5
        seen += records
        pages += 1
        if not token:
            break
    assert pages == 5 and len(seen) == 25
    assert len({r.detail for r in seen}) == 25
    assert [r.time for r in seen] == sorted((r.time for r in seen), reverse=True)
    assert seen[-1].detail == "call 0"


async def test_filters_combine(store, clock):
    log = AuditLog(store, clock)
    await fill(log, clock, 30)
    denied, _ = log.list(outcome="denied", page_size=500)
    assert len(denied) == 10 and {r.identity for r in denied} == {"mallory"}
    drains, _ = log.list(rpc=DRAIN)
    by_method, _ = log.list(rpc="DrainCluster")  # the method alone matches too
    assert len(drains) == 10 and by_method == drains
    assert log.list(rpc="provisioner.v1.AdminService/DrainCluster")[0] == []  # a full name is exact
    ops, _ = log.list(identity="ops@example.com", outcome="NOT_FOUND")
    assert len(ops) == 10 and {r.roles for r in ops} == {("admin", "service")}
    recent, _ = log.list(since=1_700_000_020.0)  # inclusive
    assert [r.detail for r in recent] == [f"call {i}" for i in range(29, 19, -1)]
    window, _ = log.list(since=1_700_000_010.0, until=1_700_000_012.0)  # until is exclusive
    assert [r.detail for r in window] == ["call 11", "call 10"]
    assert log.list(identity="nobody")[0] == []


async def test_page_size_default_cap_and_bad_tokens(store, clock):
    log = AuditLog(store, clock)
    await fill(log, clock, 60)
    records, token = log.list()
    assert len(records) == 50 and token
    assert len(log.list(page_size=10_000)[0]) == 60  # capped at 500, which is more than there are
    assert MAX_PAGE_SIZE == 500
    with pytest.raises(InvalidArgument) as bad:
        log.list(page_size=-1)
    assert bad.value.field == "page_size"
    # Not base64 of JSON; not JSON; [1, 2]; ["1", "x"]; [NaN, "x"]; not ASCII.
    for token in ("not a token!", "bm90IGpzb24", "WzEsIDJd", "WyIxIiwgIngiXQ", "W05hTiwgIngiXQ", "é"):
        with pytest.raises(InvalidArgument) as bad:
            log.list(page_token=token)
        assert bad.value.field == "page_token"


async def test_strings_are_bounded_and_printable(store, clock):
    log = AuditLog(store, clock)
    log.append("x" * 5000, ["r" * 300] * 40, "/svc/" + "m" * 1000, "t\x00arget\nforged line", "denied",
               "d\u2028" * 400)
    (r,), _ = log.list()
    assert len(r.identity) == MAX_TEXT and len(r.rpc) == MAX_TEXT and len(r.detail) == MAX_TEXT
    assert len(r.roles) == 16 and all(len(x) == MAX_TEXT for x in r.roles)
    assert r.target == "t?arget?forged line"
    assert r.detail.startswith("d?d?")


async def test_processes_sharing_a_database_keep_their_own_logs(store, clock):
    front, cluster = AuditLog(store, clock), AuditLog(store, clock, source="europe-west4")
    front.append("ops", ("admin",), DRAIN, "cluster=europe-west4", "ok")
    cluster.append("front", ("front",), DRAIN, "cluster=europe-west4", "ok")
    assert [r.identity for r in front.list()[0]] == ["ops"]
    assert [r.identity for r in cluster.list()[0]] == ["front"]


# ---- over gRPC and from the command line ---------------------------------------------------------


def _logs(fleet):
    """The front's and europe-west4's logs, on the stores the running processes use."""
    clock = fleet.cluster("europe-west4").runtime.clock  # the fleet's one clock
    return AuditLog(fleet.fleet.front.store, clock), AuditLog(fleet.cluster("europe-west4").store, clock,
                                                              source="europe-west4")


async def test_front_serves_its_own_log_and_forwards_a_clusters(local_fleet):
    front_log, cluster_log = _logs(local_fleet)
    for i in range(7):
        front_log.append("ops@example.com", ("admin",), DRAIN, "cluster=europe-west4", "ok", f"front {i}")
    cluster_log.append("front", ("front",), DRAIN, "cluster=europe-west4", "ok", "at the cluster")
    admin = local_fleet.admin

    first = await admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(page_size=4))
    assert [r.detail for r in first.records] == ["front 6", "front 5", "front 4", "front 3"]
    assert first.records[0].rpc == DRAIN and list(first.records[0].roles) == ["admin"]
    assert first.records[0].time.ToNanoseconds() > 0 and first.next_page_token
    rest = await admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(page_size=4,
                                                                         page_token=first.next_page_token))
    assert [r.detail for r in rest.records] == ["front 2", "front 1", "front 0"] and not rest.next_page_token

    there = await admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(cluster="europe-west4"))
    assert [r.detail for r in there.records] == ["at the cluster"]

    since = admin_pb.ListAuditRecordsRequest(rpc="DrainCluster")
    since.since.FromNanoseconds(int((front_log.clock.now() + 3600) * 1e9))
    assert not (await admin.ListAuditRecords(since)).records

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(page_token="garbage!"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(cluster="mars-north1"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_cli_admin_audit_against_a_running_fleet(local_fleet, capsys, monkeypatch):
    # The CLI sets up (and shuts down) its tracing: keep that out of the global tracer provider.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.delenv("PROVISIONER_TRACES", raising=False)
    monkeypatch.setenv("PROVISIONER_DATA_DIR", str(local_fleet.data_dir))  # its CA and token key
    front_log, cluster_log = _logs(local_fleet)
    for i in range(12):
        front_log.append("ops@example.com", ("admin",), DRAIN if i % 2 else POLICY,
                         f"cluster=europe-west4 pool=gpu-p100 n={i}", "ok" if i % 2 else "INVALID_ARGUMENT",
                         f"change {i}")
    front_log.append("mallory", ("user",), DRAIN, "cluster=europe-west4", "denied", "needs the admin role")
    cluster_log.append("front", ("front",), DRAIN, "cluster=europe-west4", "ok", "at the cluster")

    async def run(*argv: str):
        rc = await asyncio.to_thread(cli.main, ["admin", "audit", "--front", local_fleet.front_address, *argv])
        out, err = capsys.readouterr()
        return rc, out, err

    rc, out, err = await run("--outcome", "denied")
    assert rc == 0, err
    header, row = out.splitlines()
    assert header.split() == ["TIME", "IDENTITY", "ROLES", "RPC", "TARGET", "OUTCOME", "DETAIL"]
    assert row.split()[1:5] == ["mallory", "user", "AdminService/DrainCluster", "cluster=europe-west4"]
    assert row.split()[5:] == ["denied", "needs", "the", "admin", "role"]

    # --limit follows pages up to N (here one page of 5), and says when there is more.
    rc, out, err = await run("--rpc", "DrainCluster", "--identity", "ops@example.com", "--limit", "5", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["more"] is True
    assert [r["detail"] for r in doc["records"]] == ["change 11", "change 9", "change 7", "change 5", "change 3"]
    assert doc["records"][0]["rpc"] == DRAIN and doc["records"][0]["time"].endswith("Z")

    rc, out, err = await run("--limit", "600", "--json", "--since", "-1h")
    assert rc == 0, err
    assert len(json.loads(out)["records"]) == 13 and json.loads(out)["more"] is False

    rc, out, err = await run("--cluster", "europe-west4", "--json", "--since", "2020-01-01T00:00:00Z")
    assert [r["detail"] for r in json.loads(out)["records"]] == ["at the cluster"]

    rc, out, err = await run("--since", "2999-01-01")  # nothing yet: only the header
    assert rc == 0 and out.splitlines() == [out.splitlines()[0]] and out.startswith("TIME")

    rc, _, err = await run("--since", "yesterday")
    assert rc == 2 and "ISO 8601" in err
    rc, _, err = await run("--limit", "0")
    assert rc == 2


async def test_records_older_than_the_retention_go_with_a_later_record(store, clock):
    log = AuditLog(store, clock, retention_s=86400.0)
    log.append("ops@example.com", ("admin",), DRAIN, "cluster=europe-west4", "ok", "old")
    await clock.advance(2 * 86400.0)
    log.append("ops@example.com", ("admin",), DRAIN, "cluster=europe-west4", "ok", "new")
    assert [r.detail for r in log.list()[0]] == ["new"]


async def test_unauthenticated_refusals_are_counted_not_written_and_known_callers_leave_their_address(local_fleet):
    """Anyone on the network can send calls without a valid token as fast as they like: those are
    counted (and sampled into the log) but never written one row each. A known caller's refusal is
    on record with the address it came from."""
    from conftest import front_channel
    from provisioner.v1 import session_service_pb2 as s_pb
    from provisioner.v1 import session_service_pb2_grpc as s_grpc

    guard = local_fleet.fleet.front.server.guard
    before = sum(n for (_, code), n in guard.refusals.items() if code == "UNAUTHENTICATED")
    get = s_pb.GetSessionRequest(session_id="us-central1.s-00aa11")
    async with front_channel(local_fleet.data_dir, local_fleet.front_address, token="not-a-token") as ch:
        stub = s_grpc.SessionServiceStub(ch)

        async def refused() -> None:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetSession(get, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

        for _ in range(6):  # 50 at a time: the front holds each refusal a quarter second (common/pacing.py)
            await asyncio.gather(*(refused() for _ in range(50)))
    assert sum(n for (_, code), n in guard.refusals.items() if code == "UNAUTHENTICATED") - before == 300
    async with front_channel(local_fleet.data_dir, local_fleet.front_address, token=local_fleet.token("mallory")) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin_grpc.AdminServiceStub(ch).DrainCluster(admin_pb.DrainClusterRequest(cluster="europe-west4"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    records = (await local_fleet.admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest(page_size=500))).records
    assert [r.identity for r in records] == ["mallory"]
    assert records[0].outcome == "denied" and records[0].peer.startswith("ipv4:127.0.0.1:")
