"""What operators set (drain, pool policies) is bounded, durable before it is answered, and back
after a restart."""

from __future__ import annotations

import asyncio
import json
import math

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.util._once import Once

from conftest import fleet_config, start_fleet
from provisioner.client.errors import from_rpc_error
from provisioner import cli
from provisioner.common.clock import ManualClock
from provisioner.decide.core import ClusterCore
from provisioner.decide.ids import IdSource
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.model.errors import InvalidArgument
from provisioner.config.cluster import MAX_HEADROOM_FRACTION
from provisioner.decide.policy import merge_policy
from provisioner.cli.serve import make_backend
from provisioner.store import open_store
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import types_pb2 as pb

BASE = {"min_vms": 2, "max_vms": 10, "headroom_fraction": 0.2, "autoscaler": "headroom", "recycle": True}


# ---- the bounds, as a pure function -----------------------------------------------------------

def test_changes_within_bounds_apply_and_none_leaves_a_field():
    assert merge_policy(BASE, {"min_vms": 4, "max_vms": None, "headroom_fraction": 1}, ceiling=20) == \
        {**BASE, "min_vms": 4, "headroom_fraction": 1.0}
    assert merge_policy(BASE, {"max_vms": 20, "min_vms": 20}, ceiling=20)["max_vms"] == 20
    assert merge_policy(BASE, {"min_vms": 0, "max_vms": 0}, ceiling=20)["max_vms"] == 0


@pytest.mark.parametrize("changes, field", [
    ({"headroom_fraction": math.nan}, "policy.headroom_fraction"),
    ({"headroom_fraction": math.inf}, "policy.headroom_fraction"),
    ({"headroom_fraction": -math.inf}, "policy.headroom_fraction"),
    ({"headroom_fraction": -0.1}, "policy.headroom_fraction"),
    ({"headroom_fraction": MAX_HEADROOM_FRACTION * 2}, "policy.headroom_fraction"),
    ({"min_vms": -1}, "policy.min_vms"),
    ({"max_vms": -1}, "policy.max_vms"),
    ({"min_vms": 11}, "policy.min_vms"),  # above the max in effect
    ({"max_vms": 1}, "policy.max_vms"),  # below the min in effect
    ({"min_vms": 5, "max_vms": 4}, "policy.min_vms"),
    ({"max_vms": 21}, "policy.max_vms"),  # over the config file's ceiling
    ({"max_vms": 2_000_000_000, "min_vms": 2_000_000_000}, "policy.max_vms"),
    ({"autoscaler": "magic"}, "policy.autoscaler"),
    ({"warm_vms": 3}, "policy.warm_vms"),  # not a field the API may change
])
def test_out_of_bounds_names_the_field(changes, field):
    with pytest.raises(InvalidArgument) as err:
        merge_policy(BASE, changes, ceiling=20)
    assert err.value.field == field


# ---- the store --------------------------------------------------------------------------------

def test_operator_state_round_trips(store_url, tmp_path):
    store = open_store(store_url, tmp_path / "unused.db")
    try:
        assert store.operator.load_operator_state("europe-west4") == {}
        store.operator.save_operator_state("europe-west4", "", {"draining": True}, 1.0)
        store.operator.save_operator_state("europe-west4", "gpu-p100", {"min_vms": 3, "headroom_fraction": 0.5}, 2.0)
        store.operator.save_operator_state("europe-west4", "gpu-p100", {"min_vms": 4}, 3.0)  # replaces, not merges
        store.operator.save_operator_state("us-central1", "gpu-p100", {"recycle": False}, 4.0)
        again = open_store(store_url, tmp_path / "unused.db")  # another process on the same database
        assert again.operator.load_operator_state("europe-west4") == {"": {"draining": True}, "gpu-p100": {"min_vms": 4}}
        assert again.operator.load_operator_state("us-central1") == {"gpu-p100": {"recycle": False}}
        store.operator.save_operator_state("europe-west4", "", {}, 5.0)  # empty: back to the config file
        assert again.operator.load_operator_state("europe-west4") == {"gpu-p100": {"min_vms": 4}}
        again.close()
    finally:
        store.close()


async def test_a_replica_taking_over_on_the_same_database_restores_drain_and_policy(store_url, tmp_path):
    """The leader writes before it answers; it dies without closing anything (as with SIGKILL); a
    replica opening the same database starts drained, with the pool as the leader left it."""
    fleet = fleet_config(tmp_path)
    clock = ManualClock()

    def replica() -> ClusterRuntime:
        cfg = fleet.cluster("us-central1")
        core = ClusterCore(cfg, fleet.catalog, fleet.settings.sessions, IdSource(cfg.name, 1))
        return ClusterRuntime(core, make_backend(cfg, clock), clock, open_store(store_url, tmp_path / "unused.db"))

    leader = replica()
    await leader.start()
    leader.set_draining(True)
    leader.set_policy("gpu-t4x2", {"min_vms": 0, "headroom_fraction": 1.5, "autoscaler": "headroom"})
    with pytest.raises(InvalidArgument):  # refused before anything is written
        leader.set_policy("gpu-t4x2", {"max_vms": 301})

    standby = replica()
    try:
        await standby.start()
        assert standby.core.draining
        policy = standby.core.pools["gpu-t4x2"].policy
        assert (policy.min_vms, policy.max_vms, policy.headroom_fraction, policy.autoscaler) == (0, 300, 1.5, "headroom")
        assert standby.overrides == {"gpu-t4x2": {"min_vms": 0, "headroom_fraction": 1.5, "autoscaler": "headroom"}}
        assert standby.core.pools["gpu-p100"].policy.min_vms == 2  # untouched: as in the file
    finally:
        for rt in (leader, standby):
            await rt.close()
            rt.store.close()


# ---- over gRPC, and across a restart ------------------------------------------------------------

async def test_set_pool_policy_out_of_bounds_is_invalid_argument(local_fleet):
    for policy, field in [
        (pb.PoolPolicy(headroom_fraction=math.nan), "policy.headroom_fraction"),
        (pb.PoolPolicy(headroom_fraction=math.inf), "policy.headroom_fraction"),
        (pb.PoolPolicy(min_vms=7, max_vms=5), "policy.min_vms"),
        (pb.PoolPolicy(max_vms=401), "policy.max_vms"),  # europe-west4's gpu-p100: max_vms 400, no higher limit
        (pb.PoolPolicy(min_vms=50_000, max_vms=50_000), "policy.max_vms"),  # within the API's limits, over the file's
    ]:
        req = admin_pb.SetPoolPolicyRequest(cluster="europe-west4", pool="gpu-p100", policy=policy)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await local_fleet.admin.SetPoolPolicy(req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, policy
        assert from_rpc_error(err.value).field == field, policy
    pools = await local_fleet.admin.ListPools(admin_pb.ListPoolsRequest(cluster="europe-west4"))
    p100 = next(p for p in pools.pools if p.name == "gpu-p100")
    assert (p100.policy.min_vms, p100.policy.max_vms, p100.policy.headroom_fraction) == (1, 400, 0.2)
    assert local_fleet.cluster("europe-west4").store.operator.load_operator_state("europe-west4") == {}


async def test_drain_and_policy_survive_a_restart_and_reset_undoes_the_policy(tmp_path):
    def with_limit(cluster: dict) -> None:
        for pool in cluster["pools"]:
            pool["max_vms_limit"] = pool["max_vms"] + 100

    config = fleet_config(tmp_path, with_limit)
    data = tmp_path / "data"
    fleet = await start_fleet(config, data)
    try:
        await fleet.admin.DrainCluster(admin_pb.DrainClusterRequest(cluster="europe-west4"))
        await fleet.admin.SetPoolPolicy(admin_pb.SetPoolPolicyRequest(
            cluster="us-central1", pool="gpu-p100",
            policy=pb.PoolPolicy(min_vms=3, max_vms=650, headroom_fraction=0.5, recycle=False)))
    finally:
        await fleet.channel.close()
        await fleet.fleet.stop(0.5)

    fleet = await start_fleet(config, data)
    try:
        assert fleet.cluster("europe-west4").runtime.core.draining
        policy = fleet.cluster("us-central1").runtime.core.pools["gpu-p100"].policy
        assert (policy.min_vms, policy.max_vms, policy.headroom_fraction, policy.recycle) == (3, 650, 0.5, False)
        assert fleet.cluster("us-central1").runtime.core.pools["gpu-t4x2"].policy.max_vms == 300  # untouched

        clusters = {c.name: c for c in (await fleet.admin.ListClusters(admin_pb.ListClustersRequest())).clusters}
        assert clusters["europe-west4"].draining and not clusters["us-central1"].draining
        # The front routes nothing to the drained cluster: not as a preference, not when required.
        s = await fleet.create(region_hint="europe-west4", accelerator="gpu-t4x2")
        assert s.cluster != "europe-west4"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await fleet.create(region_hint="europe-west4", region_required=True)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

        # Undo both: undrain, and reset the pool to its config file; durable too.
        await fleet.admin.UndrainCluster(admin_pb.UndrainClusterRequest(cluster="europe-west4"))
        reset = await fleet.admin.SetPoolPolicy(admin_pb.SetPoolPolicyRequest(
            cluster="us-central1", pool="gpu-p100", reset=True, policy=pb.PoolPolicy(headroom_fraction=0.3)))
        assert (reset.pool.policy.min_vms, reset.pool.policy.max_vms, reset.pool.policy.recycle) == (2, 600, True)
        assert reset.pool.policy.headroom_fraction == 0.3
        store = fleet.cluster("us-central1").store
        assert store.operator.load_operator_state("us-central1") == {"gpu-p100": {"headroom_fraction": 0.3}}
        assert fleet.cluster("europe-west4").store.operator.load_operator_state("europe-west4") == {}
        s = await fleet.create(region_hint="europe-west4", region_required=True)
        assert s.cluster == "europe-west4"
    finally:
        await fleet.channel.close()
        await fleet.fleet.stop(0.5)


async def test_an_override_the_config_no_longer_allows_is_dropped_at_start(tmp_path, caplog):
    config = fleet_config(tmp_path)
    data = tmp_path / "data"
    store = open_store(None, data / "cluster-asia-east1.db")
    store.operator.save_operator_state("asia-east1", "gpu-p100", {"max_vms": 10_000}, 1.0)  # over the ceiling
    store.operator.save_operator_state("asia-east1", "gpu-t4x2", {"min_vms": 3}, 1.0)
    store.operator.save_operator_state("asia-east1", "gpu-gone", {"min_vms": 3}, 1.0)  # a pool no longer there
    store.close()
    fleet = await start_fleet(config, data)
    try:
        pools = fleet.cluster("asia-east1").runtime.core.pools
        assert pools["gpu-p100"].policy.max_vms == config.cluster("asia-east1").pool("gpu-p100").max_vms
        assert pools["gpu-t4x2"].policy.min_vms == 3
        assert "pool gpu-p100 no longer applies" in caplog.text and "pool gpu-gone" in caplog.text
    finally:
        await fleet.channel.close()
        await fleet.fleet.stop(0.5)


async def test_cli_set_policy_then_reset_policy(local_fleet, capsys, monkeypatch):
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # the CLI's tracing stays its own
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.delenv("PROVISIONER_TRACES", raising=False)
    monkeypatch.setenv("PROVISIONER_DATA_DIR", str(local_fleet.data_dir))  # its CA and token key

    async def run(*argv: str):
        rc = await asyncio.to_thread(cli.main, ["admin", *argv, "--front", local_fleet.front_address, "--json"])
        out, err = capsys.readouterr()
        return rc, out, err

    where = ("--cluster", "asia-east1", "--pool", "gpu-t4x2")
    rc, out, err = await run("set-policy", *where, "--min", "2", "--no-recycle")
    assert rc == 0, err
    assert json.loads(out)["policy"]["min_vms"] == 2 and json.loads(out)["policy"]["recycle"] is False
    store = local_fleet.cluster("asia-east1").store
    assert store.operator.load_operator_state("asia-east1") == {"gpu-t4x2": {"min_vms": 2, "recycle": False}}

    rc, _, err = await run("set-policy", *where, "--max", "151")  # over the file's ceiling (max_vms 150)
    assert rc == 1 and "INVALID_ARGUMENT" in err and "policy.max_vms" in err

    rc, out, err = await run("reset-policy", *where)
    assert rc == 0, err
    assert json.loads(out)["policy"]["min_vms"] == 1 and json.loads(out)["policy"]["recycle"] is True
    assert store.operator.load_operator_state("asia-east1") == {}
