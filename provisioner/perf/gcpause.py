"""What a full garbage collection costs with a cluster's restored state in memory, and what
freezing the heap after start-up (as `serve` and `up` do) leaves of it.

    python -m provisioner.perf.gcpause [--vms 5000] [--sessions 100000]

Builds VMs holding the pool's usual ~40 releases and ended sessions with their histories, round
trips them through a SQLite store as a restart does, then times `gc.collect()`: before
`gc.freeze()`, and after it with a few thousand new objects made since, as serving makes them.
Then makes as much again, as a pool warming up after start-up does, and times full collections
without and with the freezer that `serve` runs (provisioner/common/gc_freeze.py).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provisioner.config import load_fleet
from provisioner.model.images import LayerCache
from provisioner.model.states import StateChange, VmState
from provisioner.common.gc_freeze import LongLivedFreezer
from provisioner.model.records import Vm
from provisioner.perf.commits import _session
from provisioner.store import open_store


def _vm(i: int, cache: LayerCache) -> Vm:
    vm = Vm(f"perf-vm-{i}", "perf", "gpu-p100", "zone-a", LayerCache.from_dict(cache.to_dict()), 0.0,
            state=VmState.WARM)
    vm.history = [StateChange(state, "made earlier", float(t)) for t, state in enumerate(("creating", "booting",
                                                                                          "warm") * 5)]
    return vm


def restored_heap(vms: int, sessions: int) -> tuple[list, list]:
    fleet = load_fleet(None)
    catalog = fleet.catalog
    pool = fleet.clusters[0].pools[0]
    cache = LayerCache(pool.disk_cache_bytes)
    for version in catalog.versions()[-40:]:
        cache.add(version, catalog, 0.0)
    with tempfile.TemporaryDirectory(prefix="provisioner-gc-") as tmp:
        store = open_store(None, Path(tmp) / "store.db")
        store.sessions.save([], [_vm(i, cache) for i in range(vms)])
        store.sessions.save([_session(i) for i in range(sessions)], [])
        loaded = store.sessions.load_vms("perf"), store.sessions.load_sessions("perf")
        store.close()
    return loaded


def timed_collections(n: int = 5) -> float:
    """The median of `n` full collections, in ms."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        gc.collect()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vms", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=100_000)
    args = parser.parse_args(argv)
    print(f"restoring {args.vms} VMs and {args.sessions} sessions ...", file=sys.stderr, flush=True)
    heap = restored_heap(args.vms, args.sessions)
    tracked = len(gc.get_objects())
    before = timed_collections()
    gc.freeze()
    recent = [{"request": i, "history": [i]} for i in range(5000)]  # what serving makes meanwhile
    after = timed_collections()
    print(f"objects tracked by the collector: {tracked:,}")
    print(f"full collection: {before:.1f} ms before gc.freeze(), {after:.1f} ms after "
          f"({len(recent):,} new objects since)")
    # As much again made after start-up (a pool warming up): what the freeze at start-up misses.
    print("making as much again after start-up ...", file=sys.stderr, flush=True)
    grown = restored_heap(args.vms, args.sessions)
    unfrozen = timed_collections()
    with LongLivedFreezer() as freezer:
        gc.collect()  # slow, frees nothing: the freezer freezes what it kept
        frozen = timed_collections()
    print(f"grown after start-up: {unfrozen:.1f} ms per full collection; with the freezer (gc_freeze.py, "
          f"{freezer.freezes} freeze): {frozen:.1f} ms")
    del heap, grown
    gc.unfreeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
