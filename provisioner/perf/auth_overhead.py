"""What TLS and token checks cost on the serving path: warm CreateSession throughput with every
check on, against the same fleet with none (plaintext, no guard), in one run.

    python -m provisioner.perf.auth_overhead [--runs 3] [--seconds 10] [--in-flight 8]

The fleet (the front and one cluster on the simulated cloud, with a pool kept warm far beyond
the load) runs in a process of its own; this process is the client: `--in-flight` concurrent
callers with one channel, each create naming a new request id. Modes alternate run by run, so a
noisy machine hurts both alike; the medians and their ratio are printed. Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from provisioner.perf.fleet import free_port, write_clusters

CLUSTER = "us-central1"
WARM_VMS = 1500  # more than any run creates: every create is a warm start


# ---- the fleet process ------------------------------------------------------------------------

def serve(mode: str, clusters: Path, data_dir: Path) -> None:
    """Runs the front and the cluster in this process until killed; prints `ready` once warm."""
    from provisioner.cli import serve as serving

    if mode == "none":
        _without_security(serving)

    async def main() -> None:
        from provisioner.common.clock import RealClock
        from provisioner.config import load_fleet

        fleet = load_fleet(clusters)
        local = await serving.start_local_fleet(fleet, RealClock(30.0), data_dir)
        core = local.clusters[0].runtime.core
        pool = core.pools["gpu-p100"]
        # Warm, and done prewarming (idle VMs pull the pool's ranked images first): a steady state.
        quiet = 0
        while quiet < 10:
            settled = sum(1 for vm in pool.vms.values() if vm.state.value == "warm" and not vm.pulling)
            quiet = quiet + 1 if settled >= WARM_VMS else 0
            await asyncio.sleep(0.2)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _without_security(serving) -> None:
    """The baseline: plaintext on loopback, and a guard that lets every call through as a
    caller with every role. Only this benchmark's fleet process ever runs like this."""
    from provisioner.api import guard
    from provisioner.security import auth, tls

    everyone = guard.Access(auth.Caller("bench", frozenset({auth.SERVICE, auth.ADMIN, auth.FRONT}), "none"))

    class LetThrough:
        def __init__(self, *args, **kwargs):
            pass

        def wrap(self, method, handler):
            serde = {"request_deserializer": handler.request_deserializer,
                     "response_serializer": handler.response_serializer}
            if handler.unary_unary is not None:
                async def unary(request, context, inner=handler.unary_unary):
                    guard._ACCESS.set(everyone)
                    return await inner(request, context)

                return grpc.unary_unary_rpc_method_handler(unary, **serde)
            if handler.unary_stream is not None:
                async def stream(request, context, inner=handler.unary_stream):
                    guard._ACCESS.set(everyone)
                    async for item in inner(request, context):
                        yield item

                return grpc.unary_stream_rpc_method_handler(stream, **serde)
            return handler

    serving.Guard = LetThrough
    tls.server_credentials = lambda files, require_client_cert: None
    original = serving.ClusterClient.__init__

    def plaintext_client(self, *args, credentials, server_name, **kwargs):
        original(self, *args, credentials=grpc.local_channel_credentials(), server_name=server_name, **kwargs)

    serving.ClusterClient.__init__ = plaintext_client


# ---- the client -------------------------------------------------------------------------------

async def load(address: str, mode: str, data_dir: Path, seconds: float, in_flight: int) -> dict:
    from provisioner.client.credentials import bearer
    from provisioner.security.client import dev_token
    from provisioner.v1 import session_service_pb2 as s_pb
    from provisioner.v1 import session_service_pb2_grpc as s_grpc
    from provisioner.v1 import types_pb2 as pb

    if mode == "none":
        channel = grpc.aio.insecure_channel(address)
        metadata = None
    else:
        ca = (data_dir / "tls" / "ca.pem").read_bytes()
        channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca))
        metadata = bearer(dev_token(data_dir))  # one token, reused, as a real client does
    stub = s_grpc.SessionServiceStub(channel)
    latencies: list[float] = []
    errors = 0
    counter = iter(range(10**9))
    end = time.monotonic() + seconds

    async def caller(k: int) -> None:
        nonlocal errors
        while time.monotonic() < end:
            i = next(counter)
            spec = pb.SessionSpec(request_id=f"bench-{k}-{i}", user_id=f"u{i % 500}", accelerator="gpu-p100",
                                  image="gpu:latest", region_hint=CLUSTER)
            started = time.monotonic()
            try:
                await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10, metadata=metadata)
                latencies.append(time.monotonic() - started)
            except grpc.aio.AioRpcError:
                errors += 1

    await asyncio.gather(*(caller(k) for k in range(in_flight)))
    await channel.close()
    latencies.sort()
    return {"calls_per_s": len(latencies) / seconds, "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)], "errors": errors}


def one_run(mode: str, seconds: float, in_flight: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        front_port = free_port()
        clusters = write_clusters(root, WARM_VMS, free_port(), front_port)
        data_dir = root / "data"
        proc = subprocess.Popen([sys.executable, "-m", "provisioner.perf.auth_overhead", "--serve", mode, str(clusters),
                                 str(data_dir)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PROVISIONER_TRACES": "none"})
        try:
            line = proc.stdout.readline()
            if line.strip() != b"ready":
                raise SystemExit(f"the fleet did not start ({mode})")
            return asyncio.run(load(f"127.0.0.1:{front_port}", mode, data_dir, seconds, in_flight))
        finally:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per mode (default 3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="load per run (default 10)")
    parser.add_argument("--in-flight", type=int, default=8, help="concurrent calls (default 8)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--serve", nargs=3, metavar=("MODE", "CLUSTERS", "DATA_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], Path(args.serve[1]), Path(args.serve[2]))
        return 0
    results: dict[str, list[dict]] = {"secure": [], "none": []}
    for i in range(args.runs):
        for mode in ("secure", "none"):
            print(f"run {i + 1}/{args.runs}: {mode} ...", file=sys.stderr, flush=True)
            r = one_run(mode, args.seconds, args.in_flight)
            print(f"  {r['calls_per_s']:.0f} calls/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                  f"{r['errors']} errors", file=sys.stderr, flush=True)
            results[mode].append(r)
    med = {mode: {k: statistics.median(r[k] for r in runs) for k in ("calls_per_s", "p50_ms", "p99_ms")}
           for mode, runs in results.items()}
    overhead = 1 - med["secure"]["calls_per_s"] / med["none"]["calls_per_s"]
    if args.json:
        print(json.dumps({"median": med, "runs": results, "throughput_overhead": overhead}))
    else:
        print(f"warm CreateSession, {args.in_flight} in flight, median of {args.runs} x {args.seconds:g} s:")
        for mode, label in (("none", "plaintext, no checks"), ("secure", "TLS + mTLS + token checks")):
            m = med[mode]
            print(f"  {label:<27} {m['calls_per_s']:7.0f} calls/s   p50 {m['p50_ms']:6.1f} ms   "
                  f"p99 {m['p99_ms']:6.1f} ms")
        print(f"  throughput overhead of security: {overhead:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
