"""A hostile neighbour, measured: bob creates and stops a session every 0.5 s while someone on the
same network floods the fleet, one kind of flood at a time, and the table says what each did to
bob's creates against a quiet run of the same length.

    python -m provisioner.perf.floods [--fleet split up] [--seconds 20] [--floods metrics list quota refused idle]

Floods: `metrics` (8 loops scraping the front's and the cluster's /metrics), `list` and `quota`
(a user with 4 loops of ListSessions or GetQuota, over sessions it made beforehand), `refused`
(4 loops of calls with a token that does not check out), `idle` (3,000 TCP connections to the
front's port that never say a word). The fleet runs on the simulated cloud with one cluster and
a warm pool larger than bob needs, split (the front and the cluster as separate processes,
`provisioner serve`) or in one process (`provisioner up`), each in turn with a fresh data dir;
each flood runs in a process of its own, so this one only measures. Progress on stderr; `--json`.

Each flood's process says when it is under way (its first call answered, or, for the idle flood,
its connections open and taken by the front), and the row starts then: it measures the flood, not
the flood's start-up. Bob holds one channel throughout, as a backend does. Each row also times a
new client as it starts, in phases: a bare TCP connect to the port (does the kernel take it), its
channel's own connection until ready (TCP, TLS, HTTP/2) and its first create. The idle row has
new clients made as the flood begins to open its connections (a ramp): `--ramps` of them, the
flood's connections opened and let go before the row's own (where the client's connection falls
among the flood's decides how long it waits).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import yaml

from provisioner.perf import command
from provisioner.perf.fleet import CLUSTER, POOL, free_port, prepare_security, start_fleet, start_up, write_clusters
from provisioner.perf.usage import cpu_s, open_fds

FLOODS = ("metrics", "list", "quota", "refused", "idle")
FLEETS = ("split", "up")
BOB_PERIOD_S = 0.5
LOOPS = 4
METRIC_LOOPS = 8
IDLE_CONNECTIONS = 3000
MALLORY_SESSIONS = 300  # what a list or a quota of the flooding user reads
# A flood process's lines on stdout: OPENING before the idle flood's first connection, UNDER_WAY
# once the flood runs (its first call answered, or all its connections open), its count last.
OPENING, UNDER_WAY = "opening", "under way"
PROBE_TIMEOUT_S = 10.0
RAMPS = 10


def _stubs(front: str, data_dir: Path, token: str | None = None):
    from provisioner.client.credentials import bearer, local_ca
    from provisioner.security.client import dev_token
    from provisioner.v1 import session_service_pb2_grpc as s_grpc

    channel = grpc.aio.secure_channel(front, grpc.ssl_channel_credentials(local_ca(data_dir).read_bytes()))
    return channel, s_grpc.SessionServiceStub(channel), bearer(token or dev_token(data_dir))


async def bob(stub, md, seconds: float) -> list[tuple[float, float]]:
    """Create then stop, every BOB_PERIOD_S, on bob's channel: each create's start (seconds into
    the loop) and latency (ms); a failed one counts as the time it took."""
    creates, began, i = [], time.monotonic(), 0
    end = began + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        took = []
        try:
            await create_and_stop(stub, md, f"bob-{time.time_ns()}-{i}", lambda: took.append(time.monotonic()))
        except grpc.aio.AioRpcError:
            pass
        creates.append((started - began, ((took[0] if took else time.monotonic()) - started) * 1000))
        i += 1
        await asyncio.sleep(max(0.0, BOB_PERIOD_S - (time.monotonic() - started)))
    return creates


async def create_and_stop(stub, md, request_id: str, created=None) -> None:
    """Bob's create, then its stop; `created()` is called between them."""
    from provisioner.v1 import session_service_pb2 as s_pb
    from provisioner.v1 import types_pb2 as pb

    spec = pb.SessionSpec(request_id=request_id, user_id="bob", accelerator=POOL, image="gpu:latest",
                          region_hint=CLUSTER)
    s = (await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10, metadata=md)).session
    if created:
        created()
    await stub.StopSession(s_pb.StopSessionRequest(session_id=s.id), timeout=10, metadata=md)


async def new_client(front: str, data_dir: Path) -> dict:
    """A client arriving now, in ms: `tcp_ms`, a bare TCP connect to the port, closed at once (does
    the kernel take a connection); `ready_ms`, its channel's own connection until ready (TCP, TLS,
    HTTP/2 settings); `create_ms`, its first create; `ms`, the two together, what the client waits.
    A phase that fails counts until it failed, and the phases after it are None (`tcp_ms` too);
    `failed` says why (a timeout, or the RPC's status), None when both phases went through."""
    host, port = front.rsplit(":", 1)
    began, tcp = time.monotonic(), None
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            tcp = round((time.monotonic() - began) * 1000, 1)
    except OSError:
        pass
    marks = [time.monotonic()]  # the start, then the channel ready, then the create answered
    failed = None
    channel, stub, md = _stubs(front, data_dir)
    async with channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), PROBE_TIMEOUT_S)
            marks.append(time.monotonic())
            await create_and_stop(stub, md, f"bob-new-{time.time_ns()}", lambda: marks.append(time.monotonic()))
        except asyncio.TimeoutError:
            failed = f"no channel within {PROBE_TIMEOUT_S:.0f}s"
        except grpc.aio.AioRpcError as e:
            failed = f"{e.code().name}: {e.details()}"
    ms = [round((later - earlier) * 1000, 1) for earlier, later in zip(marks, marks[1:])]
    ready, create = (ms + [None, None])[:2]
    total = (marks[-1] if len(marks) == 3 else time.monotonic()) - marks[0]
    return {"ms": round(total * 1000, 1), "tcp_ms": tcp, "ready_ms": ready, "create_ms": create, "failed": failed}


async def seed_mallory(front: str, data_dir: Path, count: int) -> None:
    """Sessions for the flooding user to list and meter: made and stopped."""
    from provisioner.v1 import session_service_pb2 as s_pb
    from provisioner.v1 import types_pb2 as pb

    channel, stub, md = _stubs(front, data_dir)
    async with channel:
        for i in range(count):
            spec = pb.SessionSpec(request_id=f"mallory-{i}", user_id="mallory", accelerator=POOL, image="gpu:latest")
            for wait in range(120):  # the front may not have heard of the pool yet
                try:
                    s = (await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=30, metadata=md)).session
                    break
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE or wait == 119:
                        raise
                    await asyncio.sleep(0.5)
            await stub.StopSession(s_pb.StopSessionRequest(session_id=s.id), timeout=30, metadata=md)


def say(line: str) -> None:
    print(line, flush=True)


async def until_stdin_closes(seconds: float) -> None:
    """Until the benchmark closes this process's stdin (its row is over), `seconds` at most."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        await asyncio.wait_for(reader.read(), seconds)
    except asyncio.TimeoutError:
        pass


async def idle_flood(front: str, seconds: float) -> int:
    """IDLE_CONNECTIONS TCP connections opened one after another, held without a word."""
    host, port = front.rsplit(":", 1)
    held = []
    say(OPENING)
    for _ in range(IDLE_CONNECTIONS):
        try:
            held.append(socket.create_connection((host, int(port)), timeout=2))
        except OSError:
            break
    say(f"{UNDER_WAY} {len(held)}")
    await until_stdin_closes(seconds)
    for s in held:
        s.close()
    return len(held)


async def flood(kind: str, front: str, metrics_ports: list[int], data_dir: Path, seconds: float) -> int:
    """Runs one flood until stdin closes (`seconds` at most); the calls (or connections) it made."""
    from provisioner.security.client import dev_token
    from provisioner.v1 import session_service_pb2 as s_pb

    if kind == "idle":
        return await idle_flood(front, seconds)
    stop, count = asyncio.ensure_future(until_stdin_closes(seconds)), 0

    def answered() -> None:
        nonlocal count
        count += 1
        if count == 1:
            say(UNDER_WAY)

    async def scrape_loop(port: int) -> None:
        while not stop.done():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                await reader.read()
                writer.close()
            except OSError:
                pass
            answered()

    if kind == "metrics":
        await asyncio.gather(*(scrape_loop(metrics_ports[i % len(metrics_ports)]) for i in range(METRIC_LOOPS)))
        return count
    token = "not-a-token" if kind == "refused" else dev_token(data_dir, "mallory")
    channel, stub, md = _stubs(front, data_dir, token)
    request = s_pb.GetQuotaRequest() if kind == "quota" else s_pb.ListSessionsRequest()
    call = stub.GetQuota if kind == "quota" else stub.ListSessions

    async def rpc_loop() -> None:
        while not stop.done():
            try:
                await call(request, timeout=10, metadata=md)
            except grpc.aio.AioRpcError:
                pass
            answered()
    async with channel:
        await asyncio.gather(*(rpc_loop() for _ in range(LOOPS)))
    return count


def _summary(creates: list[tuple[float, float]]) -> dict:
    """Bob's creates: how many, their p50 and max, and when the slowest began (seconds into the
    row, the flood having started a second before it): a burst shows as a time."""
    if not creates:
        return {"creates": 0, "p50_ms": None, "max_ms": None, "slowest_at_s": None}
    at, slowest = max(creates, key=lambda c: c[1])
    return {"creates": len(creates), "p50_ms": round(statistics.median(ms for _, ms in creates), 1),
            "max_ms": round(slowest, 1), "slowest_at_s": round(at, 1)}


async def start_flood(kind: str, front: str, procs: list, data_dir: Path, seconds: float):
    """Starts flood `kind` in a process of its own and returns once it is under way: the process,
    and for the idle flood its ramp (else None): `client`, a new client made as the flood began
    opening its connections, and `s`, the seconds from then until the front held them all (None
    if not within PROBE_TIMEOUT_S)."""
    listener = procs[0].pid  # the process on the front's port
    before = open_fds(listener)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "provisioner.perf.floods", "--child", kind, "--front", front, "--data-dir", str(data_dir),
        "--seconds", str(seconds + 60), "--metrics-ports", *(str(p.metrics_port) for p in procs),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    line = (await child.stdout.readline()).decode().strip()
    ramp = None
    if line == OPENING:
        began = time.monotonic()
        probe = asyncio.ensure_future(new_client(front, data_dir))
        line = (await child.stdout.readline()).decode().strip()
        opened = int(line.rsplit(" ", 1)[-1]) if line.startswith(UNDER_WAY) else 0
        held = await until(lambda: open_fds(listener) - before >= opened)  # the front takes them from its backlog
        ramp = {"client": await probe, "s": round(time.monotonic() - began, 2) if held else None}
    if not line.startswith(UNDER_WAY):
        child.kill()
        raise RuntimeError(f"the {kind} flood did not get under way: {line!r}")
    return child, ramp


async def until(done, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether `done()` came true within `timeout_s`, looked at every 10 ms."""
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.01)
    return True


async def stop_flood(child) -> int:
    """Ends a flood's process (its stdin closed); the calls or connections it made."""
    child.stdin.close()
    made = int((await child.stdout.read()).split()[-1])
    await child.wait()
    return made


async def earlier_ramps(count: int, front: str, procs: list, data_dir: Path) -> list[dict]:
    """`count` idle floods opened and let go again before the row's own: where a new client's
    connection falls among the flood's decides how long it waits, so one ramp says little."""
    ramps, listener = [], procs[0].pid
    before = open_fds(listener)
    for _ in range(count):
        child, ramp = await start_flood("idle", front, procs, data_dir, 0.0)
        ramps.append(ramp)
        await stop_flood(child)
        await until(lambda: open_fds(listener) <= before + 10)  # the front has closed them too
    return ramps


async def measure_row(kind: str, front: str, procs: list, data_dir: Path, seconds: float, bob_stub,
                      ramps: int) -> dict:
    """One row: flood `kind` (or none, `quiet`) under way, then a new client and bob's loop beside
    it, with the CPU seconds the fleet's processes and the flood's used meanwhile (on one machine
    the flood's own CPU is taken from the fleet's). The idle row has `ramps` ramps, its own last."""
    child, seen = None, None
    if kind != "quiet":
        seen = await earlier_ramps(ramps - 1, front, procs, data_dir) if kind == "idle" else None
        child, ramp = await start_flood(kind, front, procs, data_dir, seconds)
        seen = None if ramp is None else [*seen, ramp]
    fleet_cpu, flood_cpu = sum(cpu_s(p.pid) for p in procs), cpu_s(child.pid) if child else 0.0
    first = await new_client(front, data_dir)
    creates = await bob(*bob_stub, seconds)
    fleet_cpu = sum(cpu_s(p.pid) for p in procs) - fleet_cpu
    made = 0
    if child:
        flood_cpu = cpu_s(child.pid) - flood_cpu
        made = await stop_flood(child)  # the row is over: the flood ends
    # The machine's 1-minute load average as the row ends: a shared machine's other work shows.
    return {"flood": kind, **_summary(creates), "new_client": first, "ramps": seen, "flood_calls": made,
            "fleet_cpu_s": round(fleet_cpu, 1), "flood_cpu_s": round(flood_cpu, 1), "load": round(os.getloadavg()[0], 2)}


async def measure(front: str, procs: list, data_dir: Path, seconds: float, floods: list[str],
                  ramps: int) -> list[dict]:
    """Bob alone, then beside each flood."""
    rows = []
    channel, stub, md = _stubs(front, data_dir)  # bob's, held throughout, as a backend holds its channel
    await bob(stub, md, 1.0)  # connected and warm before the quiet row
    for kind in ["quiet", *floods]:
        print(f"  {kind}: {seconds:g} s of bob{'' if kind == 'quiet' else ' beside the flood'}", file=sys.stderr,
              flush=True)
        rows.append(await measure_row(kind, front, procs, data_dir, seconds, (stub, md), ramps))
        print(f"    {rows[-1]}", file=sys.stderr, flush=True)
    await channel.close()
    quiet = rows[0]["p50_ms"] or 1.0
    for r in rows:
        r["p50_vs_quiet"] = round((r["p50_ms"] or 0) / quiet, 2)
    return rows


def report(rows: list[dict]) -> str:
    def ramp(r: dict) -> str:
        if not r["ramps"]:
            return "-"
        ms = [x["client"]["ms"] for x in r["ramps"]]
        return f"{statistics.median(ms)}, max {max(ms)}"

    lines = ["fleet  flood     bob creates  p50 ms  vs quiet  max ms  new client ms  in the ramp ms  flood calls  "
             "fleet CPU s  flood CPU s  load",
             *(f"{r['fleet']:<6} {r['flood']:<9} {r['creates']:>11}  {r['p50_ms']:>6}  {r['p50_vs_quiet']:>7}x  {r['max_ms']:>6}  "
               f"{r['new_client']['ms']:>13}  {ramp(r):>14}  {r['flood_calls']:>11}  {r['fleet_cpu_s']:>11}  "
               f"{r['flood_cpu_s']:>11}  {r['load']:>4}" for r in rows)]
    return "\n".join(lines)


def run_fleet(kind: str, args) -> list[dict]:
    """Every measurement against one fleet, started afresh in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="provisioner-floods-") as tmp:
        root = Path(tmp)
        front_port = free_port()
        clusters = write_clusters(root, warm_vms=args.warm_vms, cluster_port=free_port(), front_port=front_port,
                                  disk_cache_gb=30)
        fleet = yaml.safe_load((clusters / "fleet.yaml").read_text())
        fleet["rate_limits"].update(creates_per_user_per_s=1000, create_burst_per_user=1000)  # the seeding
        (clusters / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        data_dir = root / "data"
        prepare_security(clusters, data_dir)
        print(f"{kind}: starting the fleet...", file=sys.stderr, flush=True)
        procs = start_fleet(clusters, data_dir, root, traces="none") if kind == "split" else \
            start_up(clusters, data_dir, root, traces="none")
        try:
            front = f"127.0.0.1:{front_port}"
            print(f"seeding {args.mallory_sessions} sessions of the flooding user...", file=sys.stderr, flush=True)
            asyncio.run(seed_mallory(front, data_dir, args.mallory_sessions))
            return asyncio.run(measure(front, procs, data_dir, args.seconds, args.floods, args.ramps))
        finally:
            for proc in procs:
                proc.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m provisioner.perf.floods", description=__doc__.split("\n\n")[0])
    p.add_argument("--fleet", nargs="+", choices=FLEETS, default=list(FLEETS),
                   help="split: the front and the cluster as processes of their own; up: one process (default both)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--floods", nargs="+", choices=FLOODS, default=list(FLOODS))
    p.add_argument("--ramps", type=int, default=RAMPS,
                   help=f"times the idle flood opens its connections, a new client made in each (default {RAMPS})")
    p.add_argument("--json", action="store_true")
    p.add_argument("--warm-vms", type=int, default=200, help="the pool's warm VMs (default 200)")
    p.add_argument("--mallory-sessions", type=int, default=MALLORY_SESSIONS,
                   help=f"sessions the flooding user makes first, for its lists and quotas to read (default {MALLORY_SESSIONS})")
    p.add_argument("--child", choices=FLOODS, help=argparse.SUPPRESS)
    p.add_argument("--front", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--metrics-ports", type=int, nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(asyncio.run(flood(args.child, args.front, args.metrics_ports, args.data_dir, args.seconds)))
        return 0
    rows = []
    for kind in args.fleet:
        rows += [{"fleet": kind, **r} for r in run_fleet(kind, args)]
    results = {"command": command("provisioner.perf.floods", argv), "seconds": args.seconds, "rows": rows}
    print(json.dumps(results, indent=2) if args.json else report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
