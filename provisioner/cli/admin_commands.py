"""`provisioner admin ...`: clusters, pools, VMs, the audit log, users' quotas and blocks
(AdminService)."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timezone

from provisioner.cli import client, render, render_admin
from provisioner.cli.client import CliError, Client, enum_arg
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import types_pb2

MAX_AUDIT_PAGE = 500  # the most records the server sends in one page
MAX_BLOCK_PAGE = 500  # and blocked users
# SetUserQuotaRequest's cap field for each session kind.
QUOTA_KINDS = {"interactive": "max_active_sessions", "batch": "max_active_batch_sessions"}


def _since_arg(text: str) -> float:
    """Epoch seconds from an ISO 8601 time (UTC unless it says otherwise) or a span back from now
    (-1h, 1h, 30m)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return client.now() - render.parse_duration(text.strip().removeprefix("-"))
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


def admin_clusters(c: Client, args) -> int:
    clusters = c.call("ListClusters", admin_pb.ListClustersRequest()).clusters
    c.show({"clusters": [render_admin.cluster_to_json(x) for x in clusters]},
           render_admin.cluster_table(clusters))
    return 0


def admin_pools(c: Client, args) -> int:
    pools = c.call("ListPools", admin_pb.ListPoolsRequest(cluster=args.cluster or "")).pools
    c.show({"pools": [render_admin.pool_to_json(p) for p in pools]}, render_admin.pool_table(pools))
    return 0


def admin_drain(c: Client, args) -> int:
    cluster = c.call("DrainCluster", admin_pb.DrainClusterRequest(cluster=args.cluster)).cluster
    c.show(render_admin.cluster_to_json(cluster), render_admin.cluster_detail(cluster))
    return 0


def admin_undrain(c: Client, args) -> int:
    cluster = c.call("UndrainCluster", admin_pb.UndrainClusterRequest(cluster=args.cluster)).cluster
    c.show(render_admin.cluster_to_json(cluster), render_admin.cluster_detail(cluster))
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
    c.show(render_admin.pool_to_json(pool), render_admin.pool_detail(pool, c.wide))
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
    c.show({"vms": [render_admin.vm_to_json(v) for v in vms]}, render_admin.vm_table(vms, client.now(), c.wide))
    if note := render.clock_note(vms, client.now()):
        c.note(note)
    return 0


def admin_reset_policy(c: Client, args) -> int:
    req = admin_pb.SetPoolPolicyRequest(cluster=args.cluster, pool=args.pool, reset=True)
    pool = c.call("SetPoolPolicy", req).pool
    c.show(render_admin.pool_to_json(pool), render_admin.pool_detail(pool, c.wide))
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
    c.show({"records": [render_admin.audit_record_to_json(r) for r in records], "more": more},
           render_admin.audit_table(records, c.wide))
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
    c.show(render_admin.user_quota_to_json(resp.override, resp.quota),
           render_admin.user_quota_detail(resp.override, resp.quota, client.now()))
    return 0


def admin_quota_show(c: Client, args) -> int:
    resp = c.call("GetUserQuota", admin_pb.GetUserQuotaRequest(user_id=args.user))
    c.show(render_admin.user_quota_to_json(resp.override, resp.quota),
           render_admin.user_quota_detail(resp.override, resp.quota, client.now()))
    return 0


def admin_user_block(c: Client, args) -> int:
    resp = c.call("BlockUser", admin_pb.BlockUserRequest(user_id=args.user, reason=args.reason))
    c.show(render_admin.user_block_to_json(resp.block), render_admin.user_block_detail(args.user, resp.block, []))
    if resp.already_blocked:
        c.note(f"{args.user} was blocked already: that block stands as it was")
    return 0


def admin_user_unblock(c: Client, args) -> int:
    resp = c.call("UnblockUser", admin_pb.UnblockUserRequest(user_id=args.user))
    lifted = resp.block if resp.HasField("block") else None
    c.show({"user": args.user, "lifted": render_admin.user_block_to_json(lifted) if lifted else None},
           f"{args.user}: block lifted (it was by {lifted.blocked_by}: {lifted.reason})" if lifted
           else f"{args.user} was not blocked")
    return 0


def admin_user_show(c: Client, args) -> int:
    resp = c.call("GetUserBlock", admin_pb.GetUserBlockRequest(user_id=args.user))
    block = resp.block if resp.HasField("block") else None
    c.show(render_admin.user_block_state_to_json(args.user, block, resp.decisions, resp.past_blocks),
           render_admin.user_block_detail(args.user, block, resp.decisions, resp.past_blocks))
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
    c.show({"blocks": [render_admin.user_block_to_json(b) for b in blocks], "more": more},
           render_admin.blocked_users_table(blocks))
    if more:
        c.note(f"showing the newest {len(blocks)}; more with a higher --limit")
    return 0


def admin_evict(c: Client, args) -> int:
    req = admin_pb.EvictVmRequest(cluster=args.cluster, vm_id=args.vm_id, reason=args.reason or "")
    vm = c.call("EvictVm", req).vm
    c.show(render_admin.vm_to_json(vm), render_admin.vm_detail(vm, c.wide))
    return 0


def register(subparsers, common: argparse.ArgumentParser) -> None:
    """Adds the `admin` command group; `common` holds the client's flags."""
    vm_states = ", ".join(render.enum_choices(types_pb2.VmState))

    add = client.group(subparsers, "admin", common, "clusters, pools and VMs (AdminService)")
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
    p.add_argument("--state", type=enum_arg(types_pb2.VmState), nargs="+", action="extend",
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
    add = client.commands(add("quota", None, help), "admin quota", common)
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
    add = client.commands(admin("user", None, help), "admin user", common)
    p = add("block", admin_user_block, "block a user from new GPU sessions until unblocked")
    p.add_argument("user", metavar="USER")
    p.add_argument("--reason", required=True, help="why, for the other operators (the user is not shown it)")
    p = add("unblock", admin_user_unblock, "lift a user's block")
    p.add_argument("user", metavar="USER")
    p = add("show", admin_user_show, "a user's block, and what abuse detection flagged of theirs")
    p.add_argument("user", metavar="USER")
    p = add("list", admin_user_list, "blocked users, newest first")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="show at most N (default 50)")
