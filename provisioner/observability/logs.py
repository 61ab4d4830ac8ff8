"""Process logging: plain text for a terminal, or one JSON object per line for a log pipeline
(Cloud Logging reads `severity`, `message`, `time` and the trace fields).

Each JSON line carries the current span's trace and span ids, so a log line leads to its trace;
ids a call passes as `extra` (session_id, vm_id, cluster, pool, request_id) become fields of their
own, to filter on without parsing messages.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

from opentelemetry import trace

from provisioner.common.safe_text import printable

FORMATS = ("text", "json")
FIELDS = ("session_id", "vm_id", "cluster", "pool", "request_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "severity": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            entry["trace_id"], entry["span_id"] = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        for field in FIELDS:
            value = getattr(record, field, None)
            if value:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """One line per record (a traceback aside): the message's arguments come from users and
    clusters, so what is not printable in it is escaped, and no value can start a line of its own."""

    def __init__(self):
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


def setup(level: str = "INFO", fmt: str = "text") -> None:
    """Logs of this process to stderr, in `fmt` (text or json: JSON escapes every control
    character itself)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)


class SessionLog:
    """A runtime observer that logs every session state change once: INFO, WARNING for a failure,
    with the session, VM, cluster and pool as fields."""

    def __init__(self, cluster: str):
        self.cluster = cluster
        self.log = logging.getLogger("provisioner.sessions")
        self.seen: dict[str, int] = {}  # live session id -> history entries already logged

    def changed(self, sessions, restored: bool = False) -> None:
        for s in sessions:
            first = len(s.history) if restored else self.seen.get(s.id, 0)
            for change in s.history[first:]:
                level = logging.WARNING if change.state == "failed" else logging.INFO
                self.log.log(level, "session %s %s: %s", s.id, change.state, change.reason,
                             extra={"session_id": s.id, "vm_id": s.vm_id, "cluster": self.cluster, "pool": s.pool})
            if s.terminal:
                self.seen.pop(s.id, None)
            else:
                self.seen[s.id] = len(s.history)
