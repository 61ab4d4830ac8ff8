"""`provisioner session ...`: create, get, list, watch, touch and stop sessions, and a user's quota
(SessionService)."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from datetime import timedelta

from provisioner import client as api
from provisioner.cli import client, render
from provisioner.cli.client import CliError, Client, enum_arg
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import types_pb2

S = types_pb2.SessionState
_ENDED = {S.SESSION_STATE_STOPPED, S.SESSION_STATE_FAILED}


def _duration_arg(text: str) -> float:
    try:
        seconds = render.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return seconds


def _show_session(c: Client, s: types_pb2.Session) -> None:
    c.show(render.session_to_json(s), render.session_detail(s, client.now()))


def session_create(c: Client, args) -> int:
    if args.require_region and not args.region:
        raise CliError("--require-region needs --region", exit_code=2)
    request_id = args.request_id or str(uuid.uuid4())
    spec = types_pb2.SessionSpec(
        request_id=request_id, user_id=args.user, notebook_id=args.notebook or "",
        kind=args.kind or 0, accelerator=args.accelerator, image=args.image,
        region_hint=args.region or "", region_required=args.require_region,
        priority_class=args.priority_class or "", requeue_on_preemption=args.requeue)
    if args.max_runtime is not None:
        spec.max_runtime.FromTimedelta(timedelta(seconds=args.max_runtime))
    try:
        resp = c.call("CreateSession", session_pb.CreateSessionRequest(spec=spec))
    except (api.Unavailable, api.DeadlineExceeded):
        # Only when the session may exist is the request id worth keeping (a refusal made nothing).
        c.note(f"request id: {request_id} (the session may have been made: retry with "
               f"--request-id {request_id} to get it, never a second one)")
        raise
    s, note = resp.session, resp.placement_note
    if note:  # on stderr even with --json, which carries it too
        print(f"note: {note}", file=sys.stderr, flush=True)
    if args.wait and s.state != S.SESSION_STATE_RUNNING and s.state not in _ENDED:
        s = _wait_ready(c, s)
    c.show({**render.session_to_json(s), **({"placement_note": note} if note else {})},
           render.session_detail(s, client.now()))
    if args.wait:
        return 0 if s.state == S.SESSION_STATE_RUNNING else 1
    return 0


def _wait_ready(c: Client, s: types_pb2.Session) -> types_pb2.Session:
    """Follows the session until it runs or ends, reporting each change on stderr."""
    shown = ""
    for s in c.api.watch_messages(s.id):
        if not shown:
            _say_whose_clock(c, s)
        line = render.progress_line(s, client.now())
        if line != shown:
            print(line, file=sys.stderr, flush=True)
            shown = line
        if s.state == S.SESSION_STATE_RUNNING or s.state in _ENDED:
            break
    return s


def _say_whose_clock(c: Client, s: types_pb2.Session) -> None:
    if note := render.clock_note([s], client.now()):
        c.note(note)


def session_get(c: Client, args) -> int:
    _show_session(c, c.call("GetSession", session_pb.GetSessionRequest(session_id=args.session_id)).session)
    return 0


def session_list(c: Client, args) -> int:
    req = session_pb.ListSessionsRequest(user_id=args.user or "", cluster=args.cluster or "",
                                         states=args.state or [], page_size=args.page_size or 0,
                                         page_token=args.page_token or "", with_history=args.history)
    sessions, seen = [], {req.page_token}
    while True:
        resp = c.call("ListSessions", req)
        sessions.extend(resp.sessions)
        if not args.all or not resp.next_page_token:
            break
        if resp.next_page_token in seen:  # a server bug must not loop forever
            raise CliError(f"server repeated page token {resp.next_page_token!r}")
        seen.add(resp.next_page_token)
        req.page_token = resp.next_page_token
    next_token = "" if args.all else resp.next_page_token
    c.show({"sessions": [render.session_to_json(s) for s in sessions],
            "next_page_token": next_token},
           render.session_table(sessions, client.now()))
    if note := render.clock_note(sessions, client.now()):
        c.note(note)
    if next_token:
        c.note(f"more: --page-token {next_token} (or --all)")
    return 0


def session_watch(c: Client, args) -> int:
    for i, s in enumerate(c.api.watch_messages(args.session_id, args.after_revision)):
        if not i:
            _say_whose_clock(c, s)
        if c.json:
            print(json.dumps(render.session_to_json(s)), flush=True)
        else:
            print(render.progress_line(s, client.now()), flush=True)
        if s.state in _ENDED:
            return 1 if s.state == S.SESSION_STATE_FAILED else 0
    return 0


def session_touch(c: Client, args) -> int:
    s = c.call("TouchSession", session_pb.TouchSessionRequest(session_id=args.session_id)).session
    _show_session(c, s)
    if s.state in _ENDED or s.state == S.SESSION_STATE_STOPPING:
        raise CliError(f"session {s.id} is {render.enum_short(S, s.state)}"
                       + (f" ({s.reason})" if s.reason else "") + ": touching it keeps nothing alive")
    return 0


def session_stop(c: Client, args) -> int:
    req = session_pb.StopSessionRequest(session_id=args.session_id, reason=args.reason or "")
    _show_session(c, c.call("StopSession", req).session)
    return 0


def session_quota(c: Client, args) -> int:
    q = c.call("GetQuota", session_pb.GetQuotaRequest(user_id=args.user)).quota
    c.show(render.quota_to_json(q), render.quota_detail(q, client.now()))
    return 0


def register(subparsers, common: argparse.ArgumentParser) -> None:
    """Adds the `session` command group; `common` holds the client's flags."""
    session_states = ", ".join(render.enum_choices(types_pb2.SessionState))

    add = client.group(subparsers, "session", common, "notebook sessions (SessionService)")
    p = add("create", session_create, "start a session")
    p.add_argument("--user", required=True)
    p.add_argument("--accelerator", required=True,
                   help="a pool (gpu-p100) or an accelerator type one pool has (nvidia-tesla-p100, as admin pools shows)")
    p.add_argument("--image", required=True, help="e.g. gpu:v154 or gpu:latest")
    p.add_argument("--kind", type=enum_arg(types_pb2.SessionKind), metavar="interactive|batch")
    p.add_argument("--notebook")
    p.add_argument("--region", help="preferred region")
    p.add_argument("--require-region", action="store_true",
                   help="only --region may serve the session")
    p.add_argument("--max-runtime", type=_duration_arg, metavar="DURATION",
                   help="e.g. 2h, 90m, 3600s")
    p.add_argument("--priority-class", metavar="CLASS",
                   help="a priority class of the fleet's, no higher than the kind's (default: the kind's)")
    p.add_argument("--requeue", action="store_true", help="if preempted, queue a new session in its place")
    p.add_argument("--request-id", help="idempotency key (default: a new uuid4)")
    p.add_argument("--wait", action="store_true",
                   help="show progress until running; exit 1 if it stops or fails instead")

    p = add("get", session_get, "show a session")
    p.add_argument("session_id", metavar="SESSION_ID")

    p = add("list", session_list, "sessions, newest first: a user's, or a cluster's (operators)")
    p.add_argument("--user", help="only this user's (default: every user's, for service and admin tokens)")
    p.add_argument("--cluster", help="only sessions on this cluster")
    p.add_argument("--state", type=enum_arg(S), nargs="+", action="extend", metavar="STATE",
                   help=f"only these states: {session_states}")
    p.add_argument("--page-size", type=int)
    p.add_argument("--page-token")
    p.add_argument("--all", action="store_true", help="follow every page")
    p.add_argument("--history", action="store_true", help="each session with its history (as `session get` shows it)")

    p = add("watch", session_watch,
                 "print each change until the session stops or fails")
    p.add_argument("session_id", metavar="SESSION_ID")
    p.add_argument("--after-revision", type=int, default=0)

    p = add("touch", session_touch, "record activity so it is not culled")
    p.add_argument("session_id", metavar="SESSION_ID")

    p = add("stop", session_stop, "stop a session")
    p.add_argument("session_id", metavar="SESSION_ID")
    p.add_argument("--reason")

    p = add("quota", session_quota, "a user's GPU hours and session limits")
    p.add_argument("--user", required=True)
