"""Read the JSON-lines span file written by the `file` trace exporter and show one trace as an
indented tree, so a session's path through front, cluster and cloud can be read in a terminal.
"""

from __future__ import annotations

import json
from pathlib import Path

from provisioner.observability.telemetry import (
    ATTR_CLUSTER,
    ATTR_IMAGE,
    ATTR_POOL,
    ATTR_REQUEST_ID,
    ATTR_SESSION_ID,
    ATTR_START,
    ATTR_USER,
    ATTR_VM_ID,
)

# Domain attributes shown on a span's line, in this order, under these short names.
SHORT_NAMES = {
    ATTR_SESSION_ID: "session",
    ATTR_USER: "user",
    ATTR_REQUEST_ID: "request",
    ATTR_CLUSTER: "cluster",
    ATTR_POOL: "pool",
    ATTR_IMAGE: "image",
    ATTR_START: "start",
    ATTR_VM_ID: "vm",
}


def load_spans(path: str | Path) -> list[dict]:
    """All spans in the file and the files rotated from it, oldest first. A torn last line (the
    writer was killed mid-write) is skipped."""
    path = Path(path)
    backups = sorted((p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
                     key=lambda p: -int(p.suffix[1:]))
    return [span for p in [*backups, path] for span in _load_file(p)]


def _load_file(path: Path) -> list[dict]:
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    spans = []
    for i, line in enumerate(lines):
        try:
            spans.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not a JSON span") from None
    return spans


def find_traces(spans: list[dict], session_id: str) -> list[str]:
    """Trace ids that touch the session, earliest first."""
    hits = sorted(
        (s for s in spans if s.get("attributes", {}).get(ATTR_SESSION_ID) == session_id),
        key=lambda s: s.get("start_ns") or 0,
    )
    return list(dict.fromkeys(s["trace_id"] for s in hits))


def _value(v) -> str:
    # Floats as a person reads them (expected_s=41.4, not 41.39999999999999).
    return str(round(v, 3)) if isinstance(v, float) else str(v)


def _attrs(attributes: dict) -> str:
    return " ".join(f"{short}={_value(attributes[key])}" for key, short in SHORT_NAMES.items() if key in attributes)


def _span_line(span: dict) -> str:
    start, end = span.get("start_ns"), span.get("end_ns")
    dur = f"{(end - start) / 1e6:.1f} ms" if start is not None and end is not None else "open"
    parts = [span["name"], f"[{dur}]"]
    kind = span.get("kind", "INTERNAL")
    if kind != "INTERNAL":
        parts.append(kind.lower())
    if attrs := _attrs(span.get("attributes", {})):
        parts.append(attrs)
    status = span.get("status") or {}
    if status.get("code") == "ERROR":
        parts.append(f"ERROR: {status.get('description') or ''}".rstrip(": "))
    return " ".join(parts)


def _event_line(span: dict, event: dict) -> str:
    offset = (event["time_ns"] - span["start_ns"]) / 1e6 if span.get("start_ns") is not None else 0.0
    attrs = " ".join(f"{k}={_value(v)}" for k, v in event.get("attributes", {}).items())
    return f"* {event['name']} @+{offset:.1f} ms" + (f" {attrs}" if attrs else "")


def render_tree(spans: list[dict], trace_id: str) -> str:
    """One trace as an indented tree: children under parents, siblings by start time."""
    mine = sorted((s for s in spans if s["trace_id"] == trace_id), key=lambda s: s.get("start_ns") or 0)
    if not mine:
        return f"no spans recorded for trace {trace_id}"
    ids = {s["span_id"] for s in mine}
    children: dict[str | None, list[dict]] = {}
    for s in mine:
        parent = s.get("parent_span_id")
        children.setdefault(parent if parent in ids else None, []).append(s)

    # Spans are measured on the wall clock, whatever model time a simulated fleet's sessions run on.
    out = [f"trace {trace_id} (durations and offsets in wall-clock ms)"]

    def walk(span: dict, depth: int) -> None:
        pad = "  " * depth
        line = _span_line(span)
        if span.get("parent_span_id") and span["parent_span_id"] not in ids:
            line += " (parent not recorded)"
        out.append(pad + line)
        for event in span.get("events", []):
            out.append(pad + "    " + _event_line(span, event))
        for child in children.get(span["span_id"], []):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 1)
    return "\n".join(out)
