"""CPU time and resident memory of a process, from /proc (Linux), and its event loop's lag, from
the `/metrics` it serves."""

from __future__ import annotations

import math
import os
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from provisioner.observability.metrics import LAG_BUCKETS, LOOP_LAG

LAG_BUCKETS_MS = tuple(1000 * b for b in LAG_BUCKETS)

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces: the fields after it are counted from its ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def lag_buckets(port: int) -> dict[float, float]:
    """The event loop's lag histogram as the process at `port` serves it: cumulative counts by
    upper bound (seconds). A process makes its scrape at most once every metrics.SCRAPE_CACHE_S,
    so a window shorter than that sees the same histogram at both ends."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {float(s.labels["le"]): s.value for family in text_string_to_metric_families(text) if family.name == LOOP_LAG
            for s in family.samples if s.name == LOOP_LAG + "_bucket"}


def lag_between(before: dict[float, float], after: dict[float, float]) -> dict:
    """The lag over a window, from the histogram at its start and end: how many timers were
    sampled, and the bucket bounds (ms) under which 99% of them, and all of them, ran late. None
    where nothing was sampled; inf past the largest bucket."""
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(math.inf, 0.0)

    def bound(share: float) -> float | None:
        if not total:
            return None
        le = next(le for le, n in counts.items() if n >= share * total)
        return le if le == math.inf else round(1000 * le, 1)

    return {"lag_samples": int(total), "lag_p99_ms": bound(0.99), "lag_max_ms": bound(1.0)}


def open_fds(pid: int) -> int:
    """The file descriptors the process holds open (its sockets among them)."""
    return len(os.listdir(f"/proc/{pid}/fd"))
