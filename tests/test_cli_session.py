"""`provisioner session ...`, and what every client command shares (credentials, errors, tracing,
the flags at any level), against fake servicers over real loopback gRPC."""

from __future__ import annotations

import json
import socket
import sys
import types
import uuid

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cli_front
from cli_front import S
from provisioner import cli
from provisioner.cli import session_commands
from provisioner.client import _base
from provisioner.v1 import types_pb2

# The shared fixtures: a test takes them by naming them.
credentials, front, own_tracing_globals, run = (
    cli_front.credentials, cli_front.front, cli_front.own_tracing_globals, cli_front.run)


def test_create_json_sends_the_spec(run, front):
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:latest", "--kind", "batch", "--region", "europe-west4",
                       "--require-region", "--max-runtime", "90m", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["id"] == "us-central1.s1"
    assert data["state"] == "queued"
    assert data["cluster"] == "us-central1"
    assert data["image"] == "gpu:v154" and data["image_requested"] == "gpu:latest"
    assert data["start"] == ""
    assert data["kind"] == "batch"
    assert data["estimated_ready_time"] == "2023-11-14T22:18:20Z"
    spec = front.sessions.requests[0].spec
    uuid.UUID(spec.request_id)  # a fresh uuid4 by default
    assert spec.max_runtime.seconds == 5400
    assert spec.region_hint == "europe-west4" and spec.region_required
    assert spec.kind == types_pb2.SESSION_KIND_BATCH
    assert "request id" not in err  # --json keeps stderr quiet


def test_create_human_shows_the_request_id(run, front):
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154")
    assert rc == 0
    assert f"{front.sessions.requests[0].spec.request_id}\n" in out and "request id" not in err
    assert "state:" in out and "queued" in out

    rc, _, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                     "--image", "gpu:v154", "--request-id", "retry-me")
    assert rc == 0 and "request id" not in err
    assert front.sessions.requests[-1].spec.request_id == "retry-me"
    assert not front.sessions.requests[-1].spec.HasField("max_runtime")


def test_create_wait_shows_progress_until_running(run, front):
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154", "--wait", "--json")
    assert rc == 0, err
    assert json.loads(out)["state"] == "running"
    assert json.loads(out)["start"] == "partial"
    lines = err.strip().splitlines()
    assert "queued" in lines[0] and "queue #1" in lines[0] and "ready in ~" in lines[0]
    assert any("pull 25% of 20.0 GB" in line for line in lines)
    assert any("pull 75%" in line for line in lines)
    assert "running" in lines[-1] and "https://k.example/s1" in lines[-1]
    watch = front.sessions.requests[1]
    assert watch.session_id == "us-central1.s1" and watch.after_revision == 0


def test_create_wait_exits_1_when_the_session_fails(run, front):
    front.sessions.next_id = "us-central1.doomed"
    rc, out, err = run("session", "create", "--user", "ada", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154", "--wait")
    assert rc == 1
    assert "failed" in err.splitlines()[-1] and "image pull failed" in err
    assert "failed" in out


def test_watch_json_lines_and_resume_after_unavailable(run, front, monkeypatch):
    monkeypatch.setattr(_base, "WATCH_RESUMES", 1)
    front.sessions.break_watch_once = True
    rc, out, err = run("session", "watch", "us-central1.s1", "--json")
    assert rc == 0, err
    states = [json.loads(line)["state"] for line in out.splitlines()]
    assert states == ["queued", "pulling_image", "pulling_image", "running"]
    assert [r.after_revision for r in front.sessions.requests] == [0, 2]


def test_watch_human_ends_on_failed(run):
    rc, out, _ = run("session", "watch", "us-central1.doomed", "--after-revision", "2")
    assert rc == 1
    assert out.splitlines()[0].startswith("us-central1.doomed pulling_image pull 75%")
    assert out.splitlines()[-1] == "us-central1.doomed failed: image pull failed"


def test_list_all_follows_pages(run, front):
    rc, out, err = run("session", "list", "--user", "ada", "--all", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert [s["id"] for s in data["sessions"]] == [f"us-central1.s{i}" for i in range(5)]
    assert data["next_page_token"] == ""
    assert [r.page_token for r in front.sessions.requests] == ["", "2", "4"]


def test_list_one_page_with_states(run, front):
    rc, out, err = run("session", "list", "--user", "ada", "--state", "running", "queued",
                       "--page-size", "3")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATE", "CLUSTER", "IMAGE", "START", "AGE", "READY-IN", "REASON"]
    assert len(lines) == 4
    assert "--page-token 3" in err
    req = front.sessions.requests[0]
    assert list(req.states) == [S.SESSION_STATE_RUNNING, S.SESSION_STATE_QUEUED]
    assert req.page_size == 3


def test_get_touch_stop_quota(run, front):
    assert run("session", "get", "us-central1.s9")[0] == 0
    assert run("session", "touch", "us-central1.s9")[0] == 0
    rc, out, _ = run("session", "stop", "us-central1.s9", "--reason", "done", "--json")
    assert rc == 0 and json.loads(out)["state"] == "stopped"
    assert front.sessions.requests[2].reason == "done"
    rc, out, _ = run("session", "quota", "--user", "ada")
    assert rc == 0
    assert "12.5 / 30.0 (42%)" in out and "1 / 2" in out


def test_get_shows_the_digest_and_the_secret_in_json_only(run):
    rc, out, _ = run("session", "get", "us-central1.s9")
    assert rc == 0 and f"image digest: {cli_front.DIGEST}" in out
    assert "secret:" in out and cli_front.SECRET not in out
    rc, out, _ = run("session", "get", "us-central1.s9", "--json")
    data = json.loads(out)
    assert rc == 0 and data["image_digest"] == cli_front.DIGEST and data["access_token"] == cli_front.SECRET
    rc, out, _ = run("session", "list", "--user", "ada", "--json")
    assert rc == 0 and all("access_token" not in s for s in json.loads(out))


def test_invalid_argument_names_the_field(run):
    rc, out, err = run("session", "create", "--user", "", "--accelerator", "gpu-p100",
                       "--image", "gpu:v154", "--json")
    assert rc == 1 and out == ""
    assert err.strip() == "error: INVALID_ARGUMENT: no user given (field spec.user_id: must not be empty)"


def test_not_found_is_one_line(run):
    rc, _, err = run("session", "get", "missing")
    assert rc == 1
    assert err == "error: NOT_FOUND: no session missing\n"


def test_every_call_is_tls_with_the_bearer_token(run, front, monkeypatch):
    assert run("session", "get", "us-central1.s1", "--json")[0] == 0
    assert front.sessions.metadata[-1]["authorization"] == "Bearer token-of-the-test"
    monkeypatch.delenv("PROVISIONER_TOKEN")
    rc, _, err = run("session", "get", "us-central1.s1")  # no token, and no local key to mint one
    assert rc == 1 and err.startswith("error: no credentials: give --token")


def test_a_dev_token_is_minted_from_the_local_key(run, front, monkeypatch, tmp_path):
    from provisioner.security.tokens import ensure_local_key

    monkeypatch.delenv("PROVISIONER_TOKEN")
    ensure_local_key(tmp_path / "auth")
    assert run("session", "get", "us-central1.s1")[0] == 0
    header = front.sessions.metadata[-1]["authorization"]
    assert header.startswith("Bearer ey") and header != "Bearer token-of-the-test"


def test_front_from_env(front, capsys, monkeypatch):
    monkeypatch.setenv("PROVISIONER_FRONT", front.addr)
    assert cli.main(["session", "get", "us-central1.s1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "us-central1.s1"
    assert front.sessions.requests[0].session_id == "us-central1.s1"


def test_unreachable_front(capsys, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PROVISIONER_FRONT", f"127.0.0.1:{port}")
    assert cli.main(["session", "get", "x", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: UNAVAILABLE: ")
    assert f"hint: nothing answers at 127.0.0.1:{port}: start the local fleet with `provisioner up`" in err


def test_usage_errors_exit_2(run, capsys):
    assert run("session", "list", "--user", "ada", "--state", "sleeping")[0] == 2
    assert run("session", "create", "--user", "a", "--accelerator", "g", "--image", "i",
               "--max-runtime", "soon")[0] == 2
    rc, _, err = run("session", "create", "--user", "a", "--accelerator", "g", "--image", "i",
                     "--require-region")
    assert rc == 2 and "--region" in err
    assert cli.main(["session"]) == 2
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0


def test_ctrl_c_exits_130(run, monkeypatch):
    def interrupted(c, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(session_commands, "session_get", interrupted)
    assert run("session", "get", "x")[0] == 130


def test_tracing_root_span_parents_the_call(run, front, monkeypatch):
    finished = InMemorySpanExporter()
    calls = []

    def setup_tracing(service_name, exporter=None, endpoint=None, file_path=None):
        calls.append((service_name, exporter))
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(finished))
        return provider

    fake = types.SimpleNamespace(setup_tracing=setup_tracing,
                                 shutdown_tracing=lambda provider: calls.append("shutdown"))
    monkeypatch.setitem(sys.modules, "provisioner.observability.telemetry", fake)

    rc, _, err = run("session", "get", "us-central1.s1", "--traces", "console")
    assert rc == 0
    assert calls == [("provisioner-cli", "console"), "shutdown"]
    spans = {s.name: s for s in finished.get_finished_spans()}
    root = spans["cli session get"]
    rpc = spans["/provisioner.v1.SessionService/GetSession"]
    assert rpc.parent.span_id == root.context.span_id
    trace_id = format(root.context.trace_id, "032x")
    assert f"trace: {trace_id}" in err
    assert trace_id in front.sessions.metadata[0]["traceparent"]


def test_json_before_the_command(front, capsys):
    assert cli.main(["--json", "--front", front.addr, "session", "list", "--user", "ada"]) == 0
    assert len(json.loads(capsys.readouterr().out)["sessions"]) == 2


def test_touching_an_ended_session_fails(run):
    rc, out, err = run("session", "touch", "us-central1.ended")
    assert rc == 1 and "stopped" in out
    assert err == "error: session us-central1.ended is stopped (idle for 1h0m): touching it keeps nothing alive\n"


def test_a_create_names_its_request_id_only_when_its_outcome_is_unknown(run, front):
    rc, _, err = run("session", "create", "--user", "unlucky", "--accelerator", "gpu-p100",
                     "--image", "gpu:v154", "--timeout", "2")
    request_ids = {r.spec.request_id for r in front.sessions.requests}
    assert rc == 1 and len(request_ids) == 1 and len(front.sessions.requests) > 1  # retried, same id
    assert f"retry with --request-id {request_ids.pop()}" in err
    rc, _, err = run("session", "create", "--user", "", "--accelerator", "gpu-p100", "--image", "gpu:v154")
    assert rc == 1 and "request id" not in err  # refused: nothing was made, nothing to retry


def test_list_by_cluster_without_a_user(run, front):
    rc, _, err = run("session", "list", "--cluster", "us-central1", "--state", "running")
    assert rc == 0, err
    req = front.sessions.requests[-1]
    assert (req.user_id, req.cluster, list(req.states)) == ("", "us-central1", [S.SESSION_STATE_RUNNING])


def test_front_flag_beats_env_at_any_level(front, capsys, monkeypatch):
    monkeypatch.setenv("PROVISIONER_FRONT", "127.0.0.1:1")
    assert cli.main(["session", "get", "us-central1.s1", "--front", front.addr]) == 0
    assert cli.main(["admin", "--front", front.addr, "clusters"]) == 0


def test_real_telemetry_file_exporter(run, tmp_path, monkeypatch):
    telemetry = pytest.importorskip("provisioner.observability.telemetry")
    path = tmp_path / "traces.jsonl"
    monkeypatch.setenv(getattr(telemetry, "ENV_FILE", "PROVISIONER_TRACES_FILE"), str(path))
    monkeypatch.setenv("PROVISIONER_TRACES", "file")
    rc, _, err = run("session", "get", "us-central1.s1")
    assert rc == 0, err
    names = [json.loads(line)["name"] for line in path.read_text().splitlines()]
    assert "cli session get" in names
    assert "/provisioner.v1.SessionService/GetSession" in names


def test_server_commands_register_alongside(monkeypatch, capsys):
    seen = []

    def register(subparsers):
        p = subparsers.add_parser("up")
        p.set_defaults(func=lambda args: seen.append(getattr(args, "traces", None)) or 3)

    monkeypatch.setitem(sys.modules, "provisioner.cli.servers", types.SimpleNamespace(register=register))
    assert cli.main(["--traces", "file", "up"]) == 3
    assert seen == ["file"]
    assert "session" in cli.build_parser().format_help()
