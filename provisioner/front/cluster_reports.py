"""What a cluster reports is checked before the front acts on it or passes it on.

A cluster's certificate proves which cluster speaks, not that what it says is true: with a leaked
certificate, or a compromised cluster, a fake one could block users of other clusters (an abuse
flag citing someone else's session), draw creates with warm VMs it does not have, send a notebook
backend to an address of its choosing, or write lines into the front's log and operators'
terminals. So each report must be of the fleet's own form, about the reporting cluster's own
sessions and pools, within the pool's configured bounds, and printable. What fails is not acted
on: a flag is dropped, a capacity push ends the stream (the cluster is unroutable until a good
one), a session is not passed on (the caller gets INTERNAL); each is logged.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
from typing import Mapping
from urllib.parse import urlsplit

from provisioner.model.abuse_record import MAX_EVIDENCE_CHARS, MAX_REASON_CHARS, Decision
from provisioner.api.limits import NAME, QUOTA_METRIC, SESSION_ID, USER_ID
from provisioner.model.images import parse_ref
from provisioner.decide.zone_memory import QUOTA_MEMORY_S
from provisioner.model.errors import InvalidArgument, ProvisionerError
from provisioner.model.records import cluster_of
from provisioner.common.safe_text import is_printable
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

RULES = frozenset({"miner_program", "pool_connection", "busy_without_activity", "unknown_gpu_program"})
MAX_TEXT_CHARS = 4096  # a session's reason, a notice: what the core writes is far shorter
MAX_COLD_START_S = 86_400.0
# sim://<cluster>/<vm id>, the simulated cloud's form; VM ids are GCE instance names.
_SIM_ENDPOINT = re.compile(r"sim://([a-z0-9-]{1,63})/[a-z][a-z0-9-]{0,62}")


class ReportRefused(ProvisionerError):
    """A cluster answered with what the front will not pass on: a fault at the cluster, which
    retrying does not mend."""

    grpc_code = "INTERNAL"
    reason = "CLUSTER_REPORT_REFUSED"


def checked(cluster: str, s: pb.Session) -> pb.Session:
    """`s`, if `cluster` may have sent it; else ReportRefused, logged."""
    if problem := session_problem(cluster, s):
        log.warning("cluster %s answered with %s (session %s): not passed on", cluster, problem, s.id,
                    extra={"cluster": cluster})
        raise ReportRefused(f"cluster {cluster} answered with {problem}; the front did not pass it on")
    return s


def _valid(rule, value: str) -> bool:
    try:
        rule.check(value, "")
        return True
    except InvalidArgument:
        return False


def _text_problem(name: str, value: str, limit: int = MAX_TEXT_CHARS) -> str | None:
    if len(value) > limit:
        return f"{name} longer than {limit} characters"
    if not is_printable(value):
        return f"{name} holds characters that are not printable"
    return None


def endpoint_problem(cluster: str, endpoint: str) -> str | None:
    """An endpoint is the fleet's: `http://<IP address>:<port>` (a VM's internal address, never a
    name someone else resolves), or the simulated cloud's `sim://<this cluster>/<vm>`."""
    if not endpoint:
        return None
    if m := _SIM_ENDPOINT.fullmatch(endpoint):
        return None if m.group(1) == cluster else "a simulated endpoint of another cluster"
    try:
        url = urlsplit(endpoint)
        port = url.port
        ipaddress.ip_address(url.hostname or "")
    except ValueError:
        return "an endpoint that is not http://<IP address>:<port>"
    if url.scheme != "http" or port is None or url.username or url.password or url.path not in ("", "/") \
            or url.query or url.fragment:
        return "an endpoint that is not http://<IP address>:<port>"
    return None


def session_problem(cluster: str, s: pb.Session) -> str | None:
    """Why `cluster` may not have sent `s`, or None."""
    if not _valid(SESSION_ID, s.id) or cluster_of(s.id) != cluster or s.cluster not in ("", cluster):
        return "a session that is not the cluster's own"
    if s.spec.user_id and not _valid(USER_ID, s.spec.user_id):
        return "a session whose user id is not of the fleet's form"
    texts = [("reason", s.reason), *(("history reason", h.reason) for h in s.history),
             *(("notice", n.message) for n in s.notices), ("pool", s.pool), ("vm id", s.vm_id),
             ("image", s.image), ("requeued as", s.requeued_as), ("requeued from", s.requeued_from)]
    for name, value in texts:
        if problem := _text_problem(name, value):
            return problem
    return endpoint_problem(cluster, s.endpoint)


def flag_problem(cluster: str, d: Decision, known_owner: str | None) -> str | None:
    """Why an abuse flag from `cluster` is not to be acted on, or None. `known_owner`: the user the
    fronts made that session for (None: no front made it)."""
    if not _valid(SESSION_ID, d.session_id) or cluster_of(d.session_id) != cluster:
        return "a flag for a session that is not the cluster's own"
    if not _valid(USER_ID, d.user_id):
        return "a flag whose user id is not of the fleet's form"
    if known_owner is not None and known_owner != d.user_id:
        return "a flag naming another user than the session's"
    if not d.rules or not set(d.rules) <= RULES:
        return "a flag without known rules"
    if not math.isfinite(d.at):
        return "a flag without a time"
    return _text_problem("reason", d.reason, MAX_REASON_CHARS) or \
        _text_problem("evidence", d.evidence, MAX_EVIDENCE_CHARS)


def capacity_problem(cluster: str, cap: pb.ClusterCapacity, ceilings: Mapping[str, int]) -> str | None:
    """Why a capacity push from `cluster` is not to be taken, or None: every pool one of its
    configured pools, every count within the pool's configured ceiling (`ceilings`: pool ->
    the most VMs its config lets it hold), every image a reference.
    (An image the front does not know is no harm: creates ask only for images the front knows.)"""
    if cap.cluster and cap.cluster != cluster:
        return "capacity of another cluster"
    if cap.HasField("project_quota") and (problem := _quota_problem(cap)):
        return problem
    for p in cap.pools:
        ceiling = ceilings.get(p.pool)
        if ceiling is None:
            return "capacity of a pool the cluster does not have"
        if any(n < 0 or n > ceiling for n in (p.warm, p.booting, p.assigned, p.min_vms, p.max_vms)):
            return f"pool {p.pool}: more VMs than its configured ceiling ({ceiling})"
        if p.queued < 0 or p.unhealthy < 0 or not (0 <= p.cold_start_s <= MAX_COLD_START_S):
            return f"pool {p.pool}: a count or a start time out of bounds"
        if any(parse_ref(ic.image) is None or not 0 <= ic.count <= p.warm for ic in p.warm_by_image):
            return f"pool {p.pool}: warm VMs of images that are no references, or more than it has warm"
    return None


def _quota_problem(cap: pb.ClusterCapacity) -> str | None:
    """A project quota is of the fleet's form and ends within the quota memory of the report."""
    q = cap.project_quota
    if not _valid(QUOTA_METRIC, q.metric) or not _valid(NAME, q.cluster):
        return "a project quota whose metric or cluster is not of the fleet's form"
    if q.until.ToNanoseconds() > cap.time.ToNanoseconds() + int((QUOTA_MEMORY_S + 1.0) * 1e9):
        return "a project quota that ends further ahead than any cluster holds one"
    return None
