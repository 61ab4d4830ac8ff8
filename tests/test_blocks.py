"""Blocked users: the store's table on SQLite and PostgreSQL, the detector's decision record,
and a blocked user refused at create by a real fleet over gRPC."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.util._once import Once

from provisioner import cli

from provisioner.model import abuse_record
from provisioner import client as api
from provisioner.model.abuse_record import Finding, Verdict
from provisioner.agent.usage import Connection
from provisioner.cli import render_admin
from provisioner.client.credentials import local_ca
from provisioner.common.clock import RealClock
from provisioner.config import load_fleet
from provisioner.front import blocks
from provisioner.cli.serve import start_front
from provisioner.store import open_store
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc

from conftest import TIME_SCALE


@pytest.fixture
def store(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "unused.db")
    yield s
    s.close()


MINER = Finding("miner_program", "process 'xmrig' is the miner xmrig", 100.0, 100.0, 1, process="xmrig")
POOL = Finding("pool_connection", "connected to 203.0.113.7:3333 (a mining pool port) for 240 s", 100.0, 340.0, 5,
               connection=Connection("203.0.113.7", 3333))


# ---- the store -------------------------------------------------------------------------------

def test_a_block_is_kept_until_lifted_and_the_first_one_stands(store):
    assert store.blocks.user_block("eve") is None
    assert store.blocks.block_user("eve", 10.0, "ops@example.com", "mining", "")
    assert not store.blocks.block_user("eve", 20.0, "other-operator", "again", "")  # already blocked
    assert store.blocks.user_block("eve") == ("eve", 10.0, "ops@example.com", "mining", "")
    assert store.blocks.block_user("mal", 30.0, blocks.DETECTOR, "miner_program: ...", '{"findings": []}')
    assert [b[0] for b in store.blocks.blocked_users(10)] == ["mal", "eve"]  # newest first
    assert [b[0] for b in store.blocks.blocked_users(1, offset=1)] == ["eve"]
    assert store.blocks.unblock_user("eve", 40.0, "ops2") == ("eve", 10.0, "ops@example.com", "mining", "")
    assert store.blocks.unblock_user("eve", 41.0, "ops2") is None
    assert store.blocks.user_block("eve") is None and [b[0] for b in store.blocks.blocked_users(10)] == ["mal"]
    # Lifted, kept: blocked again and lifted again, both are in the history, newest first.
    store.blocks.block_user("eve", 50.0, "ops@example.com", "again", "")
    store.blocks.unblock_user("eve", 60.0, "ops3")
    assert store.blocks.lifted_blocks("eve", 10) == [("eve", 50.0, "ops@example.com", "again", "", 60.0, "ops3"),
                                              ("eve", 10.0, "ops@example.com", "mining", "", 40.0, "ops2")]
    assert store.blocks.lifted_blocks("mal", 10) == []


def test_a_decision_is_recorded_once_and_blocks_unless_dry_run(store):
    assert store.blocks.record_abuse_decision("c.s-01", "mal", 50.0, "miner_program", "r", "{}", True, blocks.DETECTOR)
    assert store.blocks.user_block("mal")[2] == blocks.DETECTOR
    # The same flag delivered again after an operator lifted the block: nothing changes.
    assert store.blocks.unblock_user("mal", 55.0, "ops")
    assert not store.blocks.record_abuse_decision("c.s-01", "mal", 60.0, "miner_program", "r", "{}", True, blocks.DETECTOR)
    assert store.blocks.user_block("mal") is None
    # A dry run records, and blocks nobody.
    assert store.blocks.record_abuse_decision("c.s-02", "dan", 70.0, "pool_connection", "r", "{}", False, blocks.DETECTOR)
    assert store.blocks.user_block("dan") is None
    assert store.blocks.abuse_decisions("dan", 10) == [("c.s-02", 70.0, "pool_connection", "r", "{}", False)]
    assert [d[0] for d in store.blocks.abuse_decisions("mal", 10)] == ["c.s-01"]


# ---- the decision record ---------------------------------------------------------------------

def test_a_verdict_becomes_a_bounded_record_with_its_evidence():
    assert abuse_record.decision(Verdict(), "c.s-01", "mal", 5.0, dry_run=False) is None
    d = abuse_record.decision(Verdict((MINER, POOL)), "c.s-01", "mal", 400.0, dry_run=True)
    assert (d.session_id, d.user_id, d.at, d.rules, d.dry_run) == ("c.s-01", "mal", 400.0,
                                                                   ("miner_program", "pool_connection"), True)
    assert d.reason.startswith("miner_program: process 'xmrig'") and "pool_connection" in d.reason
    found = json.loads(d.evidence)["findings"]
    assert found[0] == {"rule": "miner_program", "detail": MINER.detail, "first_at": 100.0, "last_at": 100.0,
                        "samples": 1, "process": "xmrig"}
    assert found[1]["connection"] == "203.0.113.7:3333" and found[1]["samples"] == 5
    # The worst case: every rule fired, with the longest names and details a report could hold.
    huge = [Finding(rule, "x" * 10_000, 1.0, 2.0, 3, process="p" * 500, connection=Connection("2001:db8::1" * 40, 3333))
            for rule in ("miner_program", "pool_connection", "busy_without_activity", "unknown_gpu_program")]
    d = abuse_record.decision(Verdict(tuple(huge)), "c.s-02", "mal", 1.0, dry_run=False)
    assert len(d.evidence) <= abuse_record.MAX_EVIDENCE_CHARS and len(d.reason) <= abuse_record.MAX_REASON_CHARS
    assert len(json.loads(d.evidence)["findings"]) == 4


async def test_applying_a_decision_blocks_once_and_a_dry_run_blocks_nobody(store):
    flagged = abuse_record.decision(Verdict((MINER, POOL)), "c.s-01", "mal", 400.0, dry_run=False)
    assert await blocks.apply(store, flagged)
    assert not await blocks.apply(store, flagged)  # delivered again: nothing new
    assert store.blocks.user_block("mal") == ("mal", 400.0, blocks.DETECTOR, flagged.reason, flagged.evidence)
    assert store.blocks.abuse_decisions("mal", 10) == [("c.s-01", 400.0, "miner_program,pool_connection", flagged.reason,
                                                 flagged.evidence, True)]
    # A user an operator blocked first keeps that block; the decision is recorded beside it.
    store.blocks.block_user("eve", 10.0, "ops@example.com", "ticket 7", "")
    assert await blocks.apply(store, abuse_record.decision(Verdict((MINER,)), "c.s-02", "eve", 500.0, dry_run=False))
    assert store.blocks.user_block("eve")[2:4] == ("ops@example.com", "ticket 7")
    assert store.blocks.abuse_decisions("eve", 10)[0][0] == "c.s-02"
    # Dry run: recorded, nobody blocked.
    assert await blocks.apply(store, abuse_record.decision(Verdict((POOL,)), "c.s-03", "dan", 600.0, dry_run=True))
    assert store.blocks.user_block("dan") is None and store.blocks.abuse_decisions("dan", 10)[0][-1] is False


def test_the_cli_shows_a_block_and_the_decisions_as_text():
    block = admin_pb.UserBlock(user_id="mal", blocked_by=blocks.DETECTOR, reason="miner_program: xmrig")
    block.block_time.FromSeconds(1_795_000_000)
    dry = admin_pb.AbuseDecision(session_id="us-central1.s-01", rules=["pool_connection"], reason="pool", dry_run=True)
    dry.decision_time.FromSeconds(1_795_000_000)
    text = render_admin.user_block_detail("mal", block, [dry])
    assert "blocked: since 2026-11-18T11:06:40Z" in text and "by:      detector" in text
    assert "us-central1.s-01  pool_connection  recorded (dry run)" in text
    assert render_admin.user_block_detail("bob", None, []) == "user:    bob\nblocked: no\nabuse detection: nothing flagged"
    lifted = admin_pb.UserBlock(user_id="mal", blocked_by="ops", reason="ticket 7", lifted_by="ops2")
    lifted.block_time.FromSeconds(1_795_000_000)
    lifted.lift_time.FromSeconds(1_795_003_600)
    text = render_admin.user_block_detail("mal", None, [], [lifted])
    assert "2026-11-18T11:06:40Z  2026-11-18T12:06:40Z  ops  ops2       ticket 7" in text
    assert render_admin.blocked_users_table([block]).splitlines()[1].split() == [
        "mal", "2026-11-18T11:06:40Z", "detector", "miner_program:", "xmrig"]


# ---- at the front, over gRPC ------------------------------------------------------------------

async def test_operators_block_and_unblock_a_user_who_is_refused_meanwhile(local_fleet, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.delenv("PROVISIONER_TRACES", raising=False)
    monkeypatch.setenv("PROVISIONER_DATA_DIR", str(local_fleet.data_dir))  # its CA and token key

    async def admin_user(*argv: str) -> dict:
        rc = await asyncio.to_thread(cli.main, ["admin", "user", *argv, "--json", "--front", local_fleet.front_address])
        out, err = capsys.readouterr()
        assert rc == 0, err
        return json.loads(out)

    # A second front replica on the same store.
    second = await start_front(load_fleet(tmp_path / "clusters"), RealClock(TIME_SCALE), local_fleet.data_dir,
                               address="127.0.0.1:0",
                               cluster_addresses={c.config.name: c.address for c in local_fleet.fleet.clusters})
    try:
        await second.fleet.wait_until_ready(timeout_s=10.0)
        token, ca = local_fleet.token("local-operator"), local_ca(local_fleet.data_dir)
        async with api.AsyncClient(local_fleet.front_address, token=token, ca=ca) as c, \
                api.AsyncClient(second.address, token=token, ca=ca) as other:
            before = await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
            shown = await admin_user("block", "mal", "--reason", "mining on a free GPU (ticket 42)")
            assert (shown["user"], shown["blocked_by"], shown["reason"]) == ("mal", "local-operator",
                                                                             "mining on a free GPU (ticket 42)")
            with pytest.raises(api.UserBlocked) as refused:
                await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
            err = refused.value
            assert isinstance(err, api.PermissionDenied) and err.reason == "USER_BLOCKED"
            assert "an operator" in err.message and "ticket" not in err.message  # the reason is the operators'
            with pytest.raises(api.UserBlocked):  # at every front replica, at once
                await other.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
            # A retry of a create made before the block gets its session; other users are not affected.
            again = await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest",
                                           request_id=before.request_id)
            assert again.id == before.id
            await c.create_session(user_id="bob", accelerator="gpu-p100", image="gpu:latest")

            # A second block keeps the first; show and list see it, with the detector's decisions.
            assert (await admin_user("block", "mal", "--reason", "again"))["reason"] == "mining on a free GPU (ticket 42)"
            store = local_fleet.fleet.front.store
            await blocks.apply(store, abuse_record.decision(Verdict((MINER,)), "us-central1.s-0001", "mal", 500.0, dry_run=False))
            await blocks.apply(store, abuse_record.decision(Verdict((POOL,)), "us-central1.s-0002", "dan", 600.0, dry_run=True))
            shown = await admin_user("show", "mal")
            assert shown["block"]["reason"] == "mining on a free GPU (ticket 42)"
            assert [(d["session"], d["rules"], d["dry_run"]) for d in shown["decisions"]] == [
                ("us-central1.s-0001", ["miner_program"], False)]
            assert shown["decisions"][0]["evidence"]["findings"][0]["process"] == "xmrig"
            dan = await admin_user("show", "dan")  # a dry run: recorded, not blocked
            assert dan["block"] is None and dan["decisions"][0]["dry_run"] is True
            assert [b["user"] for b in (await admin_user("list"))["blocks"]] == ["mal"]

            lifted = await admin_user("unblock", "mal")
            assert lifted["lifted"]["reason"] == "mining on a free GPU (ticket 42)"
            assert (await admin_user("unblock", "mal"))["lifted"] is None
            shown = await admin_user("show", "mal")
            assert shown["block"] is None and [(b["reason"], b["lifted_by"]) for b in shown["past_blocks"]] == [
                ("mining on a free GPU (ticket 42)", "local-operator")]
            await other.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
            assert (await admin_user("list"))["blocks"] == []
    finally:
        await second.stop(0.5)

    # Admins only; the changes audited, the reads not.
    async with local_fleet.front_channel(token=local_fleet.token("mal")) as as_user:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await admin_grpc.AdminServiceStub(as_user).UnblockUser(admin_pb.UnblockUserRequest(user_id="mal"))
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    records = (await local_fleet.admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest())).records
    assert [(r.rpc.rsplit("/", 1)[1], r.target, r.outcome, r.identity) for r in reversed(records)
            if r.rpc.endswith(("/BlockUser", "/UnblockUser"))] == [("BlockUser", "user_id=mal", "ok", "local-operator")] * 2 + \
        [("UnblockUser", "user_id=mal", "ok", "local-operator")] * 2 + [("UnblockUser", "", "denied", "mal")]
    assert not [r for r in records if "GetUserBlock" in r.rpc or "ListBlockedUsers" in r.rpc]


async def test_block_requests_out_of_bounds_and_at_a_cluster_are_refused(local_fleet):
    for call, request, field in (
            ("BlockUser", admin_pb.BlockUserRequest(user_id="u"), "reason"),
            ("BlockUser", admin_pb.BlockUserRequest(user_id="a/b", reason="r"), "user_id"),
            ("BlockUser", admin_pb.BlockUserRequest(user_id="u", reason="x" * 513), "reason"),
            ("UnblockUser", admin_pb.UnblockUserRequest(), "user_id"),
            ("GetUserBlock", admin_pb.GetUserBlockRequest(), "user_id"),
            ("ListBlockedUsers", admin_pb.ListBlockedUsersRequest(page_token="x"), "page_token")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await getattr(local_fleet.admin, call)(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details(), call
    # Blocks are the front's: a cluster refuses the RPCs, even to the front.
    async with local_fleet.cluster_channel("us-central1") as ch:
        for call, request in (("BlockUser", admin_pb.BlockUserRequest(user_id="u", reason="r")),
                              ("ListBlockedUsers", admin_pb.ListBlockedUsersRequest())):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await getattr(admin_grpc.AdminServiceStub(ch), call)(request)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, call


async def test_a_cluster_refuses_new_sessions_of_the_users_the_front_told_it_are_blocked(local_fleet):
    """The front's certificate is not enough for a blocked user's session: a cluster the front told
    of the block refuses an Allocate for that user even when it comes straight to it (a request it
    already made keeps its answer), and takes them again once the block is lifted."""
    from provisioner.v1 import cluster_service_pb2 as c_pb
    from provisioner.v1 import cluster_service_pb2_grpc as c_grpc
    from provisioner.v1 import types_pb2 as pb

    def allocate(request_id: str) -> c_pb.AllocateRequest:
        return c_pb.AllocateRequest(spec=pb.SessionSpec(request_id=request_id, user_id="mal", accelerator="gpu-p100",
                                                        image="gpu:latest"))

    async def refused(stub, request_id: str) -> bool:
        try:
            await stub.Allocate(allocate(request_id), timeout=10)
            return False
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "blocked" in err.details()
            return True

    async with local_fleet.cluster_channel("us-central1") as ch:
        stub = c_grpc.ClusterServiceStub(ch)
        made = (await stub.Allocate(allocate("r1"), timeout=10)).session
        await local_fleet.admin.BlockUser(admin_pb.BlockUserRequest(user_id="mal", reason="mining"), timeout=10)
        for i in range(100):  # the front tells the clusters at once, over the network
            if await refused(stub, f"probe-{i}"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the cluster never refused the blocked user")
        assert (await stub.Allocate(allocate("r1"), timeout=10)).session.id == made.id
        await local_fleet.admin.UnblockUser(admin_pb.UnblockUserRequest(user_id="mal"), timeout=10)
        for _ in range(100):
            if not await refused(stub, "after"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the cluster still refuses after the block was lifted")
