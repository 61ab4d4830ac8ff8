"""The load generator, a process of its own: `in_flight` callers on one channel, each calling
again as soon as its call returns, for `seconds`.

    python -m provisioner.perf.load echo ADDRESS DATA_DIR --in-flight 8 --seconds 20
    python -m provisioner.perf.load provisioner ADDRESS DATA_DIR --workload create|get|mix|warm --vms N ...

Before the measured window it waits until the pool holds `--vms` warm VMs with the latest
image (`--workload warm` only waits, until the pool is done prewarming too) and makes the
sessions the workload reads; then it prints `start`, runs, prints one JSON
line (calls/s, latencies, errors, creates that were not warm starts) and stops every session it
made, so that the next run finds the pool warm again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import grpc

from provisioner.perf.echo import METHOD, PAYLOAD_BYTES
from provisioner.perf.fleet import CLUSTER, POOL

WORKLOADS = ("create", "get", "mix")
# The mix: share of each call, in order.
MIX = (("create", 0.10), ("get", 0.70), ("touch", 0.15), ("stop", 0.05))
SEEDED_SESSIONS = 32  # what get and the mix read, made before the window
USERS = 200
STEADY_POLLS = 8  # half a second apart


def summary(latencies: list[float], errors: int, seconds: float, **extra) -> dict:
    latencies = sorted(latencies)
    n = len(latencies)

    def ms(q: float) -> float:
        return round(1000 * latencies[min(n - 1, int(n * q))], 2) if n else 0.0

    return {"calls": n, "calls_per_s": round(n / seconds, 1), "p50_ms": ms(0.5), "p99_ms": ms(0.99),
            "max_ms": round(1000 * latencies[-1], 2) if n else 0.0, "errors": errors, **extra}


async def drive(call, in_flight: int, seconds: float) -> tuple[list[float], int]:
    """Runs `call()` from `in_flight` callers for `seconds`; latencies of the calls that
    succeeded and the count of those that failed."""
    latencies: list[float] = []
    errors = 0
    print("start", flush=True)
    end = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal errors
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                await call()
            except grpc.aio.AioRpcError:
                errors += 1
            else:
                latencies.append(time.monotonic() - started)

    await asyncio.gather(*(caller() for _ in range(in_flight)))
    return latencies, errors


def report(result: dict) -> None:
    """The run's one JSON line, which also ends the measured window."""
    print(json.dumps(result), flush=True)


async def echo(address: str, data_dir: Path, in_flight: int, seconds: float) -> None:
    from provisioner.client.credentials import local_ca

    channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(local_ca(data_dir).read_bytes()))
    call = channel.unary_unary(METHOD)
    payload = bytes(PAYLOAD_BYTES)
    await channel.channel_ready()
    latencies, errors = await drive(lambda: call(payload, timeout=10), in_flight, seconds)
    await channel.close()
    report(summary(latencies, errors, seconds))


class Sessions:
    """The provisioner's side: calls through the front as a service (acting for any user)."""

    def __init__(self, address: str, data_dir: Path):
        from provisioner.client.credentials import bearer, local_ca
        from provisioner.security.client import dev_token
        from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
        from provisioner.v1 import session_service_pb2 as s_pb
        from provisioner.v1 import session_service_pb2_grpc as s_grpc
        from provisioner.v1 import types_pb2 as pb

        self.pb, self.s_pb = pb, s_pb
        # The token as call metadata, as a backend holding one token would send it: grpc's call
        # credentials run a Python plugin on a thread for every call.
        self.channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(local_ca(data_dir).read_bytes()))
        self.md = bearer(dev_token(data_dir))
        self.stub = s_grpc.SessionServiceStub(self.channel)
        self.admin = admin_grpc.AdminServiceStub(self.channel)
        self.live: list[str] = []  # sessions made and not stopped
        self.not_warm = 0
        self._ids = iter(range(10**9))
        self._tag = f"{time.time_ns():x}"

    async def wait_warm(self, vms: int, settle: bool, timeout_s: float = 1800.0) -> None:
        """Until the pool holds `vms` warm VMs with the latest image and none booting; with
        `settle`, also done prewarming (idle VMs pull the pool's ranked images: its counts by
        image stay put for a few polls). A progress line on stderr when the count changes."""
        from provisioner.v1 import admin_service_pb2 as a_pb

        deadline, shown, last, steady = time.monotonic() + timeout_s, None, None, 0
        while time.monotonic() < deadline:
            try:
                resp = await self.admin.ListPools(a_pb.ListPoolsRequest(cluster=CLUSTER), timeout=10, metadata=self.md)
            except grpc.aio.AioRpcError as e:  # the front has not reached the cluster yet
                warm, detail, counts = 0, e.code().name, None
            else:
                cap = next(p.capacity for p in resp.pools if p.name == POOL)
                warm = max((c.count for c in cap.warm_by_image), default=0)
                counts = sorted((c.image, c.count) for c in cap.warm_by_image)
                if warm >= vms and cap.booting == 0:
                    steady = steady + 1 if counts == last else 0
                    if steady >= (STEADY_POLLS if settle else 0):
                        return
                detail = f"{cap.booting} booting, {cap.assigned} assigned, {len(counts)} images"
            last = counts
            if warm != shown:
                print(f"  pool: {warm}/{vms} warm with the latest image ({detail})", file=sys.stderr, flush=True)
                shown = warm
            await asyncio.sleep(0.5)
        raise TimeoutError(f"the pool did not settle at {vms} warm VMs in {timeout_s:.0f} s")

    async def create(self) -> None:
        i = next(self._ids)
        spec = self.pb.SessionSpec(request_id=f"perf-{self._tag}-{i}", user_id=f"perf-user-{i % USERS}",
                                   accelerator=POOL, image="gpu:latest", region_hint=CLUSTER)
        resp = await self.stub.CreateSession(self.s_pb.CreateSessionRequest(spec=spec), timeout=10, metadata=self.md)
        self.live.append(resp.session.id)
        if resp.session.start != self.pb.START_KIND_WARM:
            self.not_warm += 1

    async def get(self) -> None:
        await self.stub.GetSession(self.s_pb.GetSessionRequest(session_id=random.choice(self.live)), timeout=10, metadata=self.md)

    async def touch(self) -> None:
        await self.stub.TouchSession(self.s_pb.TouchSessionRequest(session_id=random.choice(self.live)), timeout=10, metadata=self.md)

    async def stop(self) -> None:
        if len(self.live) <= SEEDED_SESSIONS // 2:  # keep enough to read
            return await self.get()
        session_id = self.live.pop(random.randrange(len(self.live)))
        await self.stub.StopSession(self.s_pb.StopSessionRequest(session_id=session_id), timeout=10, metadata=self.md)

    async def mix(self) -> None:
        r, acc = random.random(), 0.0
        for name, share in MIX:
            acc += share
            if r < acc:
                return await getattr(self, name)()
        await self.get()

    async def stop_all(self, in_flight: int = 32) -> None:
        """Stops every session this run made (not measured; how long it took goes to stderr)."""
        pending = self.live
        self.live = []
        count, started = len(pending), time.monotonic()

        async def stopper() -> None:
            while pending:
                session_id = pending.pop()
                try:
                    await self.stub.StopSession(self.s_pb.StopSessionRequest(session_id=session_id), timeout=30, metadata=self.md)
                except grpc.aio.AioRpcError:
                    pass  # ended already (culled); the pool gets it back either way

        await asyncio.gather(*(stopper() for _ in range(in_flight)))
        if count:
            print(f"  stopped the run's {count} sessions in {time.monotonic() - started:.1f} s", file=sys.stderr,
                  flush=True)


async def provisioner(address: str, data_dir: Path, workload: str, vms: int, in_flight: int, seconds: float) -> None:
    sessions = Sessions(address, data_dir)
    try:
        await sessions.wait_warm(vms, settle=workload == "warm")
        if workload == "warm":
            return report({})
        if workload in ("get", "mix"):
            for _ in range(SEEDED_SESSIONS):
                await sessions.create()
            sessions.not_warm = 0
        latencies, errors = await drive(getattr(sessions, workload), in_flight, seconds)
        report(summary(latencies, errors, seconds, not_warm=sessions.not_warm))
    finally:
        await sessions.stop_all()
        await sessions.channel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=["echo", "provisioner"])
    parser.add_argument("address")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--workload", choices=[*WORKLOADS, "warm"], default="create")
    parser.add_argument("--vms", type=int, default=0, help="warm VMs to wait for before the window")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    if args.target == "echo":
        asyncio.run(echo(args.address, args.data_dir, args.in_flight, args.seconds))
    else:
        asyncio.run(provisioner(args.address, args.data_dir, args.workload, args.vms, args.in_flight, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
