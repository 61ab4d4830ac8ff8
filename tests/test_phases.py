"""Where a create's time goes (provisioner/perf/phases.py): each phase from the spans of one
create, creates outside the window or without the cluster's answer left out, and a span file
read on from where it was, across a rotation."""

from __future__ import annotations

import json

from provisioner.perf import phases
from provisioner.observability.telemetry import rotated

MS = 1_000_000


def _create(trace: str, start_ms: float, *, answered: bool = True) -> list[dict]:
    """A create at the front from start_ms: ranked at +1, attempt at +1.5, Allocate +2..+7 (the
    cluster's answer +3..+5), ends at +8."""
    def at(ms: float) -> int:
        return int((start_ms + ms) * MS)

    front = {"trace_id": trace, "span_id": f"{trace}-f", "parent_span_id": None, "name": phases.CREATE,
             "kind": "SERVER", "start_ns": at(0), "end_ns": at(8),
             "events": [{"name": "candidate", "time_ns": at(0.9)}, {"name": "candidate", "time_ns": at(1)},
                        {"name": "attempt", "time_ns": at(1.5)}]}
    call = {"trace_id": trace, "span_id": f"{trace}-c", "parent_span_id": front["span_id"], "name": phases.ALLOCATE,
            "kind": "CLIENT", "start_ns": at(2), "end_ns": at(7), "events": []}
    answer = {"trace_id": trace, "span_id": f"{trace}-a", "parent_span_id": call["span_id"], "name": phases.ALLOCATE,
              "kind": "SERVER", "start_ns": at(3), "end_ns": at(5), "events": []}
    return [front, call, answer] if answered else [front, call]


def test_each_phase_of_a_create():
    got = phases.create_phases(_create("t1", 100.0))
    assert got == {"front": [8.0], "before Allocate": [2.0], "attempt write": [0.5], "at the cluster": [2.0],
                   "between processes": [3.0], "after Allocate": [1.0]}


def test_only_creates_in_the_window_with_the_clusters_answer_count():
    spans = [*_create("early", 0.0), *_create("in", 100.0), *_create("late", 195.0),
             *_create("unanswered", 120.0, answered=False)]
    got = phases.create_phases(spans, since_ns=50 * MS, until_ns=200 * MS)
    assert got["front"] == [8.0]  # "late" ends at 203 ms
    assert phases.summary(got)["creates"] == 1


def test_spans_are_read_on_from_an_offset_across_a_rotation(tmp_path):
    path = tmp_path / "traces.jsonl"
    first, second = _create("a", 0.0), _create("b", 10.0)
    path.write_text("".join(json.dumps(s) + "\n" for s in first))
    offset = path.stat().st_size
    with path.open("a") as f:
        f.write(json.dumps(second[0]) + "\n")
    assert [s["trace_id"] for s in phases.spans_after(path, offset)] == ["b"]
    path.replace(rotated(path, 1))  # the exporter rotated: the rest went to the new file
    path.write_text("".join(json.dumps(s) + "\n" for s in second[1:]) + '{"torn')
    assert [s["span_id"] for s in phases.spans_after(path, offset)] == ["b-f", "b-c", "b-a"]


def test_summaries_and_their_medians_over_runs():
    runs = [phases.summary(phases.create_phases([s for i in range(n) for s in _create(f"{r}-{i}", i * 10.0)]))
            for r, n in (("x", 3), ("y", 5), ("z", 4))]
    assert [s["creates"] for s in runs] == [3, 5, 4]
    assert runs[0]["at the cluster"] == {"p50": 2.0, "p90": 2.0}
    merged = phases.median_summary(runs)
    assert merged["creates"] == 4 and merged["between processes"]["p50"] == 3.0
    assert phases.render(merged).split()[:4] == ["4", "8.00", "/", "8.00"]
