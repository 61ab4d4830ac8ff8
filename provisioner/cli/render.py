"""Turns API messages into JSON-ready dicts and aligned text tables: the shared helpers (enums,
durations, timestamps, tables), sessions and quotas, and the simulator's report. The admin
commands' clusters, pools, VMs, audit records and blocks are in `render_admin`.

Pure functions: anything time-relative takes `now` (epoch seconds) from the caller.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.message import Message

from provisioner.common.safe_text import printable
from provisioner.v1 import types_pb2

# --- enums ---------------------------------------------------------------------------------


def _prefix(enum) -> str:
    # Every enum's zero value is <PREFIX>UNSPECIFIED, so the prefix is found, not hard-coded.
    return enum.Name(0).removesuffix("UNSPECIFIED")


def enum_short(enum, value: int) -> str:
    """SESSION_STATE_PULLING_IMAGE -> "pulling_image"; unspecified -> ""; unknown -> the number."""
    if value == 0:
        return ""
    try:
        name = enum.Name(value)
    except ValueError:  # a newer server's value
        return str(value)
    return name.removeprefix(_prefix(enum)).lower()


def enum_value(enum, text: str) -> int:
    """The inverse of enum_short; also takes the full upper-case name."""
    name = text.strip().upper().replace("-", "_")
    for candidate in (_prefix(enum) + name, name):
        try:
            value = enum.Value(candidate)
        except ValueError:
            continue
        if value != 0:
            return value
    choices = ", ".join(enum_choices(enum))
    raise ValueError(f"unknown value {text!r}; expected one of: {choices}")


def enum_choices(enum) -> list[str]:
    return [enum_short(enum, v) for v in enum.values() if v != 0]


# --- durations and sizes -------------------------------------------------------------------

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION_PART = re.compile(rf"({_NUMBER})([dhms])")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """Seconds in "2h", "90m", "3600s", "3600" (bare seconds), "1h30m" or "1.5h"."""
    s = text.strip().lower()
    if re.fullmatch(_NUMBER, s):
        return float(s)
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if not s or pos != len(s):
        raise ValueError(f"invalid duration {text!r}; use e.g. 2h, 90m, 3600s or 3600")
    return total


def format_duration(seconds: float) -> str:
    """Two most significant units: 45s, 1m30s, 2h5m, 3d4h. Negative is shown as 0s."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (s, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    major, minor = parts[0], parts[1] if len(parts) > 1 else (0, "")
    out = f"{major[0]}{major[1]}"
    return out + f"{minor[0]}{minor[1]}" if minor[0] else out


def format_bytes(n: int) -> str:
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# --- timestamps ----------------------------------------------------------------------------


def ts(msg: Message, field: str) -> str | None:
    """A Timestamp as RFC 3339 text; None when unset."""
    return getattr(msg, field).ToJsonString() if msg.HasField(field) else None


def _seconds(msg: Message, field: str) -> float | None:
    """A Duration in seconds, or a Timestamp in epoch seconds; None when unset."""
    return getattr(msg, field).ToNanoseconds() / 1e9 if msg.HasField(field) else None


epoch = _seconds


# --- messages -> dicts ---------------------------------------------------------------------


def history_to_json(history: Iterable[types_pb2.StateChange]) -> list[dict]:
    return [{"state": h.state, "reason": h.reason, "time": ts(h, "time")} for h in history]


def session_to_json(s: types_pb2.Session) -> dict[str, Any]:
    pull = None
    if s.HasField("pull"):
        pull = {"bytes_total": s.pull.bytes_total, "bytes_done": s.pull.bytes_done}
    return {
        "id": s.id,
        "state": enum_short(types_pb2.SessionState, s.state),
        "reason": s.reason,
        "cluster": s.cluster,
        "pool": s.pool,
        "vm_id": s.vm_id,
        "endpoint": s.endpoint,
        "image": s.image,
        "image_digest": s.image_digest,
        "image_requested": s.spec.image,
        "start": enum_short(types_pb2.StartKind, s.start),
        "user": s.spec.user_id,
        "notebook": s.spec.notebook_id,
        "kind": enum_short(types_pb2.SessionKind, s.spec.kind),
        "accelerator": s.spec.accelerator,
        "queue_position": s.queue_position,
        "estimated_ready_time": ts(s, "estimated_ready_time"),
        "create_time": ts(s, "create_time"),
        "ready_time": ts(s, "ready_time"),
        "end_time": ts(s, "end_time"),
        "last_activity_time": ts(s, "last_activity_time"),
        "idle_timeout_s": _seconds(s, "idle_timeout"),
        "max_runtime_s": _seconds(s, "max_runtime"),
        "request_id": s.spec.request_id,
        "revision": s.revision,
        "pull": pull,
        "history": history_to_json(s.history),
        "budget_end_time": ts(s, "budget_end_time"),
        "priority_class": s.priority_class,
        "preemption_time": ts(s, "preemption_time"),
        "requeued_as": s.requeued_as,
        "requeued_from": s.requeued_from,
        "notices": [{"kind": n.kind, "message": n.message, "time": ts(n, "time"),
                     "action_time": ts(n, "action_time")} for n in s.notices],
        # The serving cluster's clock when it answered: the times above are on that clock, which is
        # the fleet's model time (ahead of the wall under --time-scale), not necessarily the wall's.
        "read_time": ts(s, "read_time"),
        # Only `session get` has it (GetSession, for the owner and service or admin callers).
        **({"access_token": s.access_token} if s.access_token else {}),
    }


def quota_to_json(q: types_pb2.Quota) -> dict[str, Any]:
    return {
        "user": q.user_id,
        "gpu_hours_limit": q.gpu_hours_limit,
        "gpu_hours_used": q.gpu_hours_used,
        "gpu_hours_left": q.gpu_hours_left,
        "reset_time": ts(q, "reset_time"),
        "max_active_sessions": q.max_active_sessions,
        "active_sessions": q.active_sessions,
        "max_active_batch_sessions": q.max_active_batch_sessions,
        "active_batch_sessions": q.active_batch_sessions,
        "exhaustion_time": ts(q, "exhaustion_time"),
    }


# --- text ----------------------------------------------------------------------------------


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> str:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    cells = [[str(h) for h in headers]] + [["" if c is None else printable(str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells
    )


def kv(pairs: Iterable[tuple[str, Any]]) -> str:
    """`key: value` lines with values aligned; empty values are left out."""
    kept = [(k, printable(str(v))) for k, v in pairs if v not in (None, "")]
    width = max((len(k) for k, _ in kept), default=0) + 1
    return "\n".join(f"{(k + ':').ljust(width)} {v}" for k, v in kept)


_PENDING = {
    types_pb2.SESSION_STATE_QUEUED,
    types_pb2.SESSION_STATE_PROVISIONING,
    types_pb2.SESSION_STATE_PULLING_IMAGE,
    types_pb2.SESSION_STATE_STARTING,
}


def server_now(msg, now: float) -> float:
    """The serving cluster's clock if the message carries it: a simulated cluster's clock may run
    faster than the wall, and its timestamps are only comparable with each other."""
    return epoch(msg, "read_time") or now


CLOCK_SKEW_S = 60.0  # a server clock this far from the wall is a model clock (--time-scale)


def clock_note(messages: Iterable, now: float) -> str | None:
    """Says so when the servers' clock runs ahead of (or behind) the wall, as a simulated fleet's
    does: their times are model times then, not wall-clock times."""
    skews = [epoch(m, "read_time") - now for m in messages if m.HasField("read_time")]
    if not skews or abs(skew := max(skews, key=abs)) < CLOCK_SKEW_S:
        return None
    side = "ahead of" if skew > 0 else "behind"
    return f"times are the fleet's model time, {format_duration(abs(skew))} {side} the wall clock (--time-scale)"


def age(then: float | None, now: float) -> str:
    return "" if then is None else format_duration(now - then)


def session_age(s: types_pb2.Session, now: float) -> str:
    """AGE: the time since the session was created (on the fleet's clock)."""
    return age(epoch(s, "create_time"), server_now(s, now))


def session_ready_in(s: types_pb2.Session, now: float) -> str:
    """READY-IN: the estimated wait while it waits with an estimate, else nothing."""
    eta = epoch(s, "estimated_ready_time")
    if s.state in _PENDING and eta is not None:
        return format_duration(eta - server_now(s, now))
    return ""


def pull_percent(s: types_pb2.Session) -> int | None:
    if not s.HasField("pull") or s.pull.bytes_total <= 0:
        return None
    return min(100, int(100 * s.pull.bytes_done / s.pull.bytes_total))


SESSION_HEADERS = ("ID", "STATE", "CLUSTER", "IMAGE", "START", "AGE", "READY-IN", "REASON")


def session_table(sessions: Iterable[types_pb2.Session], now: float) -> str:
    rows = [
        (
            s.id,
            enum_short(types_pb2.SessionState, s.state) or "-",
            s.cluster or "-",
            s.image or s.spec.image or "-",
            enum_short(types_pb2.StartKind, s.start) or "-",
            session_age(s, now) or "-",
            session_ready_in(s, now) or "-",
            s.reason,
        )
        for s in sessions
    ]
    return table(rows, SESSION_HEADERS)


_START_MEANING = {
    types_pb2.START_KIND_WARM: "a warm VM held the image",
    types_pb2.START_KIND_PARTIAL: "a warm VM had part of the image and pulled the rest",
    types_pb2.START_KIND_COLD: "a new VM",
}


def session_detail(s: types_pb2.Session, now: float) -> str:
    clock = clock_note([s], now)
    now = server_now(s, now)
    image = s.image or s.spec.image
    if s.image and s.spec.image and s.image != s.spec.image:
        image = f"{s.image} (asked for {s.spec.image})"
    pct = pull_percent(s)
    # A partial start pulls only the layers its VM lacked: a finished pull says how much that was,
    # not "100%", which read as the whole image beside "start: partial".
    pull = ("" if pct is None else f"{format_bytes(s.pull.bytes_total)} pulled (the layers the VM lacked)"
            if pct == 100 else f"{pct}% of {format_bytes(s.pull.bytes_total)} (the layers the VM lacked)")
    start = enum_short(types_pb2.StartKind, s.start)
    if s.start in _START_MEANING:
        start = f"{start} ({_START_MEANING[s.start]})"
    eta = epoch(s, "estimated_ready_time")
    ready_in = format_duration(eta - now) if eta is not None and s.state in _PENDING else ""

    def when(field: str) -> str | None:
        t = epoch(s, field)
        return None if t is None else f"{ts(s, field)} ({format_duration(now - t)} ago)"

    def ahead(field: str) -> str | None:
        t = epoch(s, field)
        return None if t is None else f"{ts(s, field)} (in {format_duration(max(0.0, t - now))})"

    return kv([
        ("id", s.id),
        ("state", enum_short(types_pb2.SessionState, s.state)),
        ("reason", s.reason),
        ("user", s.spec.user_id),
        ("kind", enum_short(types_pb2.SessionKind, s.spec.kind)),
        ("notebook", s.spec.notebook_id),
        ("cluster", s.cluster),
        ("pool", s.pool),
        ("vm", s.vm_id),
        ("image", image),
        ("image digest", s.image_digest),
        ("secret", "set (shown by --json as access_token)" if s.access_token else ""),
        ("start", start),
        ("endpoint", s.endpoint),
        ("queue position", s.queue_position or ""),
        ("pull", pull),
        ("ready in", ready_in),
        ("created", when("create_time")),
        ("ready", when("ready_time")),
        ("ended", when("end_time")),
        ("budget ends", ahead("budget_end_time")),
        ("class", s.priority_class),
        ("preempted", ahead("preemption_time")),
        ("requeued as", s.requeued_as),
        ("requeued from", s.requeued_from),
        ("notice", s.notices[-1].message if s.notices else ""),
        ("request id", s.spec.request_id),
        ("revision", s.revision),
        ("clock", clock),
    ])


def progress_line(s: types_pb2.Session, now: float) -> str:
    """One line per watched change: state, queue position, pull percent, time to ready."""
    model_clock = clock_note([s], now) is not None
    now = server_now(s, now)
    parts = [s.id, enum_short(types_pb2.SessionState, s.state) or "unknown"]
    if s.queue_position:
        parts.append(f"queue #{s.queue_position}")
    pct = pull_percent(s)
    if pct is not None and s.state == types_pb2.SESSION_STATE_PULLING_IMAGE:
        parts.append(f"pull {pct}% of {format_bytes(s.pull.bytes_total)}")
    eta = epoch(s, "estimated_ready_time")
    if s.state in _PENDING and eta is not None:
        # Whose time: under --time-scale the estimate is in the fleet's model time, not the wall's.
        parts.append(f"ready in ~{format_duration(eta - now)}" + (" (model time)" if model_clock else ""))
    if s.state == types_pb2.SESSION_STATE_RUNNING:
        start = enum_short(types_pb2.StartKind, s.start)
        if start:
            parts.append(f"({start} start)")
        if s.endpoint:
            parts.append(s.endpoint)
    line = " ".join(parts)
    line = f"{line}: {s.reason}" if s.reason else line
    if s.notices and s.state == types_pb2.SESSION_STATE_RUNNING:  # the newest warning, until it acts
        line += f" [notice: {s.notices[-1].message}]"
    return printable(line)


def quota_detail(q: types_pb2.Quota, now: float) -> str:
    return kv(quota_pairs(q, now))


def quota_pairs(q: types_pb2.Quota, now: float) -> list[tuple[str, Any]]:
    """A quota's `key: value` lines, also under what operators set in `admin quota`."""
    pct = f" ({100 * q.gpu_hours_used / q.gpu_hours_limit:.0f}%)" if q.gpu_hours_limit else ""
    reset, runs_out = epoch(q, "reset_time"), epoch(q, "exhaustion_time")
    return [
        ("user", q.user_id),
        ("gpu hours", f"{q.gpu_hours_used:.1f} / {q.gpu_hours_limit:.1f}{pct}"),
        ("gpu hours left", f"{q.gpu_hours_left:.1f}"),
        ("runs out", None if runs_out is None
         else f"{ts(q, 'exhaustion_time')} (in {format_duration(runs_out - now)}, at the running sessions' rate)"),
        ("active sessions", f"{q.active_sessions} / {q.max_active_sessions} interactive, "
                            f"{q.active_batch_sessions} / {q.max_active_batch_sessions} batch"),
        ("resets", None if reset is None
         else f"{ts(q, 'reset_time')} (in {format_duration(reset - now)})"),
    ]



# --- simulation ----------------------------------------------------------------------------


def simulation_report(r: dict[str, Any]) -> str:
    """The simulator's results: cost beside a fixed pool sized for the peak and the lower bound
    (VM-hours assigned to sessions, which are paid whatever the policy), then start quality. One
    ratio is given, the cost against the assigned VM time's cost (standby disks included)."""
    def row(name: str, vm_hours: float, cost: float | None) -> list[str]:
        return [name, f"{vm_hours:,.0f}", "" if cost is None else f"${cost:,.0f}"]

    rows = [row(f"{r['policy']} policy", r["vm_hours"], r["cost_usd"]),
            row(f"fixed at peak ({r['fixed_peak_vms']} VMs)", r["fixed_peak_vm_hours"], r["fixed_peak_cost_usd"])]
    if r["scale"] > 1:
        rows.append(row(f"fixed at {r['scale']} x base peak ({r['scaled_peak_vms']} VMs)", r["scaled_peak_vm_hours"],
                        None))
    rows.append(row("lower bound (assigned)", r["assigned_vm_hours"], r["assigned_cost_usd"]))
    cost = table(rows, ["", "VM-hours", "cost"])
    # Per pool: what ran for sessions, what ran idle (warm, starting, wiping), what waited stopped.
    pools = table([[k, f"{p['assigned_vm_hours']:,.0f}", f"{p['idle_vm_hours']:,.0f}", f"{p['standby_vm_hours']:,.0f}"]
                   for k, p in r["pools"].items()], ["pool", "assigned VM-h", "warm VM-h", "standby VM-h"])
    saving = 1 - r["vm_hours"] / r["fixed_peak_vm_hours"] if r["fixed_peak_vm_hours"] else 0.0
    starts = r["starts"]
    n = r["sessions"] or 1
    i = r["interactive"]
    return "\n\n".join([
        f"{r['trace']} x{r['scale']}: {r['sessions']:,} sessions over {r['model_hours'] / 24:.1f} days "
        + (f"(its first {r['days']:g}) " if r.get("days") else "") + f"(replayed in {r['wall_s']:.1f}s)",
        cost,
        pools,
        kv([("cost vs assigned", f"${r['cost_usd']:,.0f} = {r['cost_usd'] / (r['assigned_cost_usd'] or 1e-9):.3f}x "
                                 f"${r['assigned_cost_usd']:,.0f}, standby ${r['standby_cost_usd']:,.0f}"),
            ("saving vs fixed", f"{saving:.1%}"),
            ("idle VM-hours", f"{r['idle_vm_hours']:,.0f}"),
            ("image bytes", format_bytes(r["bytes_pulled"]))]),
        kv([("fast starts", f"{r['fast_start_ratio']:.2%} running within 60 s"),
            ("exact image", f"{starts['warm']:,} ({starts['warm'] / n:.2%})"),
            ("partial pull", f"{starts['partial']:,} ({starts['partial'] / n:.2%})"),
            ("cold start", f"{starts['cold']:,} ({starts['cold'] / n:.2%})"),
            ("never started", f"{r['never_started']:,} (ended before a VM was ready)"),
            *[(f"  {n:,}", why) for why, n in list(r["never_started_reasons"].items())[:5]],
            ("wait", f"p50 {r['wait_p50_s']:.0f}s  p95 {r['wait_p95_s']:.0f}s  p99 {r['wait_p99_s']:.0f}s  "
                     f"max {r['wait_max_s']:.0f}s"),
            ("interactive wait", f"p50 {i['wait_p50_s']:.0f}s  p99 {i['wait_p99_s']:.0f}s  max {i['wait_max_s']:.0f}s  "
                                 f"({i['fast_start_ratio']:.2%} within 60 s)"),
            ("preempted", f"{r['preempted']:,} ({r['requeued']:,} queued again, {r['requeued_started']:,} of "
                          "them ran)")]),
    ])
