"""Blocked users: the store's table on SQLite and PostgreSQL, the detector's decision record,
and a blocked user refused at create by a real fleet over gRPC."""

from __future__ import annotations

import json

import pytest

from provisioner import client as api
from provisioner.abuse import Finding, Verdict
from provisioner.agent.usage import Connection
from provisioner.client.credentials import local_ca
from provisioner.front import blocks
from provisioner.store import open_store


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
    assert store.user_block("eve") is None
    assert store.block_user("eve", 10.0, "ops@example.com", "mining", "")
    assert not store.block_user("eve", 20.0, "other-operator", "again", "")  # already blocked
    assert store.user_block("eve") == ("eve", 10.0, "ops@example.com", "mining", "")
    assert store.block_user("mal", 30.0, blocks.DETECTOR, "miner_program: ...", '{"findings": []}')
    assert [b[0] for b in store.blocked_users(10)] == ["mal", "eve"]  # newest first
    assert [b[0] for b in store.blocked_users(1, offset=1)] == ["eve"]
    assert store.unblock_user("eve") and not store.unblock_user("eve")
    assert store.user_block("eve") is None and [b[0] for b in store.blocked_users(10)] == ["mal"]


def test_a_decision_is_recorded_once_and_blocks_unless_dry_run(store):
    assert store.record_abuse_decision("c.s-01", "mal", 50.0, "miner_program", "r", "{}", True, blocks.DETECTOR)
    assert store.user_block("mal")[2] == blocks.DETECTOR
    # The same flag delivered again after an operator lifted the block: nothing changes.
    assert store.unblock_user("mal")
    assert not store.record_abuse_decision("c.s-01", "mal", 60.0, "miner_program", "r", "{}", True, blocks.DETECTOR)
    assert store.user_block("mal") is None
    # A dry run records, and blocks nobody.
    assert store.record_abuse_decision("c.s-02", "dan", 70.0, "pool_connection", "r", "{}", False, blocks.DETECTOR)
    assert store.user_block("dan") is None
    assert store.abuse_decisions("dan", 10) == [("c.s-02", 70.0, "pool_connection", "r", "{}", False)]
    assert [d[0] for d in store.abuse_decisions("mal", 10)] == ["c.s-01"]


# ---- the decision record ---------------------------------------------------------------------

def test_a_verdict_becomes_a_bounded_record_with_its_evidence():
    assert blocks.decision(Verdict(), "c.s-01", "mal", 5.0, dry_run=False) is None
    d = blocks.decision(Verdict((MINER, POOL)), "c.s-01", "mal", 400.0, dry_run=True)
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
    d = blocks.decision(Verdict(tuple(huge)), "c.s-02", "mal", 1.0, dry_run=False)
    assert len(d.evidence) <= blocks.MAX_EVIDENCE_CHARS and len(d.reason) <= blocks.MAX_REASON_CHARS
    assert len(json.loads(d.evidence)["findings"]) == 4


# ---- at the front, over gRPC ------------------------------------------------------------------

async def test_a_blocked_user_is_refused_new_sessions_until_unblocked(local_fleet):
    store = local_fleet.fleet.front.store
    async with api.AsyncClient(local_fleet.front_address, token=local_fleet.token("local-operator"),
                               ca=local_ca(local_fleet.data_dir)) as c:
        before = await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
        store.block_user("mal", 100.0, blocks.DETECTOR, "miner_program: process 'xmrig'", "{}")
        with pytest.raises(api.UserBlocked) as refused:
            await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
        err = refused.value
        assert isinstance(err, api.PermissionDenied) and err.reason == "USER_BLOCKED"
        assert "abuse detection" in err.message and "xmrig" not in err.message  # no evidence to the user
        # A retry of a create made before the block gets its session; other users are not affected.
        again = await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest",
                                       request_id=before.request_id)
        assert again.id == before.id
        await c.create_session(user_id="bob", accelerator="gpu-p100", image="gpu:latest")
        # Lifted: the next create is placed.
        store.unblock_user("mal")
        await c.create_session(user_id="mal", accelerator="gpu-p100", image="gpu:latest")
