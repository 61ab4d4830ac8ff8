"""A create's decisions at the front, without I/O: who may, under which quota, class, region,
blocks and limits, and which clusters to try.

`ask` takes the request as the fleet does (the owner's id, a pool named by its accelerator, the
spec converted and validated, its class and region checked). `CreateCheck` then decides one check
of it from what the servicer gathered (`handle(event) -> action`, as front/attempts.py is for the
placement): from the store's admission record, the answer already made for the request, a block,
the quota bound below or, when the bound cannot prove the create within quota, the week the
clusters list; then the ranked clusters. front/service.py gathers each event's inputs (store,
lists, capacity views) and carries each action out; the arithmetic is provisioner/rules/quota.py's.

The quota bound: what a check can decide from the front's store alone, without asking a cluster.

The store holds every session the fronts made for a user (a request's answer), when it was made,
and, once a check has listed it ended, by when it had ended; and the user's placements whose
outcome is not known yet (refused ones included, until settled: a late copy of an Allocate may
still make the session). From these, summed up by the store, an upper bound of the user's live
sessions and of the GPU time they used this week: a session not seen to end is assumed live and
running since it was made, on the largest GPU weight of the fleet. When the bound passes the
check, the real count would too, and the create asks no cluster. Only a user near a cap, with a
placement under way, or with many sessions not seen to end costs a check the clusters' lists;
that check then records the ends it saw, which keeps the bound close.

A cluster that does not list (unreachable, or too slow for the check) is counted by what the store
knows of it, not as nothing: the sessions the fronts made there for the user and have not seen end
count live (`unlisted`), so a partition cannot admit a user past their cap. The price is a user
refused while a session of theirs there may in fact have ended; the check logs it, and the front's
`provisioner_quota_checks_last_known_total` counts it by cluster. A session a cluster requeued
(below) is not in the store: unlisted, it goes uncounted.

A session the fronts did not make is one a cluster requeued after a preemption: it runs in place of
the preempted one, whose record is therefore not marked ended while a requeued session of the user
lives there.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.rules import quota
from provisioner.api import convert
from provisioner.config.policy import PriorityConfig, QuotaConfig
from provisioner.model.images import ImageCatalog
from provisioner.decide.zone_memory import ProjectQuota
from provisioner.model.errors import InvalidArgument, NoCapacity, ProvisionerError, QuotaExceeded, Unavailable, quote
from provisioner.front.blocks import Block, refusal as blocked
from provisioner.front.router import Candidate, ClusterView, rank, why_none
from provisioner.model.records import SessionSpec
from provisioner.front.records import Admission, Made
from provisioner.rules.validation import pool_named, priority_class, validate_spec
from provisioner.v1 import types_pb2 as pb

KIND_NAMES = {pb.SESSION_KIND_UNSPECIFIED: "interactive", pb.SESSION_KIND_INTERACTIVE: "interactive",
              pb.SESSION_KIND_BATCH: "batch"}
REQUEUED_PREFIX = "requeue-"  # the request id of a session a cluster requeued (decide/preemption.py)


# A check lists anyway once this many of the user's sessions are not seen to end (or twice as
# many as were live at the user's last listing), to see them end: otherwise a user far from every
# limit would never be listed, and the sessions not seen to end would only grow.
LIST_AFTER = 16


def list_at(live_when_listed: int) -> int:
    """How many sessions not seen to end make a check list, given how many the user's last
    listing showed live: each listing that finds most still live doubles it, so a user with many
    live sessions is listed once in a while, not on every create."""
    return max(LIST_AFTER, 2 * live_when_listed)


def why_list(a: Admission, limit_s: float, max_active: int, min_budget_s: float, max_gpus: float,
             live_when_listed: int = 0) -> str | None:
    """Why a check must list the clusters, or None if one more session passes it whatever they
    would list: every session not seen to end counted live (of the kind asked for, whatever its
    kind), and as having run since it was made on `max_gpus`."""
    if a.placing:
        return "another create of the user is under way"
    if a.refused:
        return "a refused placement of the user is not settled"
    if a.live + 1 > max_active:
        return "near the cap on active sessions"
    if a.live >= list_at(live_when_listed):
        return "many sessions not seen to end"
    if limit_s - (a.live_s + a.ended_s) * max_gpus < min_budget_s:
        return "near the weekly GPU budget"
    return None


def ends_seen(made: list[Made], listed: list, asked_after: float) -> list[tuple[str, float]]:
    """(session id, ended by) of the made sessions at one cluster that its list shows have ended.
    `listed` answered "live, or ended at or after `asked_after`", all of it: a made session not
    listed live ended before then, or when the list says. None while a requeued session lives there."""
    live = {s.id for s in listed if not s.end_time.ToNanoseconds()}
    if any(s.spec.request_id.startswith(REQUEUED_PREFIX) for s in listed if s.id in live):
        return []
    ended = {s.id: s for s in listed if s.id not in live}
    out = []
    for m in made:
        if m.session_id in live:
            continue
        s = ended.get(m.session_id)
        if s is None:
            out.append((m.session_id, asked_after))
        elif not s.requeued_as:
            out.append((m.session_id, s.end_time.ToNanoseconds() / 1e9))
    return out


def unlisted(made: list[Made], answered: set[str], placing: frozenset[str]) -> list[Made]:
    """The made sessions not seen to end at clusters that did not list (`answered` did), less
    those already counted as placements under way: the last known of them, counted live."""
    return [m for m in made if m.cluster not in answered and m.request_id not in placing]


# ---- the request, as the fleet takes it -----------------------------------------------------

@dataclass(frozen=True)
class Rules:
    """What the fleet's config says of every create, as plain values."""

    pool_accelerators: dict[str, str]  # pool name -> its accelerator type
    regions: frozenset[str]
    max_runtime_limit_s: float
    priority: PriorityConfig
    inter_region_penalty_s: float
    max_gpus: float  # the most one session meters per second (count x weight), over every pool

    @property
    def pools(self) -> frozenset[str]:
        return frozenset(self.pool_accelerators)


@dataclass(frozen=True)
class Asked:
    """A create's request as the fleet takes it."""

    spec_pb: pb.SessionSpec  # what the clusters are sent: the user, request id and pool filled in
    spec: SessionSpec
    image: str  # the image version it resolves to
    kind: str  # its kind's name, as quotas count it

    @property
    def user_id(self) -> str:
        return self.spec.user_id

    @property
    def key(self) -> str:
        return self.spec.key


def user_of(spec: pb.SessionSpec, owner: str) -> str:
    """Whose session a create asks for: a user (`owner`) creates sessions for itself only; a
    service or an operator names the user."""
    return owner or spec.user_id


def ask(spec: pb.SessionSpec, owner: str, request_id: str, rules: Rules, catalog: ImageCatalog) -> Asked:
    """The request to make, or InvalidArgument naming the field: `request_id` if it has none,
    the owner's id, the pool its accelerator names; its image, runtime, class and region checked."""
    out = pb.SessionSpec()
    out.CopyFrom(spec)
    out.request_id = out.request_id or request_id
    out.user_id = user_of(out, owner)
    out.accelerator = pool_named(out.accelerator, rules.pool_accelerators)
    model = convert.spec_from_pb(out)
    image = validate_spec(model, rules.pools, catalog, rules.max_runtime_limit_s)
    priority_class(model, rules.priority)
    if model.region_hint and model.region_hint not in rules.regions:
        raise InvalidArgument(f"unknown region {quote(model.region_hint)}; the fleet's regions: "
                              f"{', '.join(sorted(rules.regions))}", field="spec.region_hint")
    return Asked(out, model, image, KIND_NAMES[out.kind])


def refused(refusal: quota.Refusal) -> QuotaExceeded:
    return QuotaExceeded(refusal.message, field=refusal.field, reset_time=refusal.reset_time)


def check_listed(asked: Asked, q: QuotaConfig, a: Admission, live: list[quota.Row], ended: list[quota.Row],
                 last_known: int, now: float) -> quota.Refusal | None:
    """The quota check from the user's week as the clusters listed it: `live`, the sessions
    listed live, `ended`, the rows of those ended this week, and `last_known`, the sessions
    made at clusters that did not list (`unlisted`), counted live."""
    # A session already made for this very request (its answer lost) is this create's own, not
    # one more: a retry must find it, never be refused for it.
    live = [r for r in live if r.request_id != asked.spec.request_id]
    ended = [r for r in ended if r.request_id != asked.spec.request_id]
    usage = quota.user_usage([*ended, *live], now, q)
    # Not made yet, or not listed yet, or made at a cluster that did not list: one more each, of
    # this kind (the kind of a session only its cluster knows).
    placing = len(a.placing - {r.request_id for r in live}) + last_known
    usage = quota.with_placing(usage, asked.kind, placing)
    return quota.check_create(usage, asked.kind, q.max_active(asked.kind), q.min_budget_to_start_s)


# ---- one check of a create: events (what the servicer gathered) -----------------------------

@dataclass(frozen=True)
class Read:
    """What the front's store holds for the create, read under the user's lock, at `now`."""

    quotas: QuotaConfig  # the fleet's, with the user's overrides
    stored: Admission
    block: Block | None
    live_when_listed: int  # the user's live sessions at their last listing (0: not known)
    now: float


@dataclass(frozen=True)
class Listed:
    """The user's week as the clusters listed it (see ListWeek)."""

    live: list[quota.Row]
    ended: list[quota.Row]
    made: list[Made]  # the user's other sessions made and not seen to end, by the store
    answered: frozenset[str]  # the clusters that listed


@dataclass(frozen=True)
class Viewed:
    """The clusters' capacity as their last reports show it, and the project-wide GPU quota one of
    them reported exhausted (front/project_quota.py), at `now` on a clock `time_scale` times as
    fast as the wall."""

    views: list[ClusterView]
    project_quota: ProjectQuota | None = None
    now: float = 0.0
    time_scale: float = 1.0


# ---- actions (what the servicer does next) --------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """The request was already answered: that session is the answer."""

    session_id: str


@dataclass(frozen=True)
class Refuse:
    error: ProvisionerError
    last_known: tuple[Made, ...] = ()  # counted live, their cluster not listing: to log and count


@dataclass(frozen=True)
class ListWeek:
    """The store cannot prove the create within quota: list the user's week at the clusters,
    with the sessions the store knows made and not seen to end."""

    reason: str


@dataclass(frozen=True)
class Rank:
    """Within quota: look at the clusters' capacity."""

    listed: bool  # whether the clusters' lists decided it (else the store alone)
    last_known: tuple[Made, ...] = ()


@dataclass(frozen=True)
class Place:
    candidates: list[Candidate]  # best first


class CreateCheck:
    """One check of a create: Read -> (ListWeek -> Listed ->) Rank -> Viewed -> Place, or an
    Answer or a Refuse on the way. A create checks again (a new CreateCheck) when another
    replica recorded a create of the same user meanwhile."""

    def __init__(self, asked: Asked, rules: Rules):
        self.asked, self.rules = asked, rules
        self.read: Read | None = None

    def handle(self, event: Read | Listed | Viewed) -> Answer | Refuse | ListWeek | Rank | Place:
        if isinstance(event, Read):
            self.read = event
            return self._stored(event)
        if self.read is None:
            raise ValueError(f"{type(event).__name__} before the store was read")
        if isinstance(event, Listed):
            return self._listed(self.read, event)
        if isinstance(event, Viewed):
            return self._ranked(event)
        raise TypeError(f"not an event of a create's check: {event!r}")

    def _stored(self, r: Read) -> Answer | Refuse | ListWeek | Rank:
        if r.stored.answer:
            return Answer(r.stored.answer)
        if r.block is not None:  # every session is a GPU session
            return Refuse(blocked(r.block))
        q, kind = r.quotas, self.asked.kind
        why = why_list(r.stored, q.gpu_hours_per_week * 3600, q.max_active(kind), q.min_budget_to_start_s,
                       self.rules.max_gpus, r.live_when_listed)
        return Rank(listed=False) if why is None else ListWeek(why)

    def _listed(self, r: Read, week: Listed) -> Refuse | Rank:
        last_known = tuple(unlisted(week.made, set(week.answered), r.stored.placing))
        refusal = check_listed(self.asked, r.quotas, r.stored, week.live, week.ended, len(last_known), r.now)
        if refusal is not None:
            return Refuse(refused(refusal), last_known)
        return Rank(listed=True, last_known=last_known)

    def _ranked(self, v: Viewed) -> Refuse | Place:
        s, quota = self.asked.spec, v.project_quota
        candidates = rank(v.views, s.accelerator, self.asked.image, s.region_hint, s.region_required,
                          self.rules.inter_region_penalty_s, new_vms=quota is None)
        if not candidates:
            return Refuse(no_candidate(v.views, s, quota, v.now, v.time_scale))
        return Place(candidates)


def no_candidate(views: list[ClusterView], spec: SessionSpec, quota: ProjectQuota | None, now: float,
                 time_scale: float) -> ProvisionerError:
    """Why no cluster can take the session: UNAVAILABLE, or RESOURCE_EXHAUSTED while the project's
    GPU quota allows no new VM and no VM of the pool will come free to queue for."""
    if quota is None:
        return Unavailable(why_none(views, spec.accelerator, spec.region_hint, spec.region_required))
    left_s = max(0.0, quota.until - now)
    why = (f"the project's {quota.metric} quota is exhausted (an insert of cluster {quota.cluster} was refused; "
           f"no cluster inserts a GPU VM for about {left_s / 60:.0f} more minutes of fleet time)")
    why = why_none(views, spec.accelerator, spec.region_hint, spec.region_required, no_new_vms=why)
    return NoCapacity(why, retry_after_s=left_s / time_scale)  # a client waits wall time
