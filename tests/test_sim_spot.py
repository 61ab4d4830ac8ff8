"""Spot capacity in the simulator: the real cluster core on Spot VMs the simulated cloud preempts
at a set rate. A preemption ends an interactive session with its reason and queues a batch one
again; the running price is the Spot one."""

from __future__ import annotations

import json

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
