"""The client commands' output: messages to JSON and text (render, render_admin), pure."""

from __future__ import annotations

import json

import pytest

from cli_front import NOW, S, make_cluster, make_pool, make_session, make_vm, with_eta
from provisioner.cli import render, render_admin
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import types_pb2


def _versions(lo: int, hi: int) -> list[str]:
    return [f"gpu:v{n}" for n in range(hi, lo - 1, -1)]


def test_many_images_are_summarised_unless_wide():
    vm = types_pb2.Vm(id="vm-1", state=types_pb2.VM_STATE_WARM, images=_versions(99, 136), healthy=True)
    line = render_admin.vm_table([vm], NOW).splitlines()[1]
    assert "38: gpu:v99..gpu:v136" in line and len(line) < 120
    assert ",".join(_versions(99, 136)[::-1]) in render_admin.vm_table([vm], NOW, wide=True)
    pool = make_pool()
    del pool.capacity.warm_by_image[:]
    pool.capacity.warm_by_image.extend(types_pb2.ImageCount(image=i, count=1) for i in _versions(121, 160))
    pool.capacity.warm_by_image[5].count = 3
    detail = render_admin.pool_detail(pool)
    assert "warm by image: gpu:v155=3, gpu:v160=1, gpu:v159=1 and 37 more (--wide lists all)" in detail
    assert "gpu:v121=1" in render_admin.pool_detail(pool, wide=True)
    assert "images:  38 versions, gpu:v99..gpu:v136 (--wide lists all)" in render_admin.vm_detail(vm)
    assert "gpu:v99, gpu:v100, gpu:v101" in render_admin.vm_detail(vm, wide=True)


def test_model_time_is_labelled():
    s = make_session(start=types_pb2.START_KIND_PARTIAL, pull=types_pb2.PullProgress(bytes_total=24_600_000_000,
                                                                              bytes_done=24_600_000_000))
    s.read_time.FromSeconds(NOW + 3 * 3600)
    detail = render.session_detail(s, NOW)
    assert "clock:" in detail and "model time, 3h ahead of the wall clock" in detail
    assert "start:      partial (a warm VM had part of the image and pulled the rest)" in detail
    assert "pull:       24.6 GB pulled (the layers the VM lacked)" in detail
    s.read_time.FromSeconds(NOW + 5)
    assert "clock:" not in render.session_detail(s, NOW)
    assert render.clock_note([s], NOW) is None


def test_trace_view_rounds_floats():
    from provisioner.observability.traceview import render_tree

    span = {"trace_id": "t", "span_id": "a", "name": "SessionService/CreateSession", "start_ns": 0, "end_ns": 2_000_000,
            "attributes": {}, "events": [{"name": "candidate", "time_ns": 1_000_000,
                                          "attributes": {"expected_s": 41.39999999999999, "how": "warm"}}]}
    assert "* candidate @+1.0 ms expected_s=41.4 how=warm" in render_tree([span], "t")


def test_table_aligns_columns():
    text = render.table([("a", "long value", 1), ("bbbb", "x", None)], ("ID", "V", "N"))
    lines = text.splitlines()
    assert lines == ["ID    V           N", "a     long value  1", "bbbb  x"]
    for col in ("V", "N"):
        assert lines[0].index(col) == lines[1].index("long value" if col == "V" else "1")


def test_kv_skips_empty_values():
    assert render.kv([("id", "s1"), ("endpoint", ""), ("queue position", 3)]) == (
        "id:             s1\nqueue position: 3")


@pytest.mark.parametrize("text, seconds", [
    ("2h", 7200), ("90m", 5400), ("3600s", 3600), ("3600", 3600), ("1h30m", 5400),
    ("1.5h", 5400), ("1d", 86400), (" 45S ", 45),
])
def test_parse_duration(text, seconds):
    assert render.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "2x", "1h-5m", "30 m", "5m3"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        render.parse_duration(text)


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (45, "45s"), (90, "1m30s"), (120, "2m"), (3600, "1h"), (7530, "2h5m"),
    (90000, "1d1h"), (-5, "0s"), (59.9, "59s"),
])
def test_format_duration(seconds, text):
    assert render.format_duration(seconds) == text


def test_enum_short_names():
    assert render.enum_short(types_pb2.SessionState, S.SESSION_STATE_PULLING_IMAGE) == "pulling_image"
    assert render.enum_short(types_pb2.StartKind, types_pb2.START_KIND_WARM) == "warm"
    assert render.enum_short(types_pb2.VmState, types_pb2.VM_STATE_RECYCLING) == "recycling"
    assert render.enum_short(types_pb2.SessionState, 0) == ""
    assert render.enum_short(types_pb2.SessionState, 99) == "99"
    assert render.enum_value(types_pb2.SessionState, "Running") == S.SESSION_STATE_RUNNING
    assert render.enum_value(types_pb2.SessionState, "SESSION_STATE_RUNNING") == S.SESSION_STATE_RUNNING
    assert render.enum_value(types_pb2.SessionState, "pulling-image") == S.SESSION_STATE_PULLING_IMAGE
    with pytest.raises(ValueError, match="queued"):
        render.enum_value(types_pb2.SessionState, "unspecified")


def test_session_to_json_nulls_and_history():
    s = make_session(state=S.SESSION_STATE_RUNNING, start=types_pb2.START_KIND_WARM)
    s.history.add(state="queued", reason="no warm VM")
    s.history[0].time.FromSeconds(NOW)
    data = render.session_to_json(s)
    assert data["state"] == "running" and data["start"] == "warm" and data["kind"] == "interactive"
    assert data["create_time"] == "2023-11-14T22:13:20Z"
    assert data["ready_time"] is None and data["estimated_ready_time"] is None
    assert data["pull"] is None
    assert data["user"] == "ada" and data["request_id"] == "r1"
    assert data["history"] == [{"state": "queued", "reason": "no warm VM",
                                "time": "2023-11-14T22:13:20Z"}]
    json.dumps(data)


def test_session_table_timing_column():
    waiting = with_eta(make_session("a"), 90)
    running = make_session("b", S.SESSION_STATE_RUNNING, start=types_pb2.START_KIND_COLD)
    running.ready_time.FromSeconds(NOW + 60)
    lines = render.session_table([waiting, running], now=NOW + 660).splitlines()
    # AGE (since created) and READY-IN (the estimate, while waiting) are columns of their own
    assert lines[1].split() == ["a", "queued", "us-central1", "gpu:v154", "-", "11m", "0s"]  # late
    assert lines[2].split()[-2:] == ["11m", "-"]  # created 11m ago, running
    lines = render.session_table([waiting, running], now=NOW).splitlines()
    assert lines[1].split()[-2:] == ["0s", "1m30s"]
    assert lines[2].split()[4] == "cold"


def test_vm_pool_cluster_quota_json():
    vm = render_admin.vm_to_json(make_vm())
    assert vm["state"] == "warm" and vm["images"] == ["gpu:v154"] and vm["create_time"] is None
    pool = render_admin.pool_to_json(make_pool())
    assert pool["policy"]["min_vms"] == 1 and pool["policy"]["autoscaler"] is None
    assert pool["capacity"]["warm_by_image"] == [{"image": "gpu:v154", "count": 3}]
    cluster = render_admin.cluster_to_json(make_cluster())
    assert cluster["pools"][0]["name"] == "gpu-p100"
    quota = render.quota_to_json(types_pb2.Quota(user_id="ada", gpu_hours_limit=30))
    assert quota == {"user": "ada", "gpu_hours_limit": 30.0, "gpu_hours_used": 0.0, "gpu_hours_left": 0.0,
                     "reset_time": None, "max_active_sessions": 0, "active_sessions": 0,
                     "max_active_batch_sessions": 0, "active_batch_sessions": 0, "exhaustion_time": None}


def test_a_sessions_budget_end_and_newest_notice_are_shown():
    from provisioner.cli import render
    from provisioner.v1 import types_pb2 as tpb

    s = tpb.Session(id="us-central1.s-0001", state=tpb.SESSION_STATE_RUNNING, reason="running")
    s.read_time.FromSeconds(1_000)
    s.budget_end_time.FromSeconds(1_000 + 1_800)
    n = s.notices.add(kind="gpu_budget", message="the weekly GPU budget runs out in 30 minutes")
    n.time.FromSeconds(1_000)
    n.action_time.FromSeconds(2_800)
    assert "[notice: the weekly GPU budget runs out in 30 minutes]" in render.progress_line(s, 1_000)
    out = render.session_to_json(s)
    assert out["notices"][0]["kind"] == "gpu_budget" and out["budget_end_time"]
    detail = render.session_detail(s, 1_000)
    assert "budget ends" in detail and "(in 30" in detail and "runs out in 30 minutes" in detail


def test_a_starting_session_shows_the_step_and_when_its_notebook_should_answer():
    s = with_eta(make_session(state=S.SESSION_STATE_STARTING, reason="starting its notebook on warm VM vm-1"), 3)
    assert render.progress_line(s, NOW) == (
        "us-central1.s1 starting ready in ~3s: starting its notebook on warm VM vm-1")
    assert render.session_ready_in(s, NOW) == "3s"


UNSAFE = "\x1b[2J\x9b31m\x85\u2028\u202e"


def test_what_a_server_stored_is_shown_escaped_never_acted_on():
    """A stop reason, a user id or a notice holding escape sequences, C1 controls, a line separator
    or a bidi override (an old row, a compromised cluster) reaches the terminal escaped, one line."""
    s = make_session("us-central1.s-1", S.SESSION_STATE_STOPPED, reason=f"stopped{UNSAFE}")
    s.spec.user_id = f"mal{UNSAFE}"
    outputs = [render.session_detail(s, NOW), render.session_table([s], NOW), render.progress_line(s, NOW),
               render_admin.blocked_users_table([admin_pb.UserBlock(user_id=f"mal{UNSAFE}", reason=UNSAFE)])]
    for text in outputs:
        assert not any(c in text for c in UNSAFE if not c.isprintable()), text
        assert "\\x1b[2J\\x9b31m\\x85\\u2028\\u202e" in text
    assert len(render.progress_line(s, NOW).splitlines()) == 1
