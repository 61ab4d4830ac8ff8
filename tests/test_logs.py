"""JSON logs with trace and span ids and the ids as fields; session changes logged once each;
the span file rotated by size, and read back across its rotations."""

from __future__ import annotations

import io
import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from provisioner.observability.logs import JsonFormatter, SessionLog, TextFormatter
from provisioner.model.records import Session, SessionSpec
from provisioner.model.states import SessionState
from provisioner.observability.telemetry import JsonLinesSpanExporter, rotated
from provisioner.observability.traceview import load_spans


@pytest.fixture
def capture(monkeypatch):
    """A function that sends a logger's records, as JSON lines, to a buffer only (undone after)."""
    levels = {}

    def capture(name: str) -> tuple[logging.Logger, io.StringIO]:
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.setFormatter(JsonFormatter())
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", [handler])
        monkeypatch.setattr(logger, "propagate", False)
        levels[logger] = logger.level
        logger.setLevel(logging.INFO)  # (setLevel, not .level =: it also clears the logger's cached answers)
        return logger, out

    yield capture
    for logger, level in levels.items():
        logger.setLevel(level)


def test_json_lines_carry_the_span_and_the_ids(capture):
    logger, out = capture("test.json")
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        logger.warning("VM %s lost", "vm-1", extra={"vm_id": "vm-1", "cluster": "us-central1"})
    logger.info("outside any span")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    ctx = span.get_span_context()
    assert first["message"] == "VM vm-1 lost" and first["severity"] == "WARNING"
    assert first["trace_id"] == f"{ctx.trace_id:032x}" and first["span_id"] == f"{ctx.span_id:016x}"
    assert first["vm_id"] == "vm-1" and first["cluster"] == "us-central1"
    assert "trace_id" not in second and "vm_id" not in second


def test_each_session_change_is_logged_once(capture):
    _, out = capture("provisioner.sessions")
    log = SessionLog("us-central1")
    s = Session("us-central1.s-1", SessionSpec("r", "alice", "gpu-p100", "gpu:v1"), "us-central1", "gpu-p100",
                "gpu:v1", 0.0, 3600, 43200)
    s.to(SessionState.QUEUED, "no VM", 0.0)
    log.changed([s])
    s.vm_id = "vm-7"
    s.to(SessionState.PROVISIONING, "assigned", 1.0)
    s.to(SessionState.STARTING, "starting its notebook", 1.5)
    s.to(SessionState.RUNNING, "ready", 2.0)
    log.changed([s])
    log.changed([s])  # nothing new
    s.to(SessionState.FAILED, "VM unhealthy", 3.0)
    log.changed([s])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["message"].split(" ")[2].rstrip(":") for line in lines] == ["queued", "provisioning", "starting",
                                                                             "running", "failed"]
    assert lines[-1]["severity"] == "WARNING" and lines[-1]["vm_id"] == "vm-7"
    assert all(line["session_id"] == s.id and line["pool"] == "gpu-p100" for line in lines)
    restored = SessionLog("us-central1")
    restored.changed([s], restored=True)  # logged by the process that saw it happen
    assert len(out.getvalue().splitlines()) == 5


def test_the_span_file_rotates_by_size_and_reads_back_in_order(tmp_path):
    path = tmp_path / "traces.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path, max_bytes=4000, backups=2)))
    tracer = provider.get_tracer("test")
    for i in range(200):
        with tracer.start_as_current_span(f"span-{i}"):
            pass
    files = sorted(tmp_path.glob("traces.jsonl*"))
    assert [p.name for p in files if not p.name.endswith(".lock")] == ["traces.jsonl", "traces.jsonl.1",
                                                                        "traces.jsonl.2"]
    assert all(p.stat().st_size <= 4000 for p in (path, rotated(path, 1), rotated(path, 2)))
    names = [s["name"] for s in load_spans(path)]
    assert names[-1] == "span-199"
    kept = int(names[0].removeprefix("span-"))
    assert names == [f"span-{i}" for i in range(kept, 200)]  # the newest, in order, none lost between
    assert kept > 0  # the oldest were dropped


def test_a_text_log_line_stays_one_line_whatever_its_arguments_hold():
    """A reason or an id a cluster or an old row held, with C1 controls, a line separator or an
    escape sequence, is written escaped: `splitlines()` finds no forged line, a terminal no command."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("test.text")
    logger.handlers, logger.propagate = [handler], False
    try:
        logger.warning("session %s stopped: %s", "us-central1.s-1\x1b[2J", "done\u2028ERROR forged\x85NEL\u202eevil")
    finally:
        logger.handlers, logger.propagate = [], True
    text = out.getvalue()
    assert len(text.splitlines()) == 1
    assert all(c not in text for c in "\x1b\u2028\x85\u202e")
    assert "\\x1b[2J" in text and "\\u2028ERROR forged" in text
