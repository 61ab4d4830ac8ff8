"""What the front's store work costs as history grows: the resolver's prune of settled attempts
(every 2 s, in the writer thread) and a create's admission read of its user.

    python -m provisioner.perf.history [--attempts 500000] [--requests 10000] [--database-url URL]

Fills a fresh store with `--attempts` made attempts whose commit_by spreads over the last hour
(what an hour of creates leaves: none old enough to prune) and `--requests` requests of one user
that ended before the quota week began, plus 10 live ones; then times each statement (the median
of repeats). SQLite in a temporary directory unless `--database-url` names a PostgreSQL database.
Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provisioner.front.records import FrontRecords
from provisioner.store import open_store

NOW = 1_800_000_000.0
HOUR_S = 3600.0
WEEK_START = NOW - 3 * 86400.0
LIVE = 10


def _fill(store, attempts: int, requests: int) -> None:
    with store.transaction() as cur:
        cur.executemany(store.sql("INSERT INTO front_attempts (request_id, cluster, commit_by, outcome, user_id) "
                                   "VALUES (?, 'c1', ?, 'made', ?)"),
                        [(f"u{i % 200}/a{i}", NOW - HOUR_S + i * HOUR_S / attempts, f"u{i % 200}")
                         for i in range(attempts)])
        cur.executemany(store.sql("INSERT INTO front_requests (request_id, session_id, cluster, created_at, user_id, "
                                   "ended_at) VALUES (?, ?, 'c1', ?, 'ada', ?)"),
                        [(f"ada/r{i}", f"c1.s-{i}", WEEK_START - 86400.0 + i * 1e-3,
                          WEEK_START - 3600.0 + i * 1e-3 if i >= LIVE else None) for i in range(requests + LIVE)])


def _median_ms(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def run(attempts: int, requests: int, database_url: str | None, repeats: int = 20) -> dict:
    with tempfile.TemporaryDirectory(prefix="provisioner-history-") as tmp:
        store = open_store(database_url, Path(tmp) / "front.db")
        try:
            print(f"filling: {attempts} attempts, {requests} ended requests of one user ...", file=sys.stderr, flush=True)
            _fill(store, attempts, requests)
            records = FrontRecords(store)
            print("timing ...", file=sys.stderr, flush=True)
            prune = _median_ms(lambda: records.prune_attempts(NOW - HOUR_S), repeats)
            admission = _median_ms(lambda: records.admission("ada/new", WEEK_START, NOW), repeats)
            live = records.admission("ada/new", WEEK_START, NOW).live
        finally:
            store.close()
    return {"attempts": attempts, "requests": requests, "prune_ms": prune, "admission_ms": admission, "live": live}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=500_000, help="made attempts of the last hour")
    parser.add_argument("--requests", type=int, default=10_000, help="one user's requests ended before the week")
    parser.add_argument("--database-url", default=None, help="postgresql://... (default: SQLite in a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.attempts < 0 or args.requests < 0:
        parser.error("--attempts and --requests must not be negative")
    r = run(args.attempts, args.requests, args.database_url)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"prune of settled attempts ({r['attempts']} of the last hour): {r['prune_ms']:.3f} ms")
        print(f"admission read (a user with {r['requests']} requests ended before the week, {r['live']} live): "
              f"{r['admission_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
