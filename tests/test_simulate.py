"""The trace-driven simulator: replay, scaling, metrics and the `provisioner simulate` command."""

from __future__ import annotations

import json

import pytest

from provisioner.cli import main
from provisioner.config import load_fleet
from provisioner.sim.policies import with_policy
from provisioner.sim.replay import Replay
from provisioner.sim.trace import HEADER, peak_concurrency, read_trace, superimpose, TraceError
from provisioner.sim.parallel import Run

ROWS = [
    "0,u1,interactive,gpu-p100,gpu:v158,us-central1,7200,0",
    "100,u2,batch,gpu-t4x2,gpu:v160,europe-west4,1800,0",
    "300,u3,interactive,gpu-p100,gpu:v150,asia-east1,600,1",
    "900,u4,interactive,gpu-p100,gpu:v160,us-central1,1200,0",
    "5000,u1,batch,gpu-p100,gpu:v158,us-central1,900,0",
]


def write_trace(tmp_path, rows=ROWS):
    path = tmp_path / "trace.csv"
    path.write_text("\n".join([",".join(HEADER), *rows]) + "\n")
    return path


def replay(path, scale=1, seed=0, policy=None, **knobs) -> Replay:
    r = Replay(with_policy(load_fleet(), policy, **knobs), superimpose(read_trace(path), scale, seed), seed=seed)
    r.run()
    return r


def test_same_seed_same_results(tmp_path):
    path = write_trace(tmp_path)
    first, second = replay(path).results(), replay(path).results()
    assert first == second
    assert first["sessions"] == len(ROWS) == first["started"]
    assert sum(first["starts"].values()) == len(ROWS)
    assert 0 < first["assigned_vm_hours"] <= first["vm_hours"]
    assert first["idle_vm_hours"] == pytest.approx(first["vm_hours"] - first["assigned_vm_hours"], abs=0.01)
    assert first["cost_usd"] > 0 and first["bytes_pulled"] > 0
    assert first["wait_p50_s"] <= first["wait_p95_s"] <= first["wait_p99_s"] <= first["wait_max_s"]


def test_a_session_adds_about_its_duration_to_assigned_hours(tmp_path):
    r = replay(write_trace(tmp_path, ["0,u1,batch,gpu-p100,gpu:v160,us-central1,7200,0"]))
    out = r.results()
    # Assigned from the start of its wait (after a cold start at most) to its stop, plus the wipe.
    in_use_h = (7200 - out["wait_max_s"]) / 3600
    assert in_use_h - 0.01 <= out["assigned_vm_hours"] <= 7200 / 3600 + 0.01


def test_abandoned_session_runs_until_the_idle_timeout(tmp_path):
    r = replay(write_trace(tmp_path, ["0,u1,interactive,gpu-p100,gpu:v160,us-central1,1800,1"]))
    idle = load_fleet().settings.sessions.idle_timeout_s
    hours = r.results()["assigned_vm_hours"]
    assert (1800 + idle) / 3600 - 0.3 <= hours <= (1800 + idle) / 3600 + 0.01


def test_in_use_session_outlives_the_idle_timeout(tmp_path):
    # Used for 3 hours, well past the 1-hour idle timeout: the touches keep it alive.
    r = replay(write_trace(tmp_path, ["0,u1,interactive,gpu-p100,gpu:v160,us-central1,10800,0"]))
    assert r.results()["assigned_vm_hours"] >= (10800 - r.results()["wait_max_s"]) / 3600 - 0.01


def test_bad_row_names_its_line(tmp_path):
    path = write_trace(tmp_path, [ROWS[0], "5,u2,interactive,gpu-p100,gpu:v160,us-central1,notanumber,0"])
    with pytest.raises(TraceError, match=r"trace.csv:3: bad row"):
        read_trace(path)
    bad_header = tmp_path / "h.csv"
    bad_header.write_text("arrival,user\n1,u\n")
    with pytest.raises(TraceError, match=r"h.csv:1: expected header"):
        read_trace(bad_header)


def test_scale_copies_with_distinct_users(tmp_path):
    rows = read_trace(write_trace(tmp_path))
    scaled = superimpose(rows, 2, seed=3)
    assert len(scaled) == 2 * len(rows)
    assert len({r.user for r in scaled}) == 2 * len({r.user for r in rows})
    span = max(r.arrival_s for r in rows) - min(r.arrival_s for r in rows) + 1
    assert all(0 <= r.arrival_s < span for r in scaled)
    assert replay(write_trace(tmp_path), scale=2).results()["sessions"] == 2 * len(rows)


def test_cli_prints_json(tmp_path, capsys):
    path = write_trace(tmp_path)
    assert main(["simulate", "--trace", str(path), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--trace", str(path), "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    for key in ("sessions", "vm_hours", "assigned_vm_hours", "fixed_peak_vm_hours", "cost_usd", "fast_start_ratio",
                "exact_start_ratio", "wait_p50_s", "wait_p95_s", "wait_p99_s", "wait_max_s", "idle_vm_hours",
                "bytes_pulled", "wall_s"):
        assert key in first
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second


def test_cli_reports_a_bad_trace(tmp_path, capsys):
    path = write_trace(tmp_path, ["0,u1,interactive,gpu-p100,gpu:v160,mars-north1,60,0"])
    assert main(["simulate", "--trace", str(path)]) == 1
    assert "mars-north1" in capsys.readouterr().err


def test_peak_concurrency_counts_open_sessions_per_pool(tmp_path):
    rows = read_trace(write_trace(tmp_path, [
        "0,u1,interactive,gpu-p100,gpu:v160,us-central1,100,0",
        "50,u2,interactive,gpu-p100,gpu:v160,us-central1,100,0",  # overlaps u1
        "100,u3,interactive,gpu-p100,gpu:v160,us-central1,10,0",  # starts as u1 ends: no overlap with it
        "200,u4,interactive,gpu-p100,gpu:v160,us-central1,10,1",  # abandoned: open for the idle timeout too
        "300,u5,batch,gpu-t4x2,gpu:v160,us-central1,10,0",
    ]))
    assert peak_concurrency(rows, idle_timeout_s=0) == {("us-central1", "gpu-p100"): 2, ("us-central1", "gpu-t4x2"): 1}
    assert peak_concurrency(rows, idle_timeout_s=1000)[("us-central1", "gpu-p100")] == 2


def test_fixed_peak_column_is_the_peak_held_for_the_whole_run(tmp_path):
    out = replay(write_trace(tmp_path)).results()
    assert out["fixed_peak_vms"] == sum(peak_concurrency(read_trace(write_trace(tmp_path)), 3600).values())
    assert out["fixed_peak_vm_hours"] == pytest.approx(out["fixed_peak_vms"] * out["model_hours"], rel=1e-3)


def test_with_policy_overrides_every_pool_and_rejects_unknown_ones():
    fleet = with_policy(load_fleet(), "fixed", warm_vms=5)
    pools = [p for c in fleet.clusters for p in c.pools]
    assert {(p.autoscaler, p.warm_vms) for p in pools} == {("fixed", 5)}
    with pytest.raises(ValueError, match="unknown policy"):
        with_policy(load_fleet(), "magic")


def test_the_standby_switch_turns_the_tier_on_or_off_in_every_pool_whatever_the_policy():
    def standby(**knobs):
        return {p.standby for c in Run("unused.csv", **knobs).fleet().clusters for p in c.pools}

    assert standby(policy="predictive") == {True}  # the shipped sim fleet has the tier
    assert standby(policy="predictive", standby=False) == {False}
    assert standby(policy="headroom") == {False}  # the baselines run without it by default
    assert standby(policy="fixed", standby=True) == {True}


def test_policies_trade_idle_vms_for_start_quality(tmp_path):
    """A steady stream on one pool: more warm VMs cost more VM-hours and never make starts worse."""
    rows = [f"{i * 240},u{i % 7},interactive,gpu-p100,gpu:v160,us-central1,{1800 + (i * 37) % 1200},0"
            for i in range(60)]
    path = write_trace(tmp_path, rows)
    few = replay(path, policy="fixed", warm_vms=0).results()
    many = replay(path, policy="fixed", warm_vms=6).results()
    predictive = replay(path, policy="predictive").results()
    assert few["vm_hours"] < many["vm_hours"]
    assert many["fast_start_ratio"] >= few["fast_start_ratio"]
    assert few["starts"]["cold"] > many["starts"]["cold"]
    assert predictive["vm_hours"] < many["vm_hours"]
    for out in (few, many, predictive):
        assert 0 < out["assigned_vm_hours"] <= out["vm_hours"]


def test_samples_follow_the_run(tmp_path):
    r = replay(write_trace(tmp_path))
    assert r.samples[0].t_s == 0.0 and r.samples[-1].t_s <= r.now
    assert max(s.assigned for s in r.samples) >= 1
    assert all(s.assigned <= s.total and s.warm + s.assigned + s.starting <= s.total for s in r.samples)


def test_cli_prints_a_report_beside_the_fixed_pool_and_the_bound(tmp_path, capsys):
    assert main(["simulate", "--trace", str(write_trace(tmp_path)), "--policy", "headroom", "--headroom", "0.5"]) == 0
    out = capsys.readouterr()
    assert "headroom policy" in out.out and "fixed at peak" in out.out and "lower bound" in out.out
    assert "simulating [" in out.err and "100.0%" in out.err
    assert main(["simulate", "--trace", str(write_trace(tmp_path)), "--wait-probability", "0.7"]) == 2


def test_parallel_replay_adds_up_to_the_same_results(tmp_path):
    from provisioner.sim.parallel import Run, simulate, split

    rows = [f"{i * 97},u{i % 11},interactive,{('gpu-p100', 'gpu-t4x2')[i % 2]},gpu:v{159 + i % 2},"
            f"{('us-central1', 'europe-west4', 'asia-east1')[i % 3]},{900 + (i * 53) % 2400},{i % 5 == 0:d}"
            for i in range(90)]
    run = Run(str(write_trace(tmp_path, rows)), scale=2, seed=4)
    one, two = simulate(run, jobs=1), simulate(run, jobs=2)
    assert one.samples == two.samples and len(one.samples) > 10
    assert one.pools == two.pools and len(one.pools) == 6
    one, two = one.results(), two.results()
    one.pop("events"), two.pop("events")  # each process also counts its own sampling events
    assert one == two and one["sessions"] == 180
    assert split({"a": 50, "b": 30, "c": 20}, 2) == [["a"], ["b", "c"]]
    assert split({"a": 1}, 4) == [["a"]]


def test_cli_writes_the_plot(tmp_path, capsys):
    png = tmp_path / "pool.png"
    assert main(["simulate", "--trace", str(write_trace(tmp_path)), "--plot", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # a drawn chart, not an empty canvas
    assert "plot written to" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(write_trace(tmp_path)), "--plot", str(tmp_path / "no/such/dir.png")]) == 1
    assert "error:" in capsys.readouterr().err


def test_json_names_the_fixed_fleet_at_k_times_the_base_peak(tmp_path, capsys):
    path = write_trace(tmp_path)
    base = sum(peak_concurrency(read_trace(path), 3600.0).values())
    assert main(["simulate", "--trace", str(path), "--scale", "3", "--json", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert base >= 1 and out["scaled_peak_vms"] == 3 * base
    assert out["scaled_peak_vm_hours"] == pytest.approx(3 * base * out["model_hours"], rel=1e-6)
    assert main(["simulate", "--trace", str(path), "--scale", "3"]) == 0
    assert f"fixed at 3 x base peak ({3 * base} VMs)" in capsys.readouterr().out


def test_pool_samples_add_up_to_the_fleet(tmp_path):
    r = replay(write_trace(tmp_path))
    tally = r.tally()
    assert set(tally.pools) == {f"{c.name}/{p}" for c in r.cores for p in c.pools}
    for i, fleet in enumerate(tally.samples):
        pools = [samples[i] for samples in tally.pools.values()]
        assert all(p.t_s == fleet.t_s for p in pools)
        assert sum(p.assigned for p in pools) == fleet.assigned and sum(p.warm for p in pools) == fleet.warm
        assert sum(p.assigned + p.queued for p in pools) == fleet.demand
    assert max(p.wait_max_s for samples in tally.pools.values() for p in samples) >= 0
    assert sum(p.cost_usd_per_h for samples in tally.pools.values() for p in samples) > 0
