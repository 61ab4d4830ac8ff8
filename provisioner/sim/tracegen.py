"""Held-out session traces: arrival patterns the autoscaler was not tuned on.

The autoscaler's constants were chosen on genai-sessions.csv. These traces take their arrival
times (and, where the source has them, session lengths and kinds) from other public GPU
cluster traces, so a policy that only fits one trace's rhythm shows it:

- spot-steady, spot-burst: hourly GPU job submissions of Alibaba's 2026 spot GPU cluster, two
  23-day windows (the second holds a five-day surge of up to five times the usual rate), thinned to
  the genai trace's volume with arrivals spread uniformly inside each hour; lengths drawn from
  Microsoft Philly job runtimes.
- openb: creation times of Alibaba's 2023 GPU pods (23 busiest days, every pod), their QoS as
  the kind (latency-sensitive: interactive, best-effort: batch) and their own lifetimes where
  the pod ended inside the trace, else a lifetime of a finished pod of the same QoS.
- batch-burst: the same hourly submissions, days 60-82, but each hour's jobs submitted together
  inside one 10-minute window (a pipeline or a class submitting at once); every session a batch
  job, lengths from Philly runtimes (heavy-tailed: median 20 minutes, a tenth over 3.5 hours).
- batch-wave: the same hourly submissions, days 120-142 (a window no other trace uses), each
  three hours' jobs submitted together inside one 3-minute window (a scheduled pipeline
  submitting its queue at once: bursts of tens of sessions, up to a few hundred in the busy
  hours); every session a batch job, lengths from Philly runtimes.
- rollout: the request times of the Azure LLM 2023 code-completion trace (one hour, 8,819
  requests), stretched onto 23 days in order; each second's requests arrive as one rollout, at
  the same instant (up to 60 sessions at once after thinning to the genai volume); lengths
  from Philly runtimes.

Modelled, with the mix of genai-sessions.csv: 70/30 interactive/batch where the source has no
kind; 70/30 gpu-p100/gpu-t4x2; home regions 50/30/20; 45% of users follow the latest image, the
others stay on the release their notebook was created with (Zipf over the last 40 releases, a
release every 14 days); 35% of interactive sessions abandoned. Lengths are clipped to 30 s..12 h.

Usage: python -m provisioner.sim.tracegen --raw DIR [--out DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import itertools
import random
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from provisioner.sim.trace import HEADER

DAY_S = 86_400
HOUR_S = 3_600
MIN_LENGTH_S, MAX_LENGTH_S = 30, 12 * HOUR_S
WINDOW_DAYS = 23
SESSIONS = 7_300  # the volume of genai-sessions.csv, so --scale means the same on every trace
USERS_PER_SESSION = 0.58  # genai-sessions.csv: 4,247 users for 7,327 sessions

# Image releases, as in genai-sessions.csv: v158 is the newest at the start, v159 ships 5 days in.
NEWEST_AT_START, FIRST_RELEASE_S, RELEASE_EVERY_S = 158, 5 * DAY_S, 14 * DAY_S
PINNED_RELEASES = 40

REGIONS = (("us-central1", 50), ("europe-west4", 30), ("asia-east1", 20))
RAW_FILES = {
    "spot": "alibaba-spot-gpu-2026-hourly-submits.csv",
    "philly": "philly-runtimes.csv",
    "openb": "alibaba-gpu-2023-openb-pods.csv",
    "azure_code": "azure-llm-2023-code-requests.csv",
}
BURST_S = 600  # batch-burst: an hour's submissions arrive within this window
WAVE_EVERY_H, WAVE_S = 3, 180  # batch-wave: each 3 hours' submissions arrive within 3 minutes


@dataclass(frozen=True, slots=True)
class Arrival:
    t_s: float
    kind: str = ""  # "" lets the modelled mix decide
    length_s: float | None = None  # None: draw one


@dataclass(frozen=True, slots=True)
class Pod:
    created_s: int
    deleted_s: int
    qos: str
    ended: bool  # deleted inside the trace, so deleted_s - created_s is its real lifetime


def newest_release(t_s: float) -> int:
    if t_s < FIRST_RELEASE_S:
        return NEWEST_AT_START
    return NEWEST_AT_START + 1 + int((t_s - FIRST_RELEASE_S) // RELEASE_EVERY_S)


def clip_length(s: float) -> int:
    return int(min(max(s, MIN_LENGTH_S), MAX_LENGTH_S))


def thin_hourly(counts: Sequence[int], sessions: int, rng: random.Random, window_s: float = HOUR_S,
                kind: str = "", every_h: int = 1) -> list[Arrival]:
    """Keeps each job with one probability so about `sessions` remain; each `every_h` hours' jobs
    (one hour's by default) uniform inside a window of `window_s` at a random place in those
    hours (all of them by default)."""
    keep = min(1.0, sessions / max(1, sum(counts)))
    span_s = every_h * HOUR_S
    window_s = min(window_s, span_s)
    out = []
    for k in range(0, len(counts), every_h):
        kept = sum(rng.random() < keep for _ in range(sum(counts[k:k + every_h])))
        # No draw for a whole-span window, so the traces made before windows existed stay the same.
        start = k * HOUR_S + (rng.uniform(0, span_s - window_s) if window_s < span_s else 0.0)
        out.extend(Arrival(start + rng.uniform(0, window_s), kind) for _ in range(kept))
    return sorted(out, key=lambda a: a.t_s)


def rollouts(times_s: Sequence[float], sessions: int, days: int, rng: random.Random) -> list[Arrival]:
    """Request times stretched in order onto `days`: each second's requests (thinned so about
    `sessions` remain) arrive together, at the instant their second maps to."""
    keep = min(1.0, sessions / max(1, len(times_s)))
    t0 = int(min(times_s))
    stretch = days * DAY_S / (int(max(times_s)) - t0 + 1)
    return [Arrival((int(t) - t0) * stretch) for t in sorted(times_s) if rng.random() < keep]


def busiest_window(times: Iterable[float], days: int) -> float:
    """Start (a day boundary) of the `days`-day window holding the most events."""
    per_day: dict[int, int] = {}
    for t in times:
        per_day[int(t // DAY_S)] = per_day.get(int(t // DAY_S), 0) + 1
    first, last = min(per_day), max(per_day)
    best = max(range(first, max(first, last - days + 1) + 1),
               key=lambda d: sum(per_day.get(d + i, 0) for i in range(days)))
    return float(best * DAY_S)


def pod_arrivals(pods: Sequence[Pod], start_s: float, days: int, rng: random.Random) -> list[Arrival]:
    finished = {q: [p.deleted_s - p.created_s for p in pods if p.ended and p.qos == q] for q in ("LS", "BE")}
    out = []
    for p in pods:
        if not start_s <= p.created_s < start_s + days * DAY_S or p.qos not in finished:
            continue
        length = p.deleted_s - p.created_s if p.ended else rng.choice(finished[p.qos])
        out.append(Arrival(p.created_s - start_s, "interactive" if p.qos == "LS" else "batch", length))
    return sorted(out, key=lambda a: a.t_s)


def _zipf_cumulative(n: int, s: float = 1.2) -> list[float]:
    return list(itertools.accumulate(1 / k ** s for k in range(1, n + 1)))


def sessions_for(arrivals: Sequence[Arrival], lengths: Sequence[float], rng: random.Random) -> list[list]:
    """Trace rows: the arrivals with users, kind, accelerator, image, region and abandon modelled."""
    zipf = _zipf_cumulative(PINNED_RELEASES)
    population = max(1, round(len(arrivals) * USERS_PER_SESSION))
    users: dict[int, tuple[str, int | None]] = {}  # user -> (home region, pinned release or None)
    rows = []
    for a in arrivals:
        u = rng.randrange(population)
        if u not in users:
            region = rng.choices([r for r, _ in REGIONS], [w for _, w in REGIONS])[0]
            releases_ago = bisect.bisect_left(zipf, rng.random() * zipf[-1])
            users[u] = (region, None if rng.random() < 0.45 else newest_release(a.t_s) - releases_ago)
        region, pinned = users[u]
        kind = a.kind or ("interactive" if rng.random() < 0.7 else "batch")
        length = clip_length(rng.choice(lengths) if a.length_s is None else a.length_s)
        accelerator = "gpu-p100" if rng.random() < 0.7 else "gpu-t4x2"
        abandon = int(kind == "interactive" and rng.random() < 0.35)
        version = newest_release(a.t_s) if pinned is None else pinned
        rows.append([int(a.t_s), f"u{u}", kind, accelerator, f"gpu:v{version}", region, length, abandon])
    return rows


# ---- reading the raw files ----------------------------------------------------------------

def read_hourly(path: Path) -> list[int]:
    with open(path, newline="") as f:
        return [int(r["jobs"]) for r in csv.DictReader(f)]


def read_runtimes(path: Path) -> list[float]:
    with open(path, newline="") as f:
        return [float(r["runtime"]) for r in csv.DictReader(f) if float(r["runtime"]) > 0]


def read_request_times(path: Path) -> list[float]:
    """Seconds since the epoch of each request of an Azure LLM trace (TIMESTAMP, UTC)."""
    with open(path, newline="") as f:
        return [datetime.fromisoformat(r["TIMESTAMP"][:26]).replace(tzinfo=timezone.utc).timestamp()
                for r in csv.DictReader(f)]


def read_pods(path: Path) -> list[Pod]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    end = max(int(r["deletion_time"]) for r in rows)
    return [Pod(int(r["creation_time"]), int(r["deletion_time"]), r["qos"],
                r["pod_phase"] in ("Succeeded", "Failed") and int(r["deletion_time"]) < end) for r in rows]


def build(raw: Path, seed: int) -> dict[str, list[list]]:
    """Every held-out trace by name, from the raw files in `raw`."""
    missing = [name for name in RAW_FILES.values() if not (raw / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{raw}: missing {', '.join(missing)}")
    # Hour 0 of the spot trace holds every job already present at its start: not arrivals.
    hourly = read_hourly(raw / RAW_FILES["spot"])[1:]
    runtimes = read_runtimes(raw / RAW_FILES["philly"])
    pods = read_pods(raw / RAW_FILES["openb"])
    hours = WINDOW_DAYS * 24
    windows = {"spot-steady": hourly[30 * 24:30 * 24 + hours], "spot-burst": hourly[88 * 24:88 * 24 + hours]}
    out = {}
    for name, counts in windows.items():
        rng = random.Random(f"{seed}:{name}")
        out[name] = sessions_for(thin_hourly(counts, SESSIONS, rng), runtimes, rng)
    rng = random.Random(f"{seed}:openb")
    start = busiest_window([p.created_s for p in pods], WINDOW_DAYS)
    out["openb"] = sessions_for(pod_arrivals(pods, start, WINDOW_DAYS, rng), runtimes, rng)
    rng = random.Random(f"{seed}:batch-burst")
    batch = thin_hourly(hourly[60 * 24:60 * 24 + hours], SESSIONS, rng, BURST_S, "batch")
    out["batch-burst"] = sessions_for(batch, runtimes, rng)
    rng = random.Random(f"{seed}:batch-wave")
    wave = thin_hourly(hourly[120 * 24:120 * 24 + hours], SESSIONS, rng, WAVE_S, "batch", WAVE_EVERY_H)
    out["batch-wave"] = sessions_for(wave, runtimes, rng)
    rng = random.Random(f"{seed}:rollout")
    requests = read_request_times(raw / RAW_FILES["azure_code"])
    out["rollout"] = sessions_for(rollouts(requests, SESSIONS, WINDOW_DAYS, rng), runtimes, rng)
    return out


def write(path: Path, rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m provisioner.sim.tracegen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw", required=True, type=Path, help="directory with the public raw traces")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "traces")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    try:
        traces = build(args.raw, args.seed)
    except (OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in traces.items():
        write(args.out / f"{name}-sessions.csv", rows)
        print(f"{name}-sessions.csv: {len(rows)} sessions, {len({r[1] for r in rows})} users")
    return 0


if __name__ == "__main__":
    sys.exit(main())
