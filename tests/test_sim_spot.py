"""Spot capacity in the simulator: the real cluster core on Spot VMs the simulated cloud preempts
at a set rate. A preemption ends an interactive session with its reason and queues a batch one
again; the running price is the Spot one."""

from __future__ import annotations

import json

import pytest

from provisioner.cli import main
from provisioner.config import load_fleet
from provisioner.sim.policies import with_policy
from provisioner.sim.replay import Replay
from provisioner.sim.trace import HEADER, read_trace
from provisioner.sim.spot import with_spot

# Six-hour sessions in one pool: preemptions at one per VM-hour will take most of them.
ROWS = [f"{60 * i},u{i},{'batch' if i % 2 else 'interactive'},gpu-p100,gpu:latest,us-central1,21600,0"
        for i in range(6)]


def trace(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("\n".join([",".join(HEADER), *ROWS]) + "\n")
    return path


def replay(tmp_path, spot: float | None) -> dict:
    fleet = with_spot(with_policy(load_fleet(), "fixed", warm_vms=1, max_vms=12), spot)
    r = Replay(fleet, read_trace(trace(tmp_path)))
    r.run()
    return r.results()


def test_spot_vms_are_preempted_and_cost_less(tmp_path):
    on_demand = replay(tmp_path, None)
    assert on_demand["spot_preemptions"] == 0 and on_demand["spot_preempted_sessions"] == 0
    spot = replay(tmp_path, 1.0)
    assert spot["spot_preemptions"] > 0
    # The interactive sessions preempted end; each batch one preempted is queued again and runs on.
    assert spot["spot_preempted_sessions"] >= spot["requeued"] > 0
    assert spot["requeued_started"] > 0
    assert spot["cost_usd"] < on_demand["cost_usd"]
    pool = load_fleet().cluster("us-central1").pools[0]
    assert pool.name == "gpu-p100"
    spot_pool = pool.model_copy(update={"provisioning_model": "spot"})
    assert spot_pool.running_usd_per_h == round(
        pool.disk_hourly_price_usd + (pool.hourly_price_usd - pool.disk_hourly_price_usd) * pool.spot_price_fraction, 4)


def test_without_spot_a_replay_is_what_it_was(tmp_path):
    # The preemption draws come from a generator of their own: on-demand runs do not change.
    a, b = replay(tmp_path, None), replay(tmp_path, 0.0)
    same = [k for k in a if "cost" not in k]  # a Spot pool is priced as one, preempted or not
    assert {k: a[k] for k in same} == {k: b[k] for k in same}


def test_cli_replays_spot(tmp_path, capsys):
    assert main(["simulate", "--trace", str(trace(tmp_path)), "--policy", "fixed", "--warm-vms", "1",
                 "--spot", "1", "--jobs", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spot_preemptions"] > 0
    assert main(["simulate", "--trace", str(trace(tmp_path)), "--spot", "-1"]) == 2


async def test_the_sim_backend_preempts_a_spot_pool_s_vms_at_its_rate():
    from provisioner.common.clock import ManualClock
    from provisioner.cloud.sim import SimCloud
    from test_sim_cloud import Cfg, ready, spec

    clock = ManualClock()
    on_demand = SimCloud(Cfg(), clock, tracer=None)
    spot = SimCloud(Cfg(), clock, tracer=None, spot_rates={"gpu-p100": 1.0})  # one per VM-hour
    for cloud in (on_demand, spot):
        await ready(cloud, clock, spec())
        assert (await cloud.health("vm-1", "us-central1-a")).healthy  # the draw is made at the first check
    await clock.advance(20 * 3600.0)  # 20 expected preemptions' time
    assert (await on_demand.health("vm-1", "us-central1-a")).healthy
    report = await spot.health("vm-1", "us-central1-a")
    assert (report.healthy, report.detail, report.cause) == (False, "preempted (spot)", "preempted")


# A Spot tier: batch and interactive six-hour sessions in two regions, Spot VMs preempted at one per VM-hour.
TIER_ROWS = [f"{60 * i},u{i},{'batch' if i % 2 else 'interactive'},gpu-p100,gpu:latest,"
             f"{'us-central1' if i < 8 else 'europe-west4'},21600,0" for i in range(12)]


def tier_trace(tmp_path):
    path = tmp_path / "tier.csv"
    path.write_text("\n".join([",".join(HEADER), *TIER_ROWS]) + "\n")
    return path


def test_a_spot_tier_runs_batch_sessions_on_spot_vms_and_requeues_them_when_preempted(tmp_path):
    from provisioner.sim.parallel import Run, results, simulate

    run = Run(str(tier_trace(tmp_path)), policy="fixed", warm_vms=1, spot_tier=1.0)
    tier = results(run, simulate(run, jobs=1))
    assert tier["spot_preemptions"] > 0 and tier["spot_vm_hours"] > 0
    # Only batch sessions ran on Spot VMs: every session a preemption ended was queued again, and ran.
    assert tier["spot_preempted_sessions"] == tier["requeued"] > 0
    assert tier["requeued_started"] == tier["requeued"]
    assert tier["never_started"] == 0
    # The cost by tier adds up to the cost; the same held VM time on demand costs more.
    assert sum(tier["cost_by_tier_usd"].values()) == pytest.approx(tier["cost_usd"], abs=0.03)
    assert tier["cost_by_tier_usd"]["spot"] > 0 and tier["cost_by_tier_usd"]["on_demand"] > 0
    assert tier["assigned_on_demand_cost_usd"] > tier["assigned_cost_usd"]
    # Each cluster draws its own preemptions: two processes give what one gives.
    assert {k: v for k, v in results(run, simulate(run, jobs=2)).items() if k != "events"} == \
        {k: v for k, v in tier.items() if k != "events"}
    on_demand = results(Run(run.trace, policy="fixed", warm_vms=1), simulate(Run(run.trace, policy="fixed",
                                                                                   warm_vms=1)))
    assert "spot_vm_hours" not in on_demand and on_demand["spot_preemptions"] == 0
    assert on_demand["cost_usd"] > tier["cost_usd"]


def test_cli_replays_a_spot_tier(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tier_trace(tmp_path)), "--spot-tier", "1", "--jobs", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spot_preemptions"] > 0 and out["command"].endswith("--spot-tier 1")
    assert main(["simulate", "--trace", str(tier_trace(tmp_path)), "--spot", "1", "--spot-tier", "1"]) == 2


async def test_the_sim_backend_preempts_only_the_spot_vms_of_a_pool_with_a_spot_tier():
    import dataclasses

    from provisioner.common.clock import ManualClock
    from provisioner.cloud.sim import SimCloud
    from test_sim_cloud import Cfg, ready, spec

    clock = ManualClock()
    cloud = SimCloud(Cfg(), clock, tracer=None, spot_rates={"gpu-p100": 1.0}, spot_tiers=frozenset({"gpu-p100"}))
    on_demand, spot = spec(), dataclasses.replace(spec(), vm_id="vm-2", spot=True)
    for s in (on_demand, spot):
        await ready(cloud, clock, s)
        assert (await cloud.health(s.vm_id, s.zone)).healthy
    await clock.advance(20 * 3600.0)
    assert (await cloud.health(on_demand.vm_id, on_demand.zone)).healthy
    assert (await cloud.health(spot.vm_id, spot.zone)).cause == "preempted"
    assert cloud.vms["vm-2"].spot and not cloud.vms["vm-1"].spot


async def test_the_executor_asks_the_backend_for_the_spot_vm_the_core_launched():
    from core_driver import POOL, make_core
    from opentelemetry import trace as otel_trace

    from provisioner.cloud.sim import SimCloud
    from provisioner.cluster.executor import CommandRunner
    from provisioner.common.clock import ManualClock
    from provisioner.decide.commands import Launch

    core = make_core(spot_tier=True)
    clock = ManualClock()
    cloud = SimCloud(core.config.sim, clock, tracer=None)
    executor = CommandRunner(core, cloud, clock, lambda *events: core.handle(*events), otel_trace.NoOpTracer())
    zone = core.pools[POOL].config.zones[0]
    executor.start([Launch(1, "vm-s", POOL, zone, spot=True), Launch(2, "vm-d", POOL, zone)])
    await clock.advance(600.0)
    assert cloud.vms["vm-s"].spot and not cloud.vms["vm-d"].spot
    for task in list(executor.tasks):
        task.cancel()
