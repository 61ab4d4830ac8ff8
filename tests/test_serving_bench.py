"""The serving benchmark in its quickest form: it starts its processes, drives every workload and
prints a well-formed table. What the numbers are is its output, not a test's business."""

from __future__ import annotations

import json
import subprocess
import sys

from provisioner.perf.load import WORKLOADS
from provisioner.perf.usage import lag_between
from provisioner.perf.phases import PHASES
from provisioner.perf.serving import LABELS, table


def test_quick_benchmark_reports_every_workload():
    out = subprocess.run([sys.executable, "-m", "provisioner.perf.serving", "--quick", "--vms", "60", "--seconds", "1.2",
                          "--in-flight", "2", "--json"], capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    assert [(r["workload"], r["in_flight"]) for r in results["rows"]] == [(w, 2) for w in WORKLOADS]
    for row in results["rows"]:
        for side, processes in (("echo", {"echo-forward", "echo-backend", "load"}),
                                ("provisioner", {"front", "cluster", "load"})):
            measured = row[side]
            assert measured["calls_per_s"] > 0 and measured["errors"] == 0
            assert 0 < measured["p50_ms"] <= measured["p99_ms"] <= measured["max_ms"]
            assert set(measured["processes"]) == processes
            assert all(p["cpu"] >= 0 and p["rss_mb"] > 0 for p in measured["processes"].values())
        for name in ("front", "cluster"):  # their event loops' lag, read from the /metrics each serves
            assert "lag_p99_ms" in row["provisioner"]["processes"][name]
        assert row["ratio"] > 0
    create = next(r["provisioner"] for r in results["rows"] if r["workload"] == "create")
    assert create["phases"]["creates"] > 0  # the create runs' spans, cut into phases
    assert all(0 < create["phases"][p]["p50"] <= create["phases"][p]["p90"] for p in PHASES)
    assert "run 1/1, 2 in flight: mix" in out.stderr  # progress while it runs
    rendered = table(results).splitlines()
    for w, line in zip(WORKLOADS, rendered[3:]):
        assert line.startswith(LABELS[w]) and "front " in line and "| echo: forward " in line
    assert rendered[3 + len(WORKLOADS) + 1].startswith("where a warm create's time goes")


def test_a_sampled_run_says_so_and_a_ratio_outside_0_1_is_refused():
    results = {"vms": 10, "runs": 1, "seconds": 1.0, "time_scale": 30.0, "traces": "file", "trace_sample": 0.1,
               "disk_cache_gb": None, "rows": []}
    assert table(results).splitlines()[0].endswith("traces: file (10% of traces recorded)")
    assert "recorded" not in table({**results, "trace_sample": 1.0}).splitlines()[0]
    out = subprocess.run([sys.executable, "-m", "provisioner.perf.serving", "--trace-sample", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--trace-sample must be between 0 and 1" in out.stderr


def test_the_lag_over_a_window_is_read_from_the_histogram_at_its_two_ends():
    inf = float("inf")
    before = {0.001: 10, 0.01: 12, 0.1: 12, 1.0: 12, inf: 12}
    after = {0.001: 110, 0.01: 211, 0.1: 212, 1.0: 212, inf: 212}  # 200 timers: 100 under 1 ms, one 10-100 ms
    assert lag_between(before, after) == {"lag_samples": 200, "lag_p99_ms": 10.0, "lag_max_ms": 100.0}
    assert lag_between(after, after) == {"lag_samples": 0, "lag_p99_ms": None, "lag_max_ms": None}
    assert lag_between(after, {**after, inf: 213})["lag_max_ms"] == inf  # past the largest bucket
