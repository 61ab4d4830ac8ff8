"""Domain objects to and from their protos. The only place that knows both shapes."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from provisioner.model.abuse_record import Decision
from provisioner.store.audit_log import AuditRecord
from provisioner.model.errors import InvalidArgument
from provisioner.model.records import Session, SessionKind, SessionSpec, StartKind, Vm
from provisioner.model.states import SessionState, StateChange, VmState
from provisioner.decide.zone_memory import ProjectQuota
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

_KIND_TO_PB = {SessionKind.INTERACTIVE: pb.SESSION_KIND_INTERACTIVE, SessionKind.BATCH: pb.SESSION_KIND_BATCH}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}
_START_TO_PB = {StartKind.WARM: pb.START_KIND_WARM, StartKind.PARTIAL: pb.START_KIND_PARTIAL,
                StartKind.COLD: pb.START_KIND_COLD}


def _to_pb(pb_enum, prefix: str, member) -> int:
    return pb_enum.Value(f"{prefix}{member.name}") if member else 0


def _from_pb(pb_enum, prefix: str, domain, value: int, what: str):
    try:
        return domain[pb_enum.Name(value).removeprefix(prefix)]
    except (KeyError, ValueError):  # UNSPECIFIED, or a number this version does not know
        raise InvalidArgument(f"unknown {what} state {value}", field="states") from None


def session_state_to_pb(state: SessionState | None) -> int:
    return _to_pb(pb.SessionState, "SESSION_STATE_", state)


def session_state_from_pb(value: int) -> SessionState:
    return _from_pb(pb.SessionState, "SESSION_STATE_", SessionState, value, "session")


def vm_state_to_pb(state: VmState | None) -> int:
    return _to_pb(pb.VmState, "VM_STATE_", state)


def vm_state_from_pb(value: int) -> VmState:
    return _from_pb(pb.VmState, "VM_STATE_", VmState, value, "VM")


def timestamp(seconds: float) -> Timestamp | None:
    if not seconds:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def spec_from_pb(spec: pb.SessionSpec) -> SessionSpec:
    """Checks what the proto types cannot; the cluster checks the rest against its config."""
    if spec.kind not in (pb.SESSION_KIND_UNSPECIFIED, *_KIND_FROM_PB):
        raise InvalidArgument(f"unknown session kind {spec.kind}", field="spec.kind")
    if spec.HasField("max_runtime") and (spec.max_runtime.seconds < 0 or spec.max_runtime.nanos < 0):
        raise InvalidArgument("max_runtime must not be negative", field="spec.max_runtime")
    if not spec.image.strip():
        raise InvalidArgument("image must not be empty (e.g. gpu:v154 or gpu:latest)", field="spec.image")
    return SessionSpec(
        request_id=spec.request_id,
        user_id=spec.user_id,
        accelerator=spec.accelerator,
        image=spec.image,
        kind=_KIND_FROM_PB.get(spec.kind, SessionKind.INTERACTIVE),
        notebook_id=spec.notebook_id,
        region_hint=spec.region_hint,
        region_required=spec.region_required,
        max_runtime_s=spec.max_runtime.ToNanoseconds() / 1e9 if spec.HasField("max_runtime") else 0.0,
        priority_class=spec.priority_class,
        requeue=spec.requeue_on_preemption,
    )


def spec_to_pb(spec: SessionSpec) -> pb.SessionSpec:
    out = pb.SessionSpec(
        request_id=spec.request_id, user_id=spec.user_id, notebook_id=spec.notebook_id,
        kind=_KIND_TO_PB[spec.kind], accelerator=spec.accelerator, image=spec.image,
        region_hint=spec.region_hint, region_required=spec.region_required,
        priority_class=spec.priority_class, requeue_on_preemption=spec.requeue,
    )
    if spec.max_runtime_s:
        out.max_runtime.CopyFrom(duration(spec.max_runtime_s))
    return out


def _history(history: list[StateChange]) -> list[pb.StateChange]:
    return [pb.StateChange(state=h.state, reason=h.reason, time=timestamp(h.time)) for h in history]


def session_to_pb(s: Session, now: float, brief: bool = False) -> pb.Session:
    """`brief`: without the history and the notices."""
    out = pb.Session(
        id=s.id, spec=spec_to_pb(s.spec), state=session_state_to_pb(s.state), reason=s.reason,
        cluster=s.cluster, pool=s.pool, vm_id=s.vm_id, endpoint=s.endpoint, image=s.image,
        start=_START_TO_PB.get(s.start, pb.START_KIND_UNSPECIFIED), queue_position=s.queue_position,
        estimated_ready_time=timestamp(s.estimated_ready_at), create_time=timestamp(s.created_at),
        ready_time=timestamp(s.ready_at), end_time=timestamp(s.ended_at),
        last_activity_time=timestamp(s.last_activity_at), idle_timeout=duration(s.idle_timeout_s),
        max_runtime=duration(s.max_runtime_s), history=() if brief else _history(s.history), revision=s.revision,
        read_time=timestamp(now),
        priority_class=s.priority_class, requeued_as=s.requeued_as, requeued_from=s.requeued_from,
        image_digest=s.image_digest,
    )  # never the access token: only Get adds it, when asked (cluster/service.py)
    if s.preempt_at:
        out.preemption_time.CopyFrom(timestamp(s.preempt_at))
    if s.pull_bytes_total:
        out.pull.CopyFrom(pb.PullProgress(bytes_total=s.pull_bytes_total, bytes_done=s.pull_bytes_done))
    if s.budget_ends_at:
        out.budget_end_time.CopyFrom(timestamp(s.budget_ends_at))
    if s.notices and not brief:
        out.notices.extend(pb.Notice(kind=n.kind, message=n.message, time=timestamp(n.time),
                                     action_time=timestamp(n.action_time)) for n in s.notices)
    return out


def vm_to_pb(vm: Vm, images: list[str], now: float) -> pb.Vm:
    return pb.Vm(
        id=vm.id, cluster=vm.cluster, pool=vm.pool, zone=vm.zone, state=vm_state_to_pb(vm.state),
        reason=vm.reason, images=images, cache_bytes=vm.cache.used_bytes, session_id=vm.session_id,
        healthy=vm.healthy, health_detail=vm.health_detail, create_time=timestamp(vm.created_at),
        history=_history(vm.history), read_time=timestamp(now), spot=vm.spot,
    )


def abuse_flag_to_pb(d: Decision) -> cluster_pb.AbuseFlag:
    return cluster_pb.AbuseFlag(session_id=d.session_id, user_id=d.user_id, flag_time=timestamp(d.at),
                                rules=d.rules, reason=d.reason, evidence=d.evidence, dry_run=d.dry_run)


def abuse_flag_from_pb(f: cluster_pb.AbuseFlag) -> Decision:
    return Decision(f.session_id, f.user_id, f.flag_time.ToNanoseconds() / 1e9, tuple(f.rules), f.reason,
                    f.evidence, f.dry_run)


def project_quota_to_pb(q: ProjectQuota) -> pb.ProjectQuota:
    return pb.ProjectQuota(until=timestamp(q.until), metric=q.metric, cluster=q.cluster)


def project_quota_from_pb(q: pb.ProjectQuota) -> ProjectQuota:
    return ProjectQuota(q.until.ToNanoseconds() / 1e9, q.metric, q.cluster)


def audit_record_to_pb(r: AuditRecord) -> admin_pb.AuditRecord:
    return admin_pb.AuditRecord(time=timestamp(r.time), identity=r.identity, roles=list(r.roles), rpc=r.rpc,
                                target=r.target, outcome=r.outcome, detail=r.detail, peer=r.peer)
