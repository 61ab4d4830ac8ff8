"""The admin commands' output as JSON-ready dicts and text: clusters, pools, VMs, a user's quota
as operators set it, audit records and blocked users (the shared helpers are in `render`).

Pure functions: anything time-relative takes `now` (epoch seconds) from the caller.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from provisioner.cli.render import (age, enum_short, epoch, format_bytes, history_to_json, kv, quota_pairs,
                                    quota_to_json, server_now, table, ts)
from provisioner.v1 import types_pb2

# --- messages -> dicts ---------------------------------------------------------------------


def policy_to_json(p: types_pb2.PoolPolicy) -> dict[str, Any]:
    # Unset (proto3 optional) fields are null: "not configured here", not zero.
    fields = ("min_vms", "max_vms", "headroom_fraction", "autoscaler", "recycle")
    return {f: getattr(p, f) if p.HasField(f) else None for f in fields}


def capacity_to_json(c: types_pb2.PoolCapacity) -> dict[str, Any]:
    return {
        "pool": c.pool,
        "accelerator": c.accelerator,
        "warm_by_image": [{"image": i.image, "count": i.count} for i in c.warm_by_image],
        "warm": c.warm,
        "booting": c.booting,
        "assigned": c.assigned,
        "queued": c.queued,
        "unhealthy": c.unhealthy,
        "min_vms": c.min_vms,
        "max_vms": c.max_vms,
        "cold_start_s": c.cold_start_s,
        "stocked_out_zones": list(c.stocked_out_zones),
    }


def pool_to_json(p: types_pb2.Pool) -> dict[str, Any]:
    return {
        "cluster": p.cluster,
        "name": p.name,
        "accelerator": p.accelerator,
        "machine_type": p.machine_type,
        "zones": list(p.zones),
        "hourly_price_usd": p.hourly_price_usd,
        "policy": policy_to_json(p.policy) if p.HasField("policy") else None,
        "capacity": capacity_to_json(p.capacity) if p.HasField("capacity") else None,
    }


def cluster_to_json(c: types_pb2.Cluster) -> dict[str, Any]:
    return {
        "name": c.name,
        "region": c.region,
        "address": c.address,
        "healthy": c.healthy,
        "draining": c.draining,
        "pools": [pool_to_json(p) for p in c.pools],
    }


def vm_to_json(v: types_pb2.Vm) -> dict[str, Any]:
    return {
        "id": v.id,
        "cluster": v.cluster,
        "pool": v.pool,
        "zone": v.zone,
        "state": enum_short(types_pb2.VmState, v.state),
        "reason": v.reason,
        "images": list(v.images),
        "cache_bytes": v.cache_bytes,
        "session_id": v.session_id,
        "healthy": v.healthy,
        "health_detail": v.health_detail,
        "spot": v.spot,
        "create_time": ts(v, "create_time"),
        "history": history_to_json(v.history),
    }


def override_to_json(o) -> dict[str, Any]:
    """What operators set for a user: only the limits set, and when."""
    out: dict[str, Any] = {}
    for field in ("gpu_hours_per_week", "max_active_sessions", "max_active_batch_sessions"):
        if o.HasField(field):
            out[field] = getattr(o, field)
    if o.HasField("update_time"):
        out["update_time"] = ts(o, "update_time")
    return out


def user_quota_to_json(override, q: types_pb2.Quota) -> dict[str, Any]:
    return {"user": q.user_id, "override": override_to_json(override), "quota": quota_to_json(q)}


# --- text ----------------------------------------------------------------------------------


def summarize(items: Sequence[str], wide: bool, keep: int = 3) -> str:
    """All items with `wide`, else the first `keep` and how many more (a VM holds ~40 versions)."""
    if wide or len(items) <= keep + 1:
        return ", ".join(items)
    return f"{', '.join(items[:keep])} and {len(items) - keep} more (--wide lists all)"


def _version_key(image: str) -> tuple:
    """gpu:v99 before gpu:v100."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", image))


def image_span(images: Sequence[str], wide: bool) -> str:
    """A VM's images in a table cell: all with `wide`, else "38: gpu:v121..gpu:v160"."""
    ordered = sorted(images, key=_version_key)
    if wide or len(ordered) <= 2:
        return ",".join(ordered) or "-"
    return f"{len(ordered)}: {ordered[0]}..{ordered[-1]}"


def cluster_table(clusters: Iterable[types_pb2.Cluster]) -> str:
    rows = [
        (c.name, c.region, c.address, _yes(c.healthy), _yes(c.draining), len(c.pools))
        for c in clusters
    ]
    return table(rows, ("NAME", "REGION", "ADDRESS", "HEALTHY", "DRAINING", "POOLS"))


def cluster_detail(c: types_pb2.Cluster) -> str:
    return kv([
        ("cluster", c.name),
        ("region", c.region),
        ("address", c.address),
        ("healthy", _yes(c.healthy)),
        ("draining", _yes(c.draining)),
        ("pools", ", ".join(p.name for p in c.pools)),
    ])


def _policy_value(p: types_pb2.PoolPolicy, field: str) -> str:
    return "" if not p.HasField(field) else str(getattr(p, field))


def pool_table(pools: Iterable[types_pb2.Pool]) -> str:
    rows = []
    for p in pools:
        c, pol = p.capacity, p.policy
        rows.append((
            p.cluster, p.name, p.accelerator, c.warm, c.booting, c.assigned, c.queued,
            _policy_value(pol, "min_vms") or c.min_vms, _policy_value(pol, "max_vms") or c.max_vms,
            _policy_value(pol, "autoscaler") or "-", _policy_value(pol, "headroom_fraction") or "-",
        ))
    return table(rows, ("CLUSTER", "POOL", "ACCELERATOR", "WARM", "BOOTING", "ASSIGNED", "QUEUED",
                        "MIN", "MAX", "AUTOSCALER", "HEADROOM"))


def pool_detail(p: types_pb2.Pool, wide: bool = False) -> str:
    pol, c = p.policy, p.capacity
    recycle = "" if not pol.HasField("recycle") else _yes(pol.recycle)
    newest_first = sorted(c.warm_by_image, key=lambda i: _version_key(i.image), reverse=True)
    by_count = sorted(newest_first, key=lambda i: -i.count)
    warm_images = summarize([f"{i.image}={i.count}" for i in by_count], wide)
    return kv([
        ("cluster", p.cluster),
        ("pool", p.name),
        ("accelerator", p.accelerator),
        ("machine type", p.machine_type),
        ("zones", ", ".join(p.zones)),
        ("min vms", _policy_value(pol, "min_vms")),
        ("max vms", _policy_value(pol, "max_vms")),
        ("headroom", _policy_value(pol, "headroom_fraction")),
        ("autoscaler", _policy_value(pol, "autoscaler")),
        ("recycle", recycle),
        ("warm", c.warm if p.HasField("capacity") else ""),
        ("warm by image", warm_images),
        ("booting", c.booting if p.HasField("capacity") else ""),
        ("assigned", c.assigned if p.HasField("capacity") else ""),
        ("queued", c.queued if p.HasField("capacity") else ""),
        ("stocked-out zones", ", ".join(c.stocked_out_zones)),
    ])


def vm_table(vms: Iterable[types_pb2.Vm], now: float, wide: bool = False) -> str:
    rows = [
        (
            v.id, v.cluster, v.pool, v.zone, enum_short(types_pb2.VmState, v.state) or "-",
            v.session_id or "-", image_span(v.images, wide),
            _yes(v.healthy), age(epoch(v, "create_time"), server_now(v, now)) or "-",
        )
        for v in vms
    ]
    return table(rows, ("ID", "CLUSTER", "POOL", "ZONE", "STATE", "SESSION", "IMAGES", "HEALTHY",
                        "AGE"))


def vm_detail(v: types_pb2.Vm, wide: bool = False) -> str:
    return kv([
        ("id", v.id),
        ("cluster", v.cluster),
        ("pool", v.pool),
        ("zone", v.zone),
        ("spot", _yes(v.spot) if v.spot else ""),  # said only of Spot VMs: most are on demand
        ("state", enum_short(types_pb2.VmState, v.state)),
        ("reason", v.reason),
        ("session", v.session_id),
        ("images", ", ".join(sorted(v.images, key=_version_key)) if wide or len(v.images) <= 4
         else f"{image_span(v.images, False).replace(':', ' versions,', 1)} (--wide lists all)"),
        ("cache", format_bytes(v.cache_bytes) if v.cache_bytes else ""),
        ("healthy", _yes(v.healthy)),
        ("health detail", v.health_detail),
        ("created", ts(v, "create_time")),
    ])


def user_quota_detail(override, q: types_pb2.Quota, now: float) -> str:
    set_ = override_to_json(override)
    names = {"gpu_hours_per_week": "gpu hours", "max_active_sessions": "interactive",
             "max_active_batch_sessions": "batch"}
    said = ", ".join(f"{names[k]} {v:g}" for k, v in set_.items() if k in names)
    user, *rest = quota_pairs(q, now)
    return kv([user, ("set by operators", f"{said} (at {set_['update_time']})" if said else "nothing: the fleet config's"),
               *rest])


def audit_record_to_json(r) -> dict[str, Any]:
    return {"time": ts(r, "time"), "identity": r.identity, "roles": list(r.roles), "rpc": r.rpc,
            "target": r.target, "outcome": r.outcome, "detail": r.detail, "peer": r.peer}


def audit_table(records: Iterable, wide: bool = False) -> str:
    """`wide` adds the caller's address."""
    rows = [
        (
            ts(r, "time") or "-", r.identity or "-", ",".join(r.roles) or "-",
            r.rpc.removeprefix("/provisioner.v1.") or "-", r.target or "-", r.outcome or "-",
            *((r.peer or "-",) if wide else ()), r.detail,
        )
        for r in records
    ]
    return table(rows, ("TIME", "IDENTITY", "ROLES", "RPC", "TARGET", "OUTCOME", *(("PEER",) if wide else ()), "DETAIL"))


def user_block_to_json(b) -> dict[str, Any]:
    """A block; its evidence (JSON text) parsed; when and by whom it was lifted, if it was."""
    out = {"user": b.user_id, "block_time": ts(b, "block_time"), "blocked_by": b.blocked_by, "reason": b.reason,
           "evidence": json.loads(b.evidence) if b.evidence else None}
    if b.HasField("lift_time"):
        out |= {"lift_time": ts(b, "lift_time"), "lifted_by": b.lifted_by}
    return out


def abuse_decision_to_json(d) -> dict[str, Any]:
    return {"session": d.session_id, "decision_time": ts(d, "decision_time"), "rules": list(d.rules),
            "reason": d.reason, "dry_run": d.dry_run, "evidence": json.loads(d.evidence) if d.evidence else None}


def user_block_state_to_json(user: str, block, decisions, past=()) -> dict[str, Any]:
    """What `admin user show` prints with --json: the block (None if not blocked), the decisions
    and the blocks lifted."""
    return {"user": user, "block": user_block_to_json(block) if block is not None else None,
            "decisions": [abuse_decision_to_json(d) for d in decisions],
            "past_blocks": [user_block_to_json(b) for b in past]}


def user_block_detail(user: str, block, decisions, past=()) -> str:
    if block is None:
        head = kv([("user", user), ("blocked", "no")])
    else:
        head = kv([("user", user), ("blocked", f"since {ts(block, 'block_time')}"), ("by", block.blocked_by),
                   ("reason", block.reason)])
    if past:
        rows = [(ts(b, "block_time") or "-", ts(b, "lift_time") or "-", b.blocked_by, b.lifted_by, b.reason)
                for b in past]
        head += "\n\nblocks lifted, newest first:\n" + table(rows, ("SINCE", "LIFTED", "BY", "LIFTED BY", "REASON"))
    if not decisions:
        return head + ("\n\n" if past else "\n") + "abuse detection: nothing flagged"
    rows = [(ts(d, "decision_time") or "-", d.session_id, ",".join(d.rules),
             "recorded (dry run)" if d.dry_run else "blocked", d.reason) for d in decisions]
    return head + "\n\nabuse detection, newest first:\n" + table(rows, ("TIME", "SESSION", "RULES", "ACTION", "REASON"))


def blocked_users_table(blocks: Iterable) -> str:
    rows = [(b.user_id, ts(b, "block_time") or "-", b.blocked_by, b.reason) for b in blocks]
    return table(rows, ("USER", "SINCE", "BY", "REASON"))


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
