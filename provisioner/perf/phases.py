"""Where a create's time goes, from the spans the fleet wrote (the `file` trace exporter).

    python -m provisioner.perf.phases TRACES_FILE [--since-ns NS] [--until-ns NS]

Each create the front served in the window, whose trace holds the front's `Allocate` call and the
cluster's answer to it, is cut into phases (milliseconds):

- front: the front's whole CreateSession;
- before Allocate: from its start to the call to the cluster (reads, the quota check, the
  attempt's durable write);
- attempt write: of that, from ranking the clusters to the call (the attempt's durable write);
- at the cluster: the cluster's `Allocate`, its durable write included;
- between processes: the front's call less the cluster's answer (gRPC, both event loops' queues);
- after Allocate: from the cluster's answer to the front's (the request record's durable write, unless
  the placement holds the request's claim and answers first).

The serving benchmark reports these for its create runs (provisioner/perf/serving.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from provisioner.observability.telemetry import rotated
from provisioner.observability.traceview import load_spans

CREATE = "/provisioner.v1.SessionService/CreateSession"
ALLOCATE = "/provisioner.v1.ClusterService/Allocate"
PHASES = ("front", "before Allocate", "attempt write", "at the cluster", "between processes", "after Allocate")


def spans_after(path: Path, offset: int) -> list[dict]:
    """The spans written to `path` from byte `offset` on; if it was rotated since, the rest of the
    rotated file first. A torn line (a write under way) is left out."""
    parts = [(path, offset)]
    if path.exists() and path.stat().st_size < offset:
        parts = [(rotated(path, 1), offset), (path, 0)]
    spans = []
    for part, start in parts:
        if not part.exists():
            continue
        with part.open("rb") as f:
            f.seek(start)
            for line in f:
                try:
                    spans.append(json.loads(line))
                except ValueError:
                    continue
    return spans


def create_phases(spans: list[dict], since_ns: int = 0, until_ns: int | None = None) -> dict[str, list[float]]:
    """Each phase's durations (ms), one per create that started and ended within the window."""
    by_trace: dict[str, list[dict]] = {}
    for span in spans:
        by_trace.setdefault(span["trace_id"], []).append(span)
    out: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for trace in by_trace.values():
        front = next((s for s in trace if s["name"] == CREATE and s["kind"] == "SERVER"), None)
        if front is None or front["start_ns"] < since_ns or (until_ns is not None and front["end_ns"] > until_ns):
            continue
        call = next((s for s in trace if s["name"] == ALLOCATE and s["kind"] == "CLIENT"), None)
        answer = next((s for s in trace if s["name"] == ALLOCATE and s["kind"] == "SERVER"
                       and call is not None and s["parent_span_id"] == call["span_id"]), None)
        if call is None or answer is None:
            continue
        ms = {"front": front["end_ns"] - front["start_ns"],
              "before Allocate": call["start_ns"] - front["start_ns"],
              "at the cluster": answer["end_ns"] - answer["start_ns"],
              "between processes": (call["end_ns"] - call["start_ns"]) - (answer["end_ns"] - answer["start_ns"]),
              "after Allocate": front["end_ns"] - call["end_ns"]}
        ranked = [e["time_ns"] for e in front["events"] if e["name"] == "candidate"]
        attempt = next((e["time_ns"] for e in front["events"] if e["name"] == "attempt"), None)
        if ranked and attempt is not None:
            ms["attempt write"] = attempt - ranked[-1]
        for phase, ns in ms.items():
            out[phase].append(ns / 1e6)
    return out


def summary(phases: dict[str, list[float]]) -> dict:
    """The count of creates, and each phase's p50 and p90 (ms)."""
    def quantile(values: list[float], q: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(len(values) * q))], 2) if values else 0.0

    return {"creates": len(phases["front"]),
            **{phase: {"p50": quantile(v, 0.5), "p90": quantile(v, 0.9)} for phase, v in phases.items()}}


def median_summary(summaries: list[dict]) -> dict:
    """Medians over runs of each number of `summary`."""
    return {"creates": statistics.median(s["creates"] for s in summaries),
            **{phase: {q: statistics.median(s[phase][q] for s in summaries) for q in ("p50", "p90")}
               for phase in PHASES}}


_WIDTHS = [max(len(p), 14) for p in PHASES]
HEADER = f"{'creates':>8}  " + "  ".join(f"{p:<{w}}" for p, w in zip(PHASES, _WIDTHS))


def render(s: dict) -> str:
    """One line under HEADER: p50 / p90 of each phase."""
    cells = (f"{s[p]['p50']:.2f} / {s[p]['p90']:.2f}" for p in PHASES)
    return f"{s['creates']:>8.0f}  " + "  ".join(f"{c:<{w}}" for c, w in zip(cells, _WIDTHS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path, help="the span file (and the files rotated from it)")
    parser.add_argument("--since-ns", type=int, default=0, help="creates that started at or after (Unix ns)")
    parser.add_argument("--until-ns", type=int, default=None, help="creates that ended at or before (Unix ns)")
    args = parser.parse_args(argv)
    if not args.traces.exists():
        parser.error(f"no span file at {args.traces}")
    s = summary(create_phases(load_spans(args.traces), args.since_ns, args.until_ns))
    print("p50 / p90 ms of each phase")
    print(HEADER)
    print(render(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
