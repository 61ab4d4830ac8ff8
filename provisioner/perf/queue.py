"""What queueing costs the cluster's core: a burst of creates behind a pool that has no VM to
give, then the queue leaving from its head, then the rest of it timing out together.

    python -m provisioner.perf.queue [--creates 10000] [--users 200] [--json]

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
import json
import sys
import time
from typing import Callable

from provisioner.config import load_fleet
from provisioner.decide import events as ev
from provisioner.decide.core import ClusterCore
from provisioner.decide.ids import IdSource
from provisioner.model.records import SessionSpec
from provisioner.perf import command

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
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout, when done, instead")
    args = parser.parse_args(argv)
    if args.creates < 1 or args.users < 1:
        parser.error("--creates and --users must be at least 1")
    out = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    results = burst(core(), args.creates, args.users, out)
    if args.json:
        print(json.dumps({**results, "command": command("provisioner.perf.queue", argv)}))
    return 0


def burst(c: ClusterCore, creates: int, users: int, out: Callable[[str], None]) -> dict:
    """The three phases; each line as it is measured to `out`; every figure."""
    image = c.catalog.latest
    out(f"{'queued':>8}  {'ms per create':>13}  {'positions changed per create':>28}")
    now, block_start, moved, blocks = 1000.0, time.perf_counter(), 0, []
    for i in range(1, creates + 1):
        now += 0.01
        spec = SessionSpec(request_id=f"burst-{i}", user_id=f"user-{i % users}", accelerator=POOL, image=image)
        step = c.handle(ev.SessionRequested(now, spec))
        moved += len(step.sessions) - 1 + len(step.moved)  # besides the new session
        if i % BLOCK == 0 or i == creates:
            n = BLOCK if i % BLOCK == 0 else i % BLOCK
            b = {"queued": len(c.pools[POOL].queue), "ms_per_create": 1000 * (time.perf_counter() - block_start) / n,
                 "moved_per_create": moved / n}
            blocks.append(b)
            out(f"{b['queued']:>8}  {b['ms_per_create']:>13.3f}  {b['moved_per_create']:>28.1f}")
            block_start, moved = time.perf_counter(), 0
    now, stops = leave(c, now, len(c.pools[POOL].queue) // 2, out)
    left, started = len(c.pools[POOL].queue), time.perf_counter()
    c.handle(ev.Tick(now + QUEUE_TIMEOUT_S))
    expired = {"sessions": left - len(c.pools[POOL].queue), "ms": 1000 * (time.perf_counter() - started)}
    out(f"\nthe other {expired['sessions']} time out together: {expired['ms']:.1f} ms in one step")
    return {"creates": blocks, "stops": stops, "expired": expired}


def leave(c: ClusterCore, now: float, until: int, out: Callable[[str], None]) -> tuple[float, list[dict]]:
    """Stops the head of the queue until `until` are left, a line per thousand stops; the model
    time after the last, and each thousand's figures."""
    queue = c.pools[POOL].queue
    out(f"\n{'queued':>8}  {'ms per stop':>11}  {'places moved per stop':>21}  {'records changed per stop':>24}")
    n = moved = changed = 0
    spent, blocks = 0.0, []
    while len(queue) > until:
        head = next(c.sessions[i] for i in queue if c.sessions[i].queue_position == 1)  # not timed
        now += 0.01
        started = time.perf_counter()
        step = c.handle(ev.StopRequested(now, head.id))
        spent += time.perf_counter() - started
        n, moved, changed = n + 1, moved + len(step.moved), changed + len(step.sessions)
        if n == BLOCK or len(queue) == until:
            blocks.append({"queued": len(queue), "stops": n, "ms_per_stop": 1000 * spent / n,
                           "moved_per_stop": moved / n, "records_per_stop": changed / n})
            out(f"{len(queue):>8}  {1000 * spent / n:>11.3f}  {moved / n:>21.1f}  {changed / n:>24.1f}")
            n = moved = changed = 0
            spent = 0.0
    return now, blocks


if __name__ == "__main__":
    sys.exit(main())
