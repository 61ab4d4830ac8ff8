"""Session traces: what the simulator replays, one session a row, and the ways a run cuts or grows
one (its first days, K shifted copies, a flood of one user's creates).
"""

from __future__ import annotations

import csv
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from provisioner.model.records import SessionKind

HEADER = ["arrival_s", "user", "kind", "accelerator", "image", "region_hint", "duration_s", "abandon"]
# Model time past the last session's end, so wipes and deletes finish inside the run.
TAIL_S = 600.0


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float
    user: str
    kind: SessionKind
    accelerator: str
    image: str
    region: str
    duration_s: float
    abandon: bool


def read_trace(path: str | Path) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != HEADER:
            raise TraceError(f"{path}:1: expected header {','.join(HEADER)}, got {','.join(header or [])!r}")
        for line, rec in enumerate(reader, start=2):
            if not rec:
                continue
            try:
                if len(rec) != len(HEADER):
                    raise ValueError(f"expected {len(HEADER)} fields, got {len(rec)}")
                arrival, user, kind, acc, image, region, duration, abandon = rec
                row = TraceRow(float(arrival), user, SessionKind(kind), acc, image, region, float(duration),
                               {"0": False, "1": True}[abandon])
                if row.arrival_s < 0 or row.duration_s <= 0 or not user:
                    raise ValueError("need arrival_s >= 0, duration_s > 0 and a user")
            except (ValueError, KeyError) as e:
                raise TraceError(f"{path}:{line}: bad row {','.join(rec)!r}: {e}") from None
            rows.append(row)
    if not rows:
        raise TraceError(f"{path}: no sessions")
    return rows


def first_days(rows: list[TraceRow], days: float | None) -> list[TraceRow]:
    """The sessions that arrive within the trace's first `days` (all of them for None): a quick run."""
    if days is None or not rows:
        return rows
    t0 = min(r.arrival_s for r in rows)
    return [r for r in rows if r.arrival_s - t0 < days * 86400]


def superimpose(rows: list[TraceRow], scale: int, seed: int) -> list[TraceRow]:
    """K copies with distinct users, each shifted by a random offset modulo the trace span."""
    if scale < 1:
        raise ValueError("scale must be >= 1")
    if scale == 1:
        return sorted(rows, key=lambda r: r.arrival_s)
    rng = random.Random(seed)
    t0 = min(r.arrival_s for r in rows)
    span = max(r.arrival_s for r in rows) - t0 + 1.0
    out = []
    for k in range(scale):
        offset = rng.uniform(0, span)
        for r in rows:
            arrival = t0 + (r.arrival_s - t0 + offset) % span
            out.append(TraceRow(arrival, f"{r.user}-{k}", r.kind, r.accelerator, r.image, r.region,
                                r.duration_s, r.abandon))
    out.sort(key=lambda r: r.arrival_s)
    return out


FLOOD_USER, FLOOD_S, FLOOD_SESSION_S = "flooder", 10.0, 3600.0


def with_flood(rows: list[TraceRow], creates: int) -> list[TraceRow]:
    """`rows` plus one user sending `creates` interactive sessions of an hour within FLOOD_S,
    halfway through the trace, in its commonest region and pool with its commonest image."""
    if creates <= 0:
        return rows

    def commonest(values) -> str:
        counts: dict[str, int] = defaultdict(int)
        for v in values:
            counts[v] += 1
        return max(sorted(counts), key=counts.__getitem__)

    region, pool = commonest(r.region for r in rows), commonest(r.accelerator for r in rows)
    image = commonest(r.image for r in rows)
    start = (rows[0].arrival_s + rows[-1].arrival_s) / 2
    flood = [TraceRow(start + FLOOD_S * i / creates, FLOOD_USER, SessionKind.INTERACTIVE, pool, image, region,
                      FLOOD_SESSION_S, False) for i in range(creates)]
    return sorted(rows + flood, key=lambda r: r.arrival_s)


def peak_concurrency(rows: list[TraceRow], idle_timeout_s: float) -> dict[tuple[str, str], int]:
    """The most sessions open at once per (region, accelerator): what a fixed pool must hold so
    that no session ever waits for a VM."""
    edges: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for r in rows:
        end = r.arrival_s + r.duration_s + (idle_timeout_s if r.abandon else 0.0)
        edges[(r.region, r.accelerator)] += [(r.arrival_s, 1), (end, -1)]
    peaks = {}
    for key, points in edges.items():
        points.sort()  # at equal times, ends (-1) before starts
        level = peak = 0
        for _, step in points:
            level += step
            peak = max(peak, level)
        peaks[key] = peak
    return peaks


def trace_end(rows: list[TraceRow], idle_timeout_s: float) -> float:
    """When a replay of these rows stops: the last session's end, plus time for the last wipes."""
    return max(r.arrival_s + r.duration_s + (idle_timeout_s if r.abandon else 0.0) for r in rows) + TAIL_S
