"""What watchers of a long queue cost a cluster: every session in the queue watched, as a
notebook backend showing each user their place would, while the queue's head leaves.

    python -m provisioner.perf.watchers [--queued 5000] [--departures 200] [--per-s 100] [--move-report-s S]

Runs one cluster's runtime in this process (the simulated cloud, no store, no gRPC: the cost
before any report is sent), its gpu-p100 pool held at one VM, with `--queued` sessions queued
behind it and a watch open on each. Then the session at the head of the queue stops
`--departures` times, `--per-s` a second, as VMs coming free would take them, and it prints the
reports the watches got (each is a message the cluster would send, the front relay and a client
read) and the CPU time the process spent. `--move-report-s` sets the least time between two
reports of moves to one watch (default the cluster's, MOVE_REPORT_S; 0 reports every move).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from provisioner.common.clock import ManualClock
from provisioner.cloud.sim import SimCloud
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.cluster.watchers import MOVE_REPORT_S
from provisioner.perf.queue import POOL, core
from provisioner.model.records import SessionSpec


async def run(queued: int, departures: int, per_s: float, move_report_s: float) -> dict:
    c = core()
    clock = ManualClock(start=1000.0)
    rt = ClusterRuntime(c, SimCloud(c.config.sim, clock, tracer=None, record_calls=False), clock, None,
                        move_report_s=move_report_s)
    await rt.start()
    image = c.catalog.latest
    sessions = [rt.allocate(SessionSpec(f"burst-{i}", f"user-{i % 200}", POOL, image)) for i in range(queued + 1)]
    reports = 0

    async def watch(session_id: str) -> None:
        nonlocal reports
        async for _ in rt.watchers.watch(session_id):
            reports += 1

    ids = [s.id for s in sessions]  # each read again as the core has it now: a reply is its step's value
    watchers = [asyncio.create_task(watch(s.id)) for s in sessions[1:]]
    await asyncio.sleep(0.1)  # each watch's first report: where it stands
    reports = 0
    cpu, wall = time.process_time(), time.monotonic()
    for n in range(1, departures + 1):
        head = next(s for s in map(c.sessions.get, ids) if s is not None and s.queue_position == 1)
        rt.stop(head.id, "gave up")
        if n % max(1, departures // 4) == 0:
            print(f"  {n}/{departures} departures, {reports} reports so far", file=sys.stderr, flush=True)
        await asyncio.sleep(1 / per_s)
    await asyncio.sleep(move_report_s + 0.1)  # the last moves held back
    while True:  # until every report made is read
        before = reports
        await asyncio.sleep(0.2)
        if reports == before:
            break
    result = {"reports": reports, "cpu_s": round(time.process_time() - cpu, 2),
              "wall_s": round(time.monotonic() - wall, 1)}
    for task in watchers:
        task.cancel()
    await rt.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=5000)
    parser.add_argument("--departures", type=int, default=200)
    parser.add_argument("--per-s", type=float, default=100.0)
    parser.add_argument("--move-report-s", type=float, default=MOVE_REPORT_S)
    args = parser.parse_args(argv)
    if args.queued < args.departures or args.departures < 1 or args.per_s <= 0 or args.move_report_s < 0:
        parser.error("need --queued >= --departures >= 1, --per-s > 0 and --move-report-s >= 0")
    r = asyncio.run(run(args.queued, args.departures, args.per_s, args.move_report_s))
    print(f"{args.queued} watched sessions queued, {args.departures} departures from the head at {args.per_s:g}/s, "
          f"moves reported at most every {args.move_report_s:g} s: {r['reports']} reports, {r['cpu_s']} s of CPU "
          f"in {r['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
