"""What queueing costs the cluster's core: a burst of creates behind a pool that has no VM to
give, then the queue leaving from its head, then the rest of it timing out together.

    python -m provisioner.perf.queue [--creates 10000] [--users 200]

Feeds one shipped cluster's core (its gpu-p100 pool held at one VM, queued sessions failing after
an hour) `--creates` session requests from `--users` users in turn, a hundredth of a model second
apart, as its service would, and prints the core's time per create for each thousand (each one
queued behind the last) and the queue places it moved. Then the session at the head of the queue
stops, again and again until half the queue is left, and it prints the time per stop for each
thousand, the places moved, and the records changed (to write and tell) per stop. Then the hour
passes, and it prints the time of the one step in which the other half fails. Commands are not
carried out: this is the core's cost alone.
"""

from __future__ import annotations

import argparse
import sys
import time

from provisioner.config import load_fleet
from provisioner.decide import events as ev
from provisioner.decide.core import ClusterCore
from provisioner.decide.ids import IdSource
from provisioner.model.records import SessionSpec

CLUSTER, POOL = "us-central1", "gpu-p100"
BLOCK = 1000
QUEUE_TIMEOUT_S = 3600.0


def core() -> ClusterCore:
    fleet = load_fleet()
    c = fleet.cluster(CLUSTER)
    pool = c.pool(POOL).model_copy(update={"autoscaler": "fixed", "min_vms": 1, "max_vms": 1, "standby": False})
    c = c.model_copy(update={"pools": (pool,)})
    sessions = fleet.settings.sessions.model_copy(update={"queue_timeout_s": QUEUE_TIMEOUT_S})
    return ClusterCore(c, fleet.catalog, sessions, IdSource(c.name, 0), priority=fleet.settings.priority,
                       abuse=fleet.settings.abuse)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=200)
    args = parser.parse_args(argv)
    if args.creates < 1 or args.users < 1:
        parser.error("--creates and --users must be at least 1")
    c = core()
    image = c.catalog.latest
    print(f"{'queued':>8}  {'ms per create':>13}  {'positions changed per create':>28}", flush=True)
    now, block_start, moved = 1000.0, time.perf_counter(), 0
    for i in range(1, args.creates + 1):
        now += 0.01
        spec = SessionSpec(request_id=f"burst-{i}", user_id=f"user-{i % args.users}", accelerator=POOL, image=image)
        step = c.handle(ev.SessionRequested(now, spec))
        moved += len(step.sessions) - 1 + len(step.moved)  # besides the new session
        if i % BLOCK == 0 or i == args.creates:
            n = BLOCK if i % BLOCK == 0 else i % BLOCK
            print(f"{len(c.pools[POOL].queue):>8}  {1000 * (time.perf_counter() - block_start) / n:>13.3f}  "
                  f"{moved / n:>28.1f}", flush=True)
            block_start, moved = time.perf_counter(), 0
    now = leave(c, now, until=len(c.pools[POOL].queue) // 2)
    left, started = len(c.pools[POOL].queue), time.perf_counter()
    c.handle(ev.Tick(now + QUEUE_TIMEOUT_S))
    print(f"\nthe other {left - len(c.pools[POOL].queue)} time out together: "
          f"{1000 * (time.perf_counter() - started):.1f} ms in one step", flush=True)
    return 0


def leave(c: ClusterCore, now: float, until: int) -> float:
    """Stops the head of the queue until `until` are left, printing a line per thousand stops;
    the model time after the last."""
    queue = c.pools[POOL].queue
    print(f"\n{'queued':>8}  {'ms per stop':>11}  {'places moved per stop':>21}  {'records changed per stop':>24}",
          flush=True)
    n = moved = changed = 0
    spent = 0.0
    while len(queue) > until:
        head = next(c.sessions[i] for i in queue if c.sessions[i].queue_position == 1)  # not timed
        now += 0.01
        started = time.perf_counter()
        step = c.handle(ev.StopRequested(now, head.id))
        spent += time.perf_counter() - started
        n, moved, changed = n + 1, moved + len(step.moved), changed + len(step.sessions)
        if n == BLOCK or len(queue) == until:
            print(f"{len(queue):>8}  {1000 * spent / n:>11.3f}  {moved / n:>21.1f}  {changed / n:>24.1f}", flush=True)
            n = moved = changed = 0
            spent = 0.0
    return now


if __name__ == "__main__":
    sys.exit(main())
