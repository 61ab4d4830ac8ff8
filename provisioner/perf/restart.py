"""How long a cluster takes to restart, and the memory it holds after, with a long history in its
store: restart loads the live sessions and those ended within sessions.retention_s, not all.

    python -m provisioner.perf.restart [--ended 1000000] [--live 500] [--retention-s 3600]

Fills a SQLite store with `--ended` sessions ended over the past 30 days (a few within the
retention period) and `--live` running ones (bulk inserts of rows as the store writes them),
then restarts the cluster in a fresh process: opens the store and runs `ClusterRuntime.start()`
(restore, reconcile with an empty simulated cloud). Prints the restart's seconds, the sessions it
holds, and the process's resident memory (now, and its peak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioner.common.clock import ManualClock
from provisioner.config import load_fleet
from provisioner.model.states import StateChange, SessionState
from provisioner.model.records import Session, SessionSpec, StartKind, created_ns
from provisioner.perf.usage import rss_mb

NOW = 1_800_000_000.0  # the restart's model time
HISTORY_S = 30 * 86400.0  # the ended sessions ended over this long before NOW
CHUNK = 50_000


def _row(cluster: str, i: int, ended_at: float | None) -> tuple:
    """A session row as the store writes one (ended if `ended_at`, else running)."""
    created = (ended_at or NOW) - 3600.0
    spec = SessionSpec(request_id=f"r{i}", user_id=f"u{i % 5000}", accelerator="gpu-p100", image="gpu:latest")
    s = Session(f"{cluster}.s-{i:010x}", spec, cluster, "gpu-p100", "gpu:v160", created, 3600.0, 86400.0,
                start=StartKind.WARM, vm_id=f"{cluster}-gpu-p100-{i % 6000:06x}", endpoint="http://10.0.0.1:8888",
                ready_at=created + 4.0, last_activity_at=created + 1800.0)
    s.history = [StateChange("provisioning", "warm VM with the image", created),
                 StateChange("running", "the VM is ready", created + 4.0)]
    s.state = SessionState.RUNNING
    if ended_at is not None:
        s.history += [StateChange("stopping", "stopped by the user", ended_at - 20.0),
                      StateChange("stopped", "stopped by the user", ended_at)]
        s.state, s.ended_at = SessionState.STOPPED, ended_at
    s.revision = len(s.history)
    return (s.id, cluster, s.spec.key, spec.user_id, s.state.value, s.revision, s.ended_at, created_ns(created),
            json.dumps(s.to_dict()))


def fill(path: Path, cluster: str, ended: int, live: int, retention_s: float) -> float:
    from provisioner.store import SqliteStore

    started = time.monotonic()
    store = SqliteStore(path)
    recent = min(ended, 100)  # ended within the retention period: restored with the live ones
    sql = ("INSERT INTO sessions (id, cluster, request_id, user_id, state, revision, ended_at, created_ns, body) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
    try:
        for first in range(0, ended + live, CHUNK):
            rows = []
            for i in range(first, min(first + CHUNK, ended + live)):
                if i >= ended:
                    ended_at = None
                elif i < recent:
                    ended_at = NOW - retention_s * (i + 1) / (recent + 1)
                else:
                    ended_at = NOW - retention_s - HISTORY_S * i / ended
                rows.append(_row(cluster, i, ended_at))
            with store.transaction() as cur:
                cur.executemany(sql, rows)
    finally:
        store.close()
    return time.monotonic() - started


async def restart(path: Path, retention_s: float) -> dict:
    from provisioner.cloud.sim import SimCloud
    from provisioner.cluster.runtime import ClusterRuntime
    from provisioner.decide.core import ClusterCore
    from provisioner.decide.ids import IdSource
    from provisioner.store import SqliteStore

    fleet = load_fleet(None)
    cfg = fleet.cluster(fleet.clusters[0].name)
    clock = ManualClock(start=NOW)  # model time stands still: only the restart runs
    started = time.monotonic()
    store = SqliteStore(path)
    sessions = fleet.settings.sessions.model_copy(update={"retention_s": retention_s})
    core = ClusterCore(cfg, fleet.catalog, sessions, IdSource(cfg.name))
    runtime = ClusterRuntime(core, SimCloud(cfg.sim, clock, tracer=None, record_calls=False), clock, store)
    await runtime.start()
    seconds = time.monotonic() - started
    held = len(core.sessions)
    await runtime.close()
    store.close()
    return {"restart_s": round(seconds, 2), "sessions_in_memory": held,
            "rss_mb": round(rss_mb(os.getpid()), 1), "peak_rss_mb": round(_peak_mb(), 1)}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m provisioner.perf.restart", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ended", type=int, default=1_000_000, help="ended sessions in the store")
    ap.add_argument("--live", type=int, default=500, help="running sessions in the store")
    ap.add_argument("--retention-s", type=float, default=3600.0, help="sessions.retention_s (0: keep all)")
    ap.add_argument("--restart", metavar="DB", help=argparse.SUPPRESS)  # the fresh process's part
    args = ap.parse_args(argv)
    if args.restart:
        print(json.dumps(asyncio.run(restart(Path(args.restart), args.retention_s))))
        return
    cluster = load_fleet(None).clusters[0].name
    with tempfile.TemporaryDirectory(prefix="provisioner-restart-") as tmp:
        db = Path(tmp) / "cluster.db"
        fill_s = fill(db, cluster, args.ended, args.live, args.retention_s)
        size_mb = db.stat().st_size / 2**20
        print(f"store: {args.ended:,} ended + {args.live:,} running sessions of cluster {cluster}, "
              f"{size_mb:,.0f} MB, filled in {fill_s:.1f} s")
        out = subprocess.run([sys.executable, "-m", "provisioner.perf.restart", "--restart", str(db),
                              "--retention-s", str(args.retention_s)], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"restart (open the store, restore, reconcile): {r['restart_s']:.2f} s, "
              f"{r['sessions_in_memory']:,} sessions in memory (retention {args.retention_s:g} s), "
              f"RSS {r['rss_mb']:.0f} MB (peak {r['peak_rss_mb']:.0f} MB)")


if __name__ == "__main__":
    main()
