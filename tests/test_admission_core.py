"""A create's decisions at the front, without I/O (front/admission.py): the request as the fleet
takes it (`ask`), then one check of it (`CreateCheck`) from what the store holds, the week the
clusters list and their capacity. Table-driven: each row is plain inputs and the decision."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from provisioner.config import default_clusters_dir, load_fleet
from provisioner.decide.zone_memory import ProjectQuota
from provisioner.model.errors import InvalidArgument, NoCapacity, QuotaExceeded, Unavailable, UserBlocked
from provisioner.front import admission
from provisioner.front.admission import Answer, CreateCheck, Listed, ListWeek, Place, Rank, Read, Refuse, Viewed
from provisioner.front.blocks import DETECTOR, Block
from provisioner.front.router import ClusterView, PoolView
from provisioner.rules.quota import Metered, Row
from provisioner.front.records import Admission, Made
from provisioner.v1 import types_pb2 as pb

CONFIG = load_fleet(default_clusters_dir())  # pools gpu-p100 (1 P100), gpu-t4x2 (2 T4); 3 regions
QUOTAS = CONFIG.settings.quotas.with_override({"gpu_hours_per_week": 10.0,
                                               "max_active_sessions_per_user": {"interactive": 2, "batch": 1}})
RULES = admission.Rules({"gpu-p100": "nvidia-tesla-p100", "gpu-t4x2": "nvidia-tesla-t4"},
                        frozenset({"us-central1", "europe-west4"}), 86400.0, CONFIG.settings.priority, 30.0, 2.0)
NOW = datetime(2026, 11, 25, 12, tzinfo=timezone.utc).timestamp()  # a Wednesday: the week began Monday
HOUR = 3600.0


def spec(**fields) -> pb.SessionSpec:
    return pb.SessionSpec(**({"user_id": "ada", "request_id": "r-1", "accelerator": "gpu-p100", "image": "gpu:latest"}
                             | fields))


@pytest.mark.parametrize("asked, owner, want", [
    (spec(), "", {"user_id": "ada", "request_id": "r-1", "accelerator": "gpu-p100", "kind": "interactive"}),
    # A user creates sessions for itself only, whoever the spec names.
    (spec(user_id="bob"), "ada", {"user_id": "ada"}),
    # A request without an id gets the one the servicer drew.
    (spec(request_id=""), "", {"request_id": "drawn"}),
    # A pool named by the accelerator type only it has.
    (spec(accelerator="nvidia-tesla-t4"), "", {"accelerator": "gpu-t4x2"}),
    (spec(kind=pb.SESSION_KIND_BATCH), "", {"kind": "batch"}),
    (spec(region_hint="europe-west4"), "", {"region_hint": "europe-west4"}),
])
def test_the_request_as_the_fleet_takes_it(asked, owner, want):
    before = pb.SessionSpec()
    before.CopyFrom(asked)
    got = admission.ask(asked, owner, "drawn", RULES, CONFIG.catalog)
    seen = {"user_id": got.user_id, "request_id": got.spec.request_id, "accelerator": got.spec.accelerator,
            "kind": got.kind, "region_hint": got.spec.region_hint}
    assert {k: seen[k] for k in want} == want
    # What the clusters are sent says the same, and the caller's request is left as it was.
    assert (got.spec_pb.user_id, got.spec_pb.request_id, got.spec_pb.accelerator) == \
        (got.user_id, got.spec.request_id, got.spec.accelerator)
    assert asked == before
    assert got.image == CONFIG.catalog.latest and got.key == f"{got.user_id}/{got.spec.request_id}"


@pytest.mark.parametrize("asked, field", [
    (spec(region_hint="mars-north1"), "spec.region_hint"),
    (spec(accelerator="nvidia-h100"), "spec.accelerator"),
    (spec(user_id=""), "spec.user_id"),
])
def test_a_request_the_fleet_cannot_take_names_the_field(asked, field):
    with pytest.raises(InvalidArgument) as refused:
        admission.ask(asked, "", "drawn", RULES, CONFIG.catalog)
    assert refused.value.field == field


def stored(answer: str | None = None, live: int = 0, live_h: float = 0.0, ended_h: float = 0.0,
           placing=(), refused=()) -> Admission:
    return Admission(version=7, answer=answer, placing=frozenset(placing), refused=frozenset(refused), live=live,
                     live_s=live_h * HOUR, ended_s=ended_h * HOUR)


BLOCK = Block("ada", NOW - HOUR, DETECTOR, "mining", "{}")


def check(asked: pb.SessionSpec | None = None) -> CreateCheck:
    return CreateCheck(admission.ask(asked or spec(), "", "drawn", RULES, CONFIG.catalog), RULES)


@pytest.mark.parametrize("read, want", [
    # The request was answered already: its session, whatever else holds now.
    (Read(QUOTAS, stored(answer="us-central1.s9", live=2), BLOCK, 0, NOW), Answer("us-central1.s9")),
    (Read(QUOTAS, stored(), None, 0, NOW), Rank(listed=False)),
    # The bound of the store cannot prove it: the clusters' lists decide, and the action says why.
    (Read(QUOTAS, stored(live=2), None, 0, NOW), ListWeek("near the cap on active sessions")),
    (Read(QUOTAS, stored(placing={"r-0"}), None, 0, NOW), ListWeek("another create of the user is under way")),
    (Read(QUOTAS, stored(live=1, live_h=2.0, ended_h=3.0), None, 0, NOW), ListWeek("near the weekly GPU budget")),
    # 2 GPUs x 2.4 h of 10 h: within, from the store alone.
    (Read(QUOTAS, stored(live=1, live_h=1.2, ended_h=1.2), None, 0, NOW), Rank(listed=False)),
])
def test_what_the_store_decides(read, want):
    assert check().handle(read) == want


def test_a_blocked_user_is_told_by_whom_and_since_when_not_why():
    action = check().handle(Read(QUOTAS, stored(), BLOCK, 0, NOW))
    assert isinstance(action, Refuse) and isinstance(action.error, UserBlocked)
    assert "blocked by abuse detection since 2026-11-25T11:00:00Z" in str(action.error)
    assert "mining" not in str(action.error)


def row(request: str, hours: float = 1.0, live: bool = True, kind: str = "interactive", gpus: float = 1.0) -> Row:
    return Row(Metered(gpus, NOW - hours * HOUR, None if live else NOW), kind, request, live)


def made(request: str, cluster: str) -> Made:
    return Made(request, f"{cluster}.{request}", cluster, NOW - HOUR)


EVERY = frozenset({"us-central1", "europe-west4"})


@pytest.mark.parametrize("admitted, week, refused_for, last_known", [
    # One live of two allowed: one more may start.
    (stored(live=2), Listed([row("r-a")], [], [], EVERY), None, 0),
    (stored(live=2), Listed([row("r-a"), row("r-b")], [], [], EVERY), "max_active_sessions", 0),
    # A session of this very request (its answer lost) is the create's own, not one more.
    (stored(live=2), Listed([row("r-a"), row("r-1")], [row("r-1", live=False)], [], EVERY), None, 0),
    # Two live sessions of one request (a duplicate being discarded) are one to the user.
    (stored(live=2), Listed([row("r-a"), row("r-a")], [], [], EVERY), None, 0),
    # A placement under way whose session no list shows yet counts as one more.
    (stored(placing={"r-p"}), Listed([row("r-a")], [], [], EVERY), "max_active_sessions", 0),
    (stored(placing={"r-a"}), Listed([row("r-a")], [], [], EVERY), None, 0),
    # A cluster that did not list: what the store made there and saw not end counts live.
    (stored(live=2), Listed([row("r-a")], [], [made("r-m", "europe-west4")], frozenset({"us-central1"})),
     "max_active_sessions", 1),
    (stored(live=2), Listed([], [], [made("r-m", "europe-west4")], frozenset({"us-central1"})), None, 1),
    # Its sessions listed by a cluster that did list are counted from the list, not again.
    (stored(live=2), Listed([row("r-a")], [], [made("r-a", "us-central1")], EVERY), None, 0),
    # The week's budget, ended and live sessions alike: 9.5 of 10 GPU hours leave more than the
    # minute a start needs; 10 leave nothing, and 2.5 h on 4 GPUs are 10.
    (stored(live=2), Listed([row("r-a", hours=4.5)], [row("r-e", hours=5.0, live=False)], [], EVERY), None, 0),
    (stored(live=2), Listed([row("r-a", hours=5.0)], [row("r-e", hours=5.0, live=False)], [], EVERY),
     "gpu_hours_per_week", 0),
    (stored(live=2), Listed([row("r-a", hours=2.5, gpus=4.0)], [], [], EVERY), "gpu_hours_per_week", 0),
])
def test_what_the_listed_week_decides(admitted, week, refused_for, last_known):
    run = check()
    assert isinstance(run.handle(Read(QUOTAS, admitted, None, 0, NOW)), ListWeek)
    action = run.handle(week)
    assert len(action.last_known) == last_known
    if refused_for is None:
        assert action == Rank(listed=True, last_known=action.last_known)
    else:
        assert isinstance(action, Refuse) and isinstance(action.error, QuotaExceeded)
        assert action.error.field == refused_for


def test_a_refusal_for_the_budget_says_when_it_resets():
    run = check()
    run.handle(Read(QUOTAS, stored(live=2), None, 0, NOW))
    action = run.handle(Listed([row("r-a", hours=10.0)], [], [], EVERY))
    assert isinstance(action, Refuse)
    assert action.error.reset_time == datetime(2026, 11, 30, tzinfo=timezone.utc).timestamp()  # next Monday


def pool(warm_with: int = 0, warm: int = 0, room: int = 2) -> PoolView:
    return PoolView({"gpu:v160": warm_with}, warm, 0, 0, 0, warm + room, 60.0)


@pytest.mark.parametrize("asked, views, want", [
    (spec(), [ClusterView("us-central1", "us-central1", True, False, {"gpu-p100": pool()}),
              ClusterView("europe-west4", "europe-west4", True, False, {"gpu-p100": pool(warm_with=1, warm=1)})],
     ["europe-west4", "us-central1"]),
    # The hinted region pays no penalty.
    (spec(region_hint="us-central1"),
     [ClusterView("us-central1", "us-central1", True, False, {"gpu-p100": pool(room=1)}),
      ClusterView("europe-west4", "europe-west4", True, False, {"gpu-p100": pool(room=1)})],
     ["us-central1", "europe-west4"]),
    # Drained or unhealthy clusters are never tried; a pool a cluster lacks neither.
    (spec(), [ClusterView("us-central1", "us-central1", False, False, {"gpu-p100": pool()}),
              ClusterView("europe-west4", "europe-west4", True, True, {"gpu-p100": pool()}),
              ClusterView("asia-east1", "asia-east1", True, False, {"gpu-t4x2": pool()})], None),
    (spec(), [], None),
])
def test_which_clusters_are_tried(asked, views, want):
    run = check(asked)
    assert run.handle(Read(QUOTAS, stored(), None, 0, NOW)) == Rank(listed=False)
    action = run.handle(Viewed(views))
    if want is None:
        assert isinstance(action, Refuse) and isinstance(action.error, Unavailable)
    else:
        assert isinstance(action, Place) and [c.cluster for c in action.candidates] == want


QUOTA_OUT = ProjectQuota(until=NOW + 600.0, metric="GPUS_ALL_REGIONS", cluster="asia-east1")


@pytest.mark.parametrize("views, want", [
    # The project's GPU quota exhausted: only a cluster with a VM to give may take the session.
    ([ClusterView("us-central1", "us-central1", True, False, {"gpu-p100": pool()}),
      ClusterView("europe-west4", "europe-west4", True, False, {"gpu-p100": pool(warm_with=1, warm=1)})],
     ["europe-west4"]),
    ([ClusterView("us-central1", "us-central1", True, False, {"gpu-p100": pool()})], None),
])
def test_while_the_project_gpu_quota_is_exhausted(views, want):
    run = check()
    run.handle(Read(QUOTAS, stored(), None, 0, NOW))
    action = run.handle(Viewed(views, QUOTA_OUT, NOW, time_scale=60.0))
    if want is None:
        assert isinstance(action, Refuse) and isinstance(action.error, NoCapacity)
        assert "GPUS_ALL_REGIONS" in str(action.error)
        assert action.error.retry_after_s == pytest.approx(10.0)  # 600 s of fleet time at 60x: wall seconds
    else:
        assert isinstance(action, Place) and [c.cluster for c in action.candidates] == want


def test_a_check_begins_with_what_the_store_holds():
    with pytest.raises(ValueError):
        check().handle(Viewed([]))
