"""`provisioner session ...` and `provisioner admin ...`: the public API from a terminal or a script.

Human output goes to stdout as tables or `key: value` lines; progress and hints go to stderr, so
`--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import grpc

from provisioner import client as api
from provisioner.client import _base, credentials as api_credentials
from provisioner.cli import render
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import types_pb2

DEFAULT_FRONT = _base.DEFAULT_FRONT
DEFAULT_TIMEOUT_S = _base.DEFAULT_TIMEOUT_S
TRACE_EXPORTERS = ("none", "console", "otlp", "file")
MAX_AUDIT_PAGE = 500  # the most records the server sends in one page
MAX_BLOCK_PAGE = 500  # and blocked users
# SetUserQuotaRequest's cap field for each session kind.
QUOTA_KINDS = {"interactive": "max_active_sessions", "batch": "max_active_batch_sessions"}

S = types_pb2.SessionState
_ENDED = {S.SESSION_STATE_STOPPED, S.SESSION_STATE_FAILED}


class CliError(Exception):
    """A problem found by the CLI itself; `exit_code` 2 marks a usage error."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def describe_error(err: api.ProvisionerError, front: str) -> str:
    """One line: `error: CODE: message (field ...; retry in ...)`, with a hint when the front
    cannot be reached at all."""
    line = f"error: {err}"
    if isinstance(err, api.Unavailable) and err.unreachable:
        line += (f"\nhint: nothing answers at {front}: start the local fleet with `provisioner up`, "
                 "or point --front (or PROVISIONER_FRONT) at the front")
    return line


# --- arguments -----------------------------------------------------------------------------


def _enum_arg(enum) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return render.enum_value(enum, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _since_arg(text: str) -> float:
    """Epoch seconds from an ISO 8601 time (UTC unless it says otherwise) or a span back from now
    (-1h, 1h, 30m)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return _now() - render.parse_duration(text.strip().removeprefix("-"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an ISO 8601 time (2024-05-01T12:00:00Z) or a span back from now (-1h), got {text!r}"
            ) from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _max_active_arg(text: str) -> dict[str, int]:
    """`N` (each kind alike) or `interactive=N,batch=M` (either or both)."""
    def cap(value: str) -> int:
        if not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value!r}")
        return int(value)

    if "=" not in text:
        return {kind: cap(text) for kind in QUOTA_KINDS}
    caps = {}
    for part in text.split(","):
        kind, _, value = part.partition("=")
        if kind.strip() not in QUOTA_KINDS:
            raise argparse.ArgumentTypeError(f"expected N or interactive=N,batch=M, got {text!r}")
        caps[kind.strip()] = cap(value)
    return caps


def _duration_arg(text: str) -> float:
    try:
        seconds = render.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return seconds


def add_trace_flag(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a flag given at any level (top, group or command) survives the levels below it.
    parser.add_argument(
        "--traces", choices=TRACE_EXPORTERS, default=argparse.SUPPRESS,
        help="trace exporter (default: $PROVISIONER_TRACES, else none)")


def _client_flags() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--front", default=argparse.SUPPRESS,
        help=f"front address (default: $PROVISIONER_FRONT, else {DEFAULT_FRONT})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable JSON on stdout")
    common.add_argument("--wide", action="store_true", default=argparse.SUPPRESS,
                        help="every image of a VM or pool instead of a summary")
    common.add_argument("--timeout", type=_positive_float, default=argparse.SUPPRESS, metavar="SECONDS",
                        help=f"deadline of each call (default {DEFAULT_TIMEOUT_S:g}; not for watches)")
    common.add_argument("--token", default=argparse.SUPPRESS,
                        help="bearer token (default: $PROVISIONER_TOKEN, else the file $PROVISIONER_TOKEN_FILE, "
                             "else a dev token from the local fleet's key in the data dir)")
    common.add_argument("--ca", default=argparse.SUPPRESS, metavar="PEM",
                        help="CA certificate to trust for the front (default: $PROVISIONER_CA, else the local "
                             "fleet's CA in the data dir if there is one, else the system's roots)")
    common.add_argument("--data-dir", default=argparse.SUPPRESS,
                        help="the local fleet's data dir, for its CA and key (default: $PROVISIONER_DATA_DIR, "
                             "else .data)")
    add_trace_flag(common)
    return common


def credentials(args: argparse.Namespace) -> api.Credentials:
    """From flags, else as the client library finds them (environment, local fleet)."""
    try:
        return api_credentials.resolve(getattr(args, "token", None), getattr(args, "ca", None),
                                       getattr(args, "data_dir", None))
    except api.NoCredentials as e:
        raise CliError(e.message) from None


# --- running a command ---------------------------------------------------------------------


class Client:
    def __init__(self, channel: grpc.Channel, args: argparse.Namespace):
        self.api = api.Client(front_address(args), channel=channel,
                              timeout=getattr(args, "timeout", DEFAULT_TIMEOUT_S))
        self.json = getattr(args, "json", False)
        self.wide = getattr(args, "wide", False)

    def call(self, method: str, request):
        return self.api.call(method, request)

    def show(self, obj, text: str) -> None:
        print(json.dumps(obj, indent=2) if self.json else text, flush=True)

    def note(self, text: str) -> None:
        if not self.json:
            print(text, file=sys.stderr, flush=True)


def front_address(args: argparse.Namespace) -> str:
    return getattr(args, "front", None) or os.environ.get("PROVISIONER_FRONT") or DEFAULT_FRONT


def trace_exporter(args: argparse.Namespace) -> str:
    return getattr(args, "traces", None) or os.environ.get("PROVISIONER_TRACES") or "none"


class Tracing:
    """The CLI's tracer, if the telemetry module and OpenTelemetry are installed; otherwise every
    method is a no-op."""

    def __init__(self, exporter: str):
        self.exporter = exporter
        self.provider = None
        try:
            self._telemetry = importlib.import_module("provisioner.telemetry")
        except ModuleNotFoundError as e:
            # Without the module, or with only the client's packages installed: no tracing.
            if e.name != "provisioner.telemetry" and (e.name or "").startswith("provisioner"):
                raise
            return
        self.provider = self._telemetry.setup_tracing("provisioner-cli", exporter=exporter)

    def wrap(self, channel: grpc.Channel) -> grpc.Channel:
        if self.provider is None:
            return channel
        # The sync interceptor only fits OpenTelemetry's own channel wrapper, not grpc's.
        from opentelemetry.instrumentation.grpc import client_interceptor, grpcext

        return grpcext.intercept_channel(channel, client_interceptor(tracer_provider=self.provider))

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        if self.provider is None:
            yield
            return
        tracer = self.provider.get_tracer("provisioner.cli")
        with tracer.start_as_current_span(name) as span:
            try:
                yield
            finally:
                if self.exporter != "none":  # so an operator can find the trace
                    trace_id = format(span.get_span_context().trace_id, "032x")
                    print(f"trace: {trace_id}", file=sys.stderr, flush=True)

    def shutdown(self) -> None:
        if self.provider is not None:
            self._telemetry.shutdown_tracing(self.provider)


def _run(name: str, handler: Callable[[Client, argparse.Namespace], int],
         args: argparse.Namespace) -> int:
    tracing = Tracing(trace_exporter(args))
    try:
        creds = credentials(args)
        channel = grpc.secure_channel(front_address(args),
                                      api_credentials.front_credentials(creds.ca_pem, creds.token))
        with tracing.wrap(channel) as channel, tracing.span(f"cli {name}"):
            return handler(Client(channel, args), args)
    finally:
        tracing.shutdown()


# --- session commands ----------------------------------------------------------------------


def _now() -> float:
    return time.time()


def _show_session(c: Client, s: types_pb2.Session) -> None:
    c.show(render.session_to_json(s), render.session_detail(s, _now()))


def session_create(c: Client, args) -> int:
    if args.require_region and not args.region:
        raise CliError("--require-region needs --region", exit_code=2)
    request_id = args.request_id or str(uuid.uuid4())
    spec = types_pb2.SessionSpec(
        request_id=request_id, user_id=args.user, notebook_id=args.notebook or "",
        kind=args.kind or 0, accelerator=args.accelerator, image=args.image,
        region_hint=args.region or "", region_required=args.require_region)
    if args.max_runtime is not None:
        spec.max_runtime.FromTimedelta(timedelta(seconds=args.max_runtime))
    try:
        s = c.call("CreateSession", session_pb.CreateSessionRequest(spec=spec)).session
    except (api.Unavailable, api.DeadlineExceeded):
        # Only when the session may exist is the request id worth keeping (a refusal made nothing).
        c.note(f"request id: {request_id} (the session may have been made: retry with "
               f"--request-id {request_id} to get it, never a second one)")
        raise
    if args.wait and s.state != S.SESSION_STATE_RUNNING and s.state not in _ENDED:
        s = _wait_ready(c, s)
    _show_session(c, s)
    if args.wait:
        return 0 if s.state == S.SESSION_STATE_RUNNING else 1
    return 0


def _wait_ready(c: Client, s: types_pb2.Session) -> types_pb2.Session:
    """Follows the session until it runs or ends, reporting each change on stderr."""
    shown = ""
    for s in c.api.watch_messages(s.id):
        line = render.progress_line(s, _now())
        if line != shown:
            print(line, file=sys.stderr, flush=True)
            shown = line
        if s.state == S.SESSION_STATE_RUNNING or s.state in _ENDED:
            break
    return s


def session_get(c: Client, args) -> int:
    _show_session(c, c.call("GetSession", session_pb.GetSessionRequest(session_id=args.session_id)).session)
    return 0


def session_list(c: Client, args) -> int:
    req = session_pb.ListSessionsRequest(user_id=args.user or "", cluster=args.cluster or "",
                                         states=args.state or [], page_size=args.page_size or 0,
                                         page_token=args.page_token or "")
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
           render.session_table(sessions, _now()))
    if note := render.clock_note(sessions, _now()):
        c.note(note)
    if next_token:
        c.note(f"more: --page-token {next_token} (or --all)")
    return 0


def session_watch(c: Client, args) -> int:
    for s in c.api.watch_messages(args.session_id, args.after_revision):
        if c.json:
            print(json.dumps(render.session_to_json(s)), flush=True)
        else:
            print(render.progress_line(s, _now()), flush=True)
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
    c.show(render.quota_to_json(q), render.quota_detail(q, _now()))
    return 0


# --- admin commands ------------------------------------------------------------------------


def admin_clusters(c: Client, args) -> int:
    clusters = c.call("ListClusters", admin_pb.ListClustersRequest()).clusters
    c.show({"clusters": [render.cluster_to_json(x) for x in clusters]},
           render.cluster_table(clusters))
    return 0


def admin_pools(c: Client, args) -> int:
    pools = c.call("ListPools", admin_pb.ListPoolsRequest(cluster=args.cluster or "")).pools
    c.show({"pools": [render.pool_to_json(p) for p in pools]}, render.pool_table(pools))
    return 0


def admin_drain(c: Client, args) -> int:
    cluster = c.call("DrainCluster", admin_pb.DrainClusterRequest(cluster=args.cluster)).cluster
    c.show(render.cluster_to_json(cluster), render.cluster_detail(cluster))
    return 0


def admin_undrain(c: Client, args) -> int:
    cluster = c.call("UndrainCluster", admin_pb.UndrainClusterRequest(cluster=args.cluster)).cluster
    c.show(render.cluster_to_json(cluster), render.cluster_detail(cluster))
    return 0


def admin_set_policy(c: Client, args) -> int:
    # Only flags given are set: proto3 optional presence tells the server what to leave alone.
    given = {"min_vms": args.min, "max_vms": args.max, "headroom_fraction": args.headroom,
             "autoscaler": args.autoscaler, "recycle": args.recycle}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        raise CliError("nothing to set: give --min, --max, --headroom, --autoscaler or "
                       "--recycle/--no-recycle", exit_code=2)
    req = admin_pb.SetPoolPolicyRequest(cluster=args.cluster, pool=args.pool,
                                        policy=types_pb2.PoolPolicy(**given))
    pool = c.call("SetPoolPolicy", req).pool
    c.show(render.pool_to_json(pool), render.pool_detail(pool, c.wide))
    autoscaler = pool.policy.autoscaler if pool.policy.HasField("autoscaler") else ""
    if args.headroom is not None and autoscaler != "headroom":
        print(f"warning: headroom is kept but has no effect while {pool.name}'s autoscaler is {autoscaler}; "
              "add --autoscaler headroom to use it", file=sys.stderr, flush=True)
    return 0


def admin_prewarm(c: Client, args) -> int:
    req = admin_pb.PrewarmImageRequest(cluster=args.cluster, pool=args.pool, image=args.image,
                                       count=args.count)
    vm_ids = list(c.call("PrewarmImage", req).vm_ids)
    text = (f"pulling {args.image} onto {len(vm_ids)} VM(s): {', '.join(vm_ids)}" if vm_ids
            else f"no VM needs to pull {args.image}")
    c.show({"vm_ids": vm_ids}, text)
    return 0


def admin_vms(c: Client, args) -> int:
    req = admin_pb.ListVmsRequest(cluster=args.cluster or "", pool=args.pool or "",
                                  states=args.state or [])
    vms = c.call("ListVms", req).vms
    c.show({"vms": [render.vm_to_json(v) for v in vms]}, render.vm_table(vms, _now(), c.wide))
    if note := render.clock_note(vms, _now()):
        c.note(note)
    return 0


def admin_reset_policy(c: Client, args) -> int:
    req = admin_pb.SetPoolPolicyRequest(cluster=args.cluster, pool=args.pool, reset=True)
    pool = c.call("SetPoolPolicy", req).pool
    c.show(render.pool_to_json(pool), render.pool_detail(pool, c.wide))
    return 0


def admin_audit(c: Client, args) -> int:
    req = admin_pb.ListAuditRecordsRequest(cluster=args.cluster or "", identity=args.identity or "",
                                           rpc=args.rpc or "", outcome=args.outcome or "")
    if args.since is not None:
        req.since.FromNanoseconds(int(args.since * 1e9))
    records, seen = [], {""}
    while len(records) < args.limit:
        req.page_size = min(args.limit - len(records), MAX_AUDIT_PAGE)
        resp = c.call("ListAuditRecords", req)
        records.extend(resp.records)
        if not resp.next_page_token:
            break
        if resp.next_page_token in seen:  # a server bug must not loop forever
            raise CliError(f"server repeated page token {resp.next_page_token!r}")
        seen.add(resp.next_page_token)
        req.page_token = resp.next_page_token
    more = bool(resp.next_page_token)
    c.show({"records": [render.audit_record_to_json(r) for r in records], "more": more},
           render.audit_table(records))
    if more:
        c.note(f"showing the newest {len(records)}; more with a higher --limit or a later --since")
    return 0


def admin_quota_set(c: Client, args) -> int:
    req = admin_pb.SetUserQuotaRequest(user_id=args.user, clear=args.clear)
    if args.gpu_hours is not None:
        req.gpu_hours_per_week = args.gpu_hours
    for kind, cap in (args.max_active or {}).items():
        setattr(req, QUOTA_KINDS[kind], cap)
    if not (args.clear or args.gpu_hours is not None or args.max_active):
        raise CliError("nothing to set: give --gpu-hours, --max-active or --clear", exit_code=2)
    resp = c.call("SetUserQuota", req)
    c.show(render.user_quota_to_json(resp.override, resp.quota),
           render.user_quota_detail(resp.override, resp.quota, _now()))
    return 0


def admin_quota_show(c: Client, args) -> int:
    resp = c.call("GetUserQuota", admin_pb.GetUserQuotaRequest(user_id=args.user))
    c.show(render.user_quota_to_json(resp.override, resp.quota),
           render.user_quota_detail(resp.override, resp.quota, _now()))
    return 0


def admin_user_block(c: Client, args) -> int:
    resp = c.call("BlockUser", admin_pb.BlockUserRequest(user_id=args.user, reason=args.reason))
    c.show(render.user_block_to_json(resp.block), render.user_block_detail(args.user, resp.block, []))
    if resp.already_blocked:
        c.note(f"{args.user} was blocked already: that block stands as it was")
    return 0


def admin_user_unblock(c: Client, args) -> int:
    resp = c.call("UnblockUser", admin_pb.UnblockUserRequest(user_id=args.user))
    lifted = resp.block if resp.HasField("block") else None
    c.show({"user": args.user, "lifted": render.user_block_to_json(lifted) if lifted else None},
           f"{args.user}: block lifted (it was by {lifted.blocked_by}: {lifted.reason})" if lifted
           else f"{args.user} was not blocked")
    return 0


def admin_user_show(c: Client, args) -> int:
    resp = c.call("GetUserBlock", admin_pb.GetUserBlockRequest(user_id=args.user))
    block = resp.block if resp.HasField("block") else None
    c.show(render.user_block_state_to_json(args.user, block, resp.decisions, resp.past_blocks),
           render.user_block_detail(args.user, block, resp.decisions, resp.past_blocks))
    return 0


def admin_user_list(c: Client, args) -> int:
    req, blocks = admin_pb.ListBlockedUsersRequest(), []
    while len(blocks) < args.limit:
        req.page_size = min(args.limit - len(blocks), MAX_BLOCK_PAGE)
        resp = c.call("ListBlockedUsers", req)
        blocks.extend(resp.blocks)
        if not resp.next_page_token or resp.next_page_token == req.page_token:
            break
        req.page_token = resp.next_page_token
    more = bool(resp.next_page_token)
    c.show({"blocks": [render.user_block_to_json(b) for b in blocks], "more": more},
           render.blocked_users_table(blocks))
    if more:
        c.note(f"showing the newest {len(blocks)}; more with a higher --limit")
    return 0


def admin_evict(c: Client, args) -> int:
    req = admin_pb.EvictVmRequest(cluster=args.cluster, vm_id=args.vm_id, reason=args.reason or "")
    vm = c.call("EvictVm", req).vm
    c.show(render.vm_to_json(vm), render.vm_detail(vm, c.wide))
    return 0


# --- parser --------------------------------------------------------------------------------


def _group(subparsers, group_name: str, common, help: str):
    """A command group; returns add(name, handler, help) -> the command's parser."""
    return _commands(subparsers.add_parser(group_name, parents=[common], help=help, description=help),
                     group_name, common)


def _commands(p: argparse.ArgumentParser, group_name: str, common):
    """The commands of group `p` (e.g. "admin", or "admin quota"): add(name, handler, help);
    a command without a handler is a group of its own."""
    group = p.add_subparsers(dest=f"{group_name.replace(' ', '_')}_command", metavar="COMMAND", required=True)

    def add(name: str, handler, help: str) -> argparse.ArgumentParser:
        cmd = group.add_parser(name, parents=[common], help=help, description=help)
        full = f"{group_name} {name}"
        if handler is not None:
            cmd.set_defaults(func=lambda args: _run(full, handler, args))
        return cmd

    return add


def register(subparsers) -> None:
    """Adds the `session` and `admin` command groups."""
    common = _client_flags()
    session_states = ", ".join(render.enum_choices(types_pb2.SessionState))
    vm_states = ", ".join(render.enum_choices(types_pb2.VmState))

    add = _group(subparsers, "session", common, "notebook sessions (SessionService)")
    p = add("create", session_create, "start a session")
    p.add_argument("--user", required=True)
    p.add_argument("--accelerator", required=True, help="pool shape, e.g. gpu-p100")
    p.add_argument("--image", required=True, help="e.g. gpu:v154 or gpu:latest")
    p.add_argument("--kind", type=_enum_arg(types_pb2.SessionKind), metavar="interactive|batch")
    p.add_argument("--notebook")
    p.add_argument("--region", help="preferred region")
    p.add_argument("--require-region", action="store_true",
                   help="only --region may serve the session")
    p.add_argument("--max-runtime", type=_duration_arg, metavar="DURATION",
                   help="e.g. 2h, 90m, 3600s")
    p.add_argument("--request-id", help="idempotency key (default: a new uuid4)")
    p.add_argument("--wait", action="store_true",
                   help="show progress until running; exit 1 if it stops or fails instead")

    p = add("get", session_get, "show a session")
    p.add_argument("session_id", metavar="SESSION_ID")

    p = add("list", session_list, "sessions, newest first: a user's, or a cluster's (operators)")
    p.add_argument("--user", help="only this user's (default: every user's, for service and admin tokens)")
    p.add_argument("--cluster", help="only sessions on this cluster")
    p.add_argument("--state", type=_enum_arg(S), nargs="+", action="extend", metavar="STATE",
                   help=f"only these states: {session_states}")
    p.add_argument("--page-size", type=int)
    p.add_argument("--page-token")
    p.add_argument("--all", action="store_true", help="follow every page")

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

    add = _group(subparsers, "admin", common, "clusters, pools and VMs (AdminService)")
    add("clusters", admin_clusters, "list clusters")
    p = add("pools", admin_pools, "list pools")
    p.add_argument("--cluster")
    p = add("drain", admin_drain, "send no new sessions to a cluster")
    p.add_argument("cluster", metavar="CLUSTER")
    p = add("undrain", admin_undrain, "take new sessions again")
    p.add_argument("cluster", metavar="CLUSTER")

    p = add("set-policy", admin_set_policy,
                 "change a pool's autoscaling policy; fields not given stay as they are")
    p.add_argument("--cluster", required=True)
    p.add_argument("--pool", required=True)
    p.add_argument("--min", type=int, help="minimum VMs")
    p.add_argument("--max", type=int, help="maximum VMs")
    p.add_argument("--headroom", type=float, help="warm VMs above demand, as a fraction")
    p.add_argument("--autoscaler", choices=("fixed", "headroom", "predictive"))
    p.add_argument("--recycle", action=argparse.BooleanOptionalAction,
                   help="wipe VMs after a session and keep them warm, or delete them")

    p = add("prewarm", admin_prewarm, "pull an image onto warm VMs ahead of demand")
    p.add_argument("--cluster", required=True)
    p.add_argument("--pool", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--count", type=int, default=1, help="warm VMs that should hold it")

    p = add("vms", admin_vms, "list VMs")
    p.add_argument("--cluster")
    p.add_argument("--pool")
    p.add_argument("--state", type=_enum_arg(types_pb2.VmState), nargs="+", action="extend",
                   metavar="STATE", help=f"only these states: {vm_states}")

    p = add("reset-policy", admin_reset_policy,
            "drop every policy change made to a pool through the API: back to its config file")
    p.add_argument("--cluster", required=True)
    p.add_argument("--pool", required=True)

    p = add("audit", admin_audit, "the audit log (operator actions and refused calls), newest first")
    # `--since -1h`: take "-1..." as a value, not an option (as argparse itself does from Python 3.13).
    p._negative_number_matcher = re.compile(r"^-\.?\d")
    p.add_argument("--cluster", help="that cluster's log (default: the front's)")
    p.add_argument("--identity", help="only calls by this identity")
    p.add_argument("--rpc", metavar="NAME", help="only this RPC: DrainCluster, or a full name")
    p.add_argument("--outcome", help="only this outcome: ok, denied, or a status code (NOT_FOUND, ...)")
    p.add_argument("--since", type=_since_arg, metavar="TIME",
                   help="ISO 8601 (2024-05-01T12:00:00Z) or a span back from now (-1h, -30m)")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N",
                   help="show at most N records (default 50)")

    p = add("evict", admin_evict, "take a VM out of service")
    p.add_argument("--cluster", required=True)
    p.add_argument("vm_id", metavar="VM_ID")
    p.add_argument("--reason")

    admin = add
    help = "a user's own quota limits, over the fleet config's (kept by the front)"
    add = _commands(add("quota", None, help), "admin quota", common)
    p = add("set", admin_quota_set, "set a user's budget or caps; limits not given stay as they are")
    p.add_argument("user", metavar="USER")
    p.add_argument("--gpu-hours", type=float, metavar="N", help="weekly GPU hours")
    p.add_argument("--max-active", type=_max_active_arg, metavar="N|interactive=N,batch=M",
                   help="caps on live sessions: one number for each kind alike, or per kind")
    p.add_argument("--clear", action="store_true",
                   help="first drop what was set for the user (back to the fleet config), then apply the rest")
    p = add("show", admin_quota_show, "what was set for a user, and the limits and usage in force")
    p.add_argument("user", metavar="USER")

    help = "users blocked from new GPU sessions, by operators or by abuse detection (kept by the front)"
    add = _commands(admin("user", None, help), "admin user", common)
    p = add("block", admin_user_block, "block a user from new GPU sessions until unblocked")
    p.add_argument("user", metavar="USER")
    p.add_argument("--reason", required=True, help="why, for the other operators (the user is not shown it)")
    p = add("unblock", admin_user_unblock, "lift a user's block")
    p.add_argument("user", metavar="USER")
    p = add("show", admin_user_show, "a user's block, and what abuse detection flagged of theirs")
    p.add_argument("user", metavar="USER")
    p = add("list", admin_user_list, "blocked users, newest first")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="show at most N (default 50)")
