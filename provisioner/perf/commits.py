"""Durable writes per second with and without group commit, for N concurrent writers.

    python -m provisioner.perf.commits [--writers 1 8 32] [--seconds 3] [--database-url URL]

Each writer saves one session row at a time and waits until it is durable, as a request does:
`ungrouped` commits each write in its own transaction on the event loop (as the store's
synchronous methods do), `grouped` through `await store.sessions.commit_save(...)`. SQLite in a temporary
directory unless `--database-url` names a PostgreSQL database. Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from provisioner.model.states import SessionState
from provisioner.model.records import Session, SessionSpec
from provisioner.perf import command
from provisioner.store import open_store


def _session(i: int) -> Session:
    spec = SessionSpec(request_id=f"r{i}", user_id=f"u{i % 100}", accelerator="gpu-p100", image="gpu:latest")
    return Session(f"perf.s-{i}", spec, "perf", "gpu-p100", "gpu:v160", 0.0, 3600.0, 43200.0,
                   state=SessionState.RUNNING)


_ids = itertools.count()  # new rows in every measurement


async def measure(store, grouped: bool, writers: int, seconds: float) -> dict:
    done = 0
    end = time.monotonic() + seconds

    async def writer() -> None:
        nonlocal done
        while time.monotonic() < end:
            session = _session(next(_ids))
            if grouped:
                await store.sessions.commit_save([session], [])
            else:
                store.sessions.save([session], [])
                await asyncio.sleep(0)  # let the other writers in, as requests on one loop are
            done += 1

    batches = store.writer.batches if grouped else 0
    await asyncio.gather(*(writer() for _ in range(writers)))
    out = {"commits_per_s": round(done / seconds, 1)}
    if grouped:
        out["writes_per_transaction"] = round(done / max(1, store.writer.batches - batches), 2)
    return out


def run(writers: list[int], seconds: float, database_url: str | None) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="provisioner-commits-") as tmp:
        store = open_store(database_url, Path(tmp) / "store.db")
        try:
            for n in writers:
                row = {"writers": n}
                for grouped in (False, True):
                    mode = "grouped" if grouped else "ungrouped"
                    print(f"{n} writers, {mode} ...", file=sys.stderr, flush=True)
                    row[mode] = asyncio.run(measure(store, grouped, n, seconds))
                rows.append(row)
        finally:
            store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--database-url", default=None, help="postgresql://... (default: SQLite in a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = run(args.writers, args.seconds, args.database_url)
    if args.json:
        print(json.dumps({"rows": rows, "store": "PostgreSQL" if args.database_url else "SQLite",
                          "command": command("provisioner.perf.commits", argv)}))
        return 0
    print(f"{'writers':>7}  {'ungrouped/s':>11}  {'grouped/s':>9}  {'writes per transaction':>22}")
    for r in rows:
        print(f"{r['writers']:>7}  {r['ungrouped']['commits_per_s']:>11.0f}  {r['grouped']['commits_per_s']:>9.0f}  "
              f"{r['grouped']['writes_per_transaction']:>22.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
