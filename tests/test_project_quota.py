"""The project-wide GPU quota (GPUS_ALL_REGIONS) is every cluster's: the core that learns it holds
it and reports it, a core told of it holds it alike, and the front routes knowing that no cluster
can add a VM (a queue only where VMs will come free, else RESOURCE_EXHAUSTED saying why)."""

from __future__ import annotations

from types import SimpleNamespace

from core_driver import make_core
from provisioner.api import convert
from provisioner.cloud.base import CloudFailure
from provisioner.common.clock import RealClock
from provisioner.decide import events as ev
from provisioner.decide.commands import Launch
from provisioner.decide.zone_memory import QUOTA_MEMORY_S, ProjectQuota
from provisioner.model.errors import NoCapacity, Unavailable
from provisioner.front import project_quota
from provisioner.front.admission import no_candidate
from provisioner.front.cluster_reports import capacity_problem
from provisioner.front.router import ClusterView, PoolView, rank
from provisioner.model.records import SessionSpec
from provisioner.v1 import types_pb2 as pb

PROJECT_WIDE = CloudFailure("quota", "QUOTA_EXCEEDED: Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.",
                            "us-central1-c", scope="project", metric="GPUS_ALL_REGIONS")


def launches(step) -> list[Launch]:
    return [c for c in step.commands if isinstance(c, Launch)]


def test_the_core_that_meets_the_quota_holds_it_for_every_pool_and_names_it():
    core = make_core(min_vms=2)
    first = launches(core.handle(ev.Tick(100.0)))
    assert first and core.project_quota is None
    core.handle(ev.CommandFailed(101.0, first[0].id, PROJECT_WIDE))
    assert core.project_quota == ProjectQuota(101.0 + QUOTA_MEMORY_S, "GPUS_ALL_REGIONS", "us-central1")
    assert not launches(core.handle(ev.Tick(160.0)))  # no zone of any pool is tried meanwhile
    # A regional quota is the region's alone: no project-wide quota comes of it.
    other = make_core(min_vms=2)
    cmd = launches(other.handle(ev.Tick(100.0)))[0]
    other.handle(ev.CommandFailed(101.0, cmd.id, CloudFailure("quota", "NVIDIA_P100_GPUS", cmd.zone,
                                                               scope="region", metric="NVIDIA_P100_GPUS")))
    assert other.project_quota is None


def test_a_core_told_of_the_quota_inserts_nothing_until_it_may_have_been_freed():
    core = make_core(min_vms=2)
    quota = ProjectQuota(100.0 + 600.0, "GPUS_ALL_REGIONS", "europe-west4")
    assert core.handle(ev.ProjectQuotaTold(100.0, quota)).reply is True
    assert not launches(core.handle(ev.Tick(101.0)))
    # Told again, or of an earlier end (another front, late): nothing changes.
    assert core.handle(ev.ProjectQuotaTold(102.0, ProjectQuota(650.0, "GPUS_ALL_REGIONS", "asia-east1"))).reply is False
    assert core.project_quota == quota
    assert launches(core.handle(ev.Tick(701.0)))  # it may have been freed: try again


def test_a_told_end_is_never_further_than_the_quota_memory():
    core = make_core(min_vms=2)
    core.handle(ev.ProjectQuotaTold(100.0, ProjectQuota(1e12, "GPUS_ALL_REGIONS", "europe-west4")))
    assert core.project_quota.until == 100.0 + QUOTA_MEMORY_S
    assert launches(core.handle(ev.Tick(101.0 + QUOTA_MEMORY_S)))


def view(name: str, warm: int = 0, assigned: int = 0, image: str = "") -> ClusterView:
    pool = PoolView(warm_by_image={image: warm} if image else {}, warm=warm, booting=0, assigned=assigned, queued=0,
                    max_vms=10, cold_start_s=600.0)
    return ClusterView(name, name, True, False, {"gpu-p100": pool})


def test_without_new_vms_a_session_queues_only_where_vms_will_come_free():
    views = [view("us-central1"), view("europe-west4", assigned=2), view("asia-east1", warm=1, image="gpu:v1")]
    assert [(c.cluster, c.how) for c in rank(views, "gpu-p100", "gpu:v1", "", False, 30.0)] == \
        [("asia-east1", "warm"), ("us-central1", "cold"), ("europe-west4", "cold")]
    assert [(c.cluster, c.how) for c in rank(views, "gpu-p100", "gpu:v1", "", False, 30.0, new_vms=False)] == \
        [("asia-east1", "warm"), ("europe-west4", "queue")]
    assert rank(views[:1], "gpu-p100", "gpu:v1", "", False, 30.0, new_vms=False) == []


def client(name: str, until: float | None) -> SimpleNamespace:
    """What the quota's front side reads of a cluster: its last capacity report."""
    cap = pb.ClusterCapacity(cluster=name)
    if until is not None:
        cap.project_quota.CopyFrom(convert.project_quota_to_pb(ProjectQuota(until, "GPUS_ALL_REGIONS", name)))
    return SimpleNamespace(name=name, capacity=cap, healthy=True)


def test_the_front_takes_the_latest_end_any_cluster_reports_while_it_lasts():
    clients = [client("us-central1", 1000.0), client("europe-west4", 1500.0), client("asia-east1", None)]
    assert project_quota.current(clients, 900.0) == ProjectQuota(1500.0, "GPUS_ALL_REGIONS", "europe-west4")
    assert project_quota.current(clients, 1500.0) is None
    assert project_quota.current([client("asia-east1", None)], 0.0) is None


def test_a_create_no_cluster_can_take_says_the_quota_is_why():
    spec = SessionSpec(request_id="r", user_id="ada", accelerator="gpu-p100", image="gpu:latest")
    clock = RealClock(time_scale=30.0)
    views = [view("us-central1")]
    now = clock.now()
    err = no_candidate(views, spec, ProjectQuota(now + 600.0, "GPUS_ALL_REGIONS", "europe-west4"), now, clock.time_scale)
    assert isinstance(err, NoCapacity) and err.grpc_code == "RESOURCE_EXHAUSTED"
    assert "GPUS_ALL_REGIONS quota is exhausted" in err.message and "europe-west4" in err.message
    assert "us-central1" in err.message and 19.0 < err.retry_after_s <= 20.0  # 600 s of fleet time at x30
    assert isinstance(no_candidate(views, spec, None, now, clock.time_scale), Unavailable)


def test_a_cluster_s_quota_report_is_checked_before_the_front_relays_it():
    cap = pb.ClusterCapacity(cluster="us-central1", time=convert.timestamp(1000.0))
    cap.project_quota.CopyFrom(convert.project_quota_to_pb(ProjectQuota(1000.0 + QUOTA_MEMORY_S, "GPUS_ALL_REGIONS",
                                                                        "us-central1")))
    assert capacity_problem("us-central1", cap, {}) is None
    cap.project_quota.until.CopyFrom(convert.timestamp(1000.0 + 7 * 86400))  # a week without GPUs for the fleet
    assert "further ahead" in capacity_problem("us-central1", cap, {})
    cap.project_quota.CopyFrom(convert.project_quota_to_pb(ProjectQuota(1100.0, "GPUS\x1b[2J", "us-central1")))
    assert "not of the fleet's form" in capacity_problem("us-central1", cap, {})
