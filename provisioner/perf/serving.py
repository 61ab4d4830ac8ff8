"""The serving path against the ceiling of its stack, as the notebook backend loads it.

    python -m provisioner.perf.serving [--vms 5000] [--runs 3] [--seconds 20] [--quick] [--json]
        [--in-flight 1 8 32] [--workloads create get mix] [--traces file|none] [--disk-cache-gb GB]
        [--data-dir DIR]

Starts, as separate processes, a raw two-hop grpc.aio echo (client -> forwarding process ->
backend process, 200-byte messages, the fleet's TLS) and the front with one cluster (`provisioner
serve`, SQLite, --time-scale 30, a gpu-p100 pool of `--vms` warm VMs so every create is a warm
start). A load generator, a process of its own, then drives each at 1, 8 and 32 calls in flight:
warm CreateSession, GetSession, and the mix (10% create, 70% get, 15% touch, 5% stop); the echo
once per in-flight level and run. Runs are interleaved (every measurement once, then again), and
the table shows medians: calls/s of each, their ratio, the provisioner's p50/p99/max latency,
and each process's CPU (share of one core over the window) and resident memory, and for the
front and the cluster how late their event loops ran a timer due every 0.25 s (p99 and max over
the window, as bucket bounds of `provisioner_event_loop_lag_seconds`, read from the /metrics each
serves). With file
tracing (the default), the create rows also say where a create's time goes, phase by phase, from
the spans written in each window (provisioner/perf/phases.py). Progress on stderr; `--json`
prints one JSON object instead of the table.

Warming the pool up takes a while: every VM prewarms the ~40 releases its disk holds, each pull a
durable write (`--disk-cache-gb` smaller holds fewer; `--data-dir` on a RAM disk writes faster,
but then the numbers leave out the disk's sync, which is most of a create's cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioner.perf import command, fleet, phases, usage
from provisioner.perf.load import WORKLOADS

DEFAULT_VMS = 5000
IN_FLIGHT = (1, 8, 32)
QUICK = {"vms": 200, "runs": 1, "seconds": 3.0, "disk_cache_gb": 30.0}
LABELS = {"create": "CreateSession (warm)", "get": "GetSession", "mix": "mix 10/70/15/5"}


def measure(procs: list[fleet.Proc], load_argv: list[str]) -> dict:
    """Runs one load generator; its result with the CPU share and RSS of each process (the
    servers' and the load's own) over its measured window, and the event loop's lag in each
    process that serves metrics (the front and the cluster)."""
    load = subprocess.Popen([sys.executable, "-m", "provisioner.perf.load", *load_argv], stdout=subprocess.PIPE,
                            stderr=None, text=True)
    try:
        line = load.stdout.readline()
        if line.strip() != "start":
            load.wait()
            raise RuntimeError(f"the load generator failed ({' '.join(load_argv)}): {line.strip()!r}")
        watched = [*procs, fleet.Proc("load", load)]
        before = {p.name: usage.cpu_s(p.pid) for p in watched}
        lag_before = {p.name: usage.lag_buckets(p.metrics_port) for p in watched if p.metrics_port}
        started, started_ns = time.monotonic(), time.time_ns()
        result = json.loads(load.stdout.readline())
        wall = time.monotonic() - started
        result["window_ns"] = [started_ns, time.time_ns()]
        result["processes"] = {p.name: {"cpu": round((usage.cpu_s(p.pid) - before[p.name]) / wall, 3),
                                        "rss_mb": round(usage.rss_mb(p.pid), 1)} for p in watched}
        for p in watched:
            if p.metrics_port:
                result["processes"][p.name] |= usage.lag_between(lag_before[p.name], usage.lag_buckets(p.metrics_port))
        load.wait()  # it stops the sessions it made before exiting
        return result
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()


def median_of(runs: list[dict]) -> dict:
    """Medians of every number, the processes' included; errors and cold starts summed; of the
    event loop's lag, the median p99 and the largest max."""
    out = {k: statistics.median(r[k] for r in runs) for k in ("calls_per_s", "p50_ms", "p99_ms", "max_ms")}
    out["errors"] = sum(r["errors"] for r in runs)
    out["not_warm"] = sum(r.get("not_warm", 0) for r in runs)
    out["processes"] = {name: {k: statistics.median(r["processes"][name][k] for r in runs) for k in ("cpu", "rss_mb")}
                        for name in runs[0]["processes"]}
    for name, p in out["processes"].items():
        lags = [r["processes"][name] for r in runs if r["processes"][name].get("lag_samples")]
        if lags:
            p |= {"lag_samples": sum(lag["lag_samples"] for lag in lags),
                  "lag_p99_ms": statistics.median(lag["lag_p99_ms"] for lag in lags),
                  "lag_max_ms": max(lag["lag_max_ms"] for lag in lags)}
    if all("phases" in r for r in runs):
        out["phases"] = phases.median_summary([r["phases"] for r in runs])
    return out


def run(vms: int, runs: int, seconds: float, in_flight: tuple[int, ...], workloads: tuple[str, ...],
        traces: str, disk_cache_gb: float | None = None, where: str | None = None, sample: float = 1.0) -> dict:
    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="provisioner-perf-", dir=where) as tmp:
        root = Path(tmp)
        front_port, echo_port = fleet.free_port(), fleet.free_port()
        clusters = fleet.write_clusters(root, vms, fleet.free_port(), front_port, disk_cache_gb)
        data_dir, log_dir = root / "data", root / "logs"
        log_dir.mkdir()
        backend_name = fleet.prepare_security(clusters, data_dir)
        progress("starting the echo pair, the cluster and the front ...")
        echo = fleet.start_echo(data_dir, log_dir, f"127.0.0.1:{echo_port}", backend_name)
        procs = echo
        try:
            served = fleet.start_fleet(clusters, data_dir, log_dir, traces, sample)
            procs = echo + served
            started = time.monotonic()
            progress(f"waiting for {vms} warm VMs ...")
            front = f"127.0.0.1:{front_port}"
            subprocess.run([sys.executable, "-m", "provisioner.perf.load", "provisioner", front, str(data_dir),
                            "--workload", "warm", "--vms", str(vms)], stdout=subprocess.DEVNULL, check=True)
            progress(f"  warm after {time.monotonic() - started:.1f} s")
            samples: dict[tuple[str, int], list[dict]] = {}
            spans = data_dir / "traces.jsonl"  # where the fleet's processes write theirs (traces: file)
            for i in range(runs):
                for k in in_flight:
                    progress(f"run {i + 1}/{runs}, {k} in flight: echo ...")
                    r = measure(echo, ["echo", f"127.0.0.1:{echo_port}", str(data_dir), "--in-flight", str(k),
                                       "--seconds", str(seconds)])
                    samples.setdefault(("echo", k), []).append(r)
                    progress(f"  echo: {_brief(r)}")
                    for w in workloads:
                        progress(f"run {i + 1}/{runs}, {k} in flight: {w} ...")
                        written = spans.stat().st_size if spans.exists() else 0
                        r = measure(served, ["provisioner", front, str(data_dir), "--workload", w, "--vms", str(vms),
                                             "--in-flight", str(k), "--seconds", str(seconds)])
                        if w == "create" and traces == "file":
                            time.sleep(2 * fleet.SPANS_DUE_MS / 1000)  # the window's last spans are written
                            r["phases"] = phases.summary(phases.create_phases(
                                phases.spans_after(spans, written), *r["window_ns"]))
                        samples.setdefault((w, k), []).append(r)
                        progress(f"  {w}: {_brief(r)}")
        finally:
            for p in procs:
                p.stop()
    rows = []
    for w in workloads:
        for k in in_flight:
            echo_m, prov_m = median_of(samples[("echo", k)]), median_of(samples[(w, k)])
            rows.append({"workload": w, "in_flight": k, "echo": echo_m, "provisioner": prov_m,
                         "ratio": round(prov_m["calls_per_s"] / echo_m["calls_per_s"], 3) if echo_m["calls_per_s"]
                         else 0.0})
    return {"vms": vms, "runs": runs, "seconds": seconds, "time_scale": fleet.TIME_SCALE, "traces": traces,
            "trace_sample": sample, "disk_cache_gb": disk_cache_gb, "rows": rows}


def _brief(r: dict) -> str:
    return (f"{r['calls_per_s']:.0f} calls/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
            f"max {r['max_ms']:.0f} ms, {r['errors']} errors")


def _usage(measured: dict) -> str:
    def lag(p: dict) -> str:
        return f" lag {_ms(p['lag_p99_ms'])}/{_ms(p['lag_max_ms'])}" if p.get("lag_samples") else ""

    return " ".join(f"{name.removeprefix('echo-')} {p['cpu']:.2f}/{p['rss_mb']:.0f}{lag(p)}"
                    for name, p in measured["processes"].items())


def _ms(bound: float) -> str:
    return f">{usage.LAG_BUCKETS_MS[-1]:g}" if bound == float("inf") else f"{bound:g}"


def table(results: dict) -> str:
    """The results as docs/performance.md shows them."""
    cache = f", {results['disk_cache_gb']:g} GB disk cache" if results["disk_cache_gb"] is not None else ""
    head = (f"medians of {results['runs']} interleaved runs x {results['seconds']:g} s; {results['vms']} warm VMs{cache}, "
            f"x{results['time_scale']:g}, traces: {results['traces']}"
            + (f" ({results['trace_sample']:.0%} of traces recorded)" if results["trace_sample"] < 1 else ""))
    lines = [head, "",
             f"{'workload':<22}{'in flight':>9}{'echo/s':>9}{'prov/s':>9}{'ratio':>7}  {'p50 / p99 / max ms':<22}"
             f"CPU (cores) / RSS (MB) per process, lag: event loop lag p99 / max (ms, bucket bounds)"]
    for row in results["rows"]:
        prov, echo = row["provisioner"], row["echo"]
        latency = f"{prov['p50_ms']:.1f} / {prov['p99_ms']:.1f} / {prov['max_ms']:.0f}"
        notes = "".join(f"  [{prov[k]} {label}]" for k, label in (("errors", "errors"), ("not_warm", "not warm"))
                        if prov[k])
        lines.append(f"{LABELS[row['workload']]:<22}{row['in_flight']:>9}{echo['calls_per_s']:>9.0f}"
                     f"{prov['calls_per_s']:>9.0f}{row['ratio']:>7.2f}  {latency:<22}{_usage(prov)} | echo: "
                     f"{_usage(echo)}{notes}")
    traced = [row for row in results["rows"] if "phases" in row["provisioner"]]
    if traced:
        lines += ["", "where a warm create's time goes (p50 / p90 ms, from the spans; python -m provisioner.perf.phases)",
                  f"{'in flight':>9}" + phases.HEADER]
        lines += [f"{row['in_flight']:>9}" + phases.render(row["provisioner"]["phases"]) for row in traced]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vms", type=int, default=None, help=f"warm VMs in the pool (default {DEFAULT_VMS})")
    parser.add_argument("--runs", type=int, default=None, help="interleaved runs (default 3)")
    parser.add_argument("--seconds", type=float, default=None, help="length of each measurement (default 20)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=list(IN_FLIGHT), help="levels (default 1 8 32)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--traces", choices=["none", "file", "console"], default="file",
                        help="the fleet's trace exporter (default file, as `serve` runs)")
    parser.add_argument("--trace-sample", type=float, default=1.0, metavar="RATIO",
                        help="the share of new traces the fleet records (default 1: every one, as `serve` runs)")
    parser.add_argument("--disk-cache-gb", type=float, default=None,
                        help="each VM's image cache (default the pool's 250: about 40 releases to prewarm)")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="where the fleet's databases go (a fresh directory in DIR; default the system's temp)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: {QUICK['vms']} VMs with {QUICK['disk_cache_gb']:g} GB caches, one run of "
                             f"{QUICK['seconds']:g} s (flags override)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else {"vms": DEFAULT_VMS, "runs": 3, "seconds": 20.0}
    vms, runs, seconds, cache = (base.get(k) if getattr(args, k) is None else getattr(args, k)
                                 for k in ("vms", "runs", "seconds", "disk_cache_gb"))
    if vms < 1 or runs < 1 or seconds <= 0 or min(args.in_flight) < 1:
        parser.error("--vms, --runs, --seconds and --in-flight must be positive")
    if not 0 <= args.trace_sample <= 1:
        parser.error("--trace-sample must be between 0 and 1")
    results = run(vms, runs, seconds, tuple(args.in_flight), tuple(args.workloads), args.traces, cache, args.data_dir,
                  args.trace_sample)
    results["command"] = command("provisioner.perf.serving", argv)
    print(json.dumps(results) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
