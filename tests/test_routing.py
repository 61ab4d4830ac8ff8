"""Routing (a pure function) and the circuit breaker, property-tested where it matters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.front.breaker import CircuitBreaker
from provisioner.front.router import ClusterView, PoolView, rank

REGIONS = ("us-central1", "europe-west4", "asia-east1")
IMAGES = ("gpu:v158", "gpu:v159", "gpu:v160")
PENALTY_S = 30.0

pools = st.builds(
    lambda warm_by_image, booting, assigned, queued, max_vms, cold: PoolView(
        warm_by_image={i: n for i, n in warm_by_image.items() if n}, warm=sum(warm_by_image.values()),
        booting=booting, assigned=assigned, queued=queued, max_vms=max_vms, cold_start_s=cold),
    st.dictionaries(st.sampled_from(IMAGES), st.integers(0, 3)), st.integers(0, 3), st.integers(0, 10),
    st.integers(0, 5), st.integers(1, 20), st.floats(60, 900))


@st.composite
def fleets(draw) -> list[ClusterView]:
    n = draw(st.integers(1, 6))
    return [ClusterView(f"c{i}", draw(st.sampled_from(REGIONS)), draw(st.booleans()), draw(st.booleans()),
                        {"gpu-p100": draw(pools)}) for i in range(n)]


requests = st.tuples(st.sampled_from(IMAGES), st.sampled_from(REGIONS), st.booleans())


@settings(max_examples=300, deadline=None)
@given(fleets(), requests)
def test_drained_or_unhealthy_clusters_are_never_candidates(clusters, req):
    image, region, required = req
    usable = {c.name for c in clusters if c.healthy and not c.draining}
    chosen = [cand.cluster for cand in rank(clusters, "gpu-p100", image, region, required, PENALTY_S)]
    assert set(chosen) <= usable
    assert len(chosen) == len(set(chosen))  # each cluster at most once: ordered spillover, no fan-out
    if not required:
        assert set(chosen) == usable


@settings(max_examples=300, deadline=None)
@given(fleets(), requests)
def test_a_demanded_region_is_never_left(clusters, req):
    image, region, _ = req
    chosen = rank(clusters, "gpu-p100", image, region, True, PENALTY_S)
    by_name = {c.name: c for c in clusters}
    assert all(by_name[cand.cluster].region == region for cand in chosen)


@settings(max_examples=300, deadline=None)
@given(fleets(), requests)
def test_an_exact_image_warm_vm_in_the_preferred_region_wins(clusters, req):
    image, region, required = req
    home_exact = [c.name for c in clusters if c.healthy and not c.draining and c.region == region
                  and c.pools["gpu-p100"].warm_by_image.get(image, 0) > 0]
    chosen = rank(clusters, "gpu-p100", image, region, required, PENALTY_S)
    if home_exact:
        assert chosen[0].cluster in home_exact and chosen[0].how == "warm"


def test_order_is_time_to_ready_then_region_then_load():
    def pool(**kw):
        base = dict(warm_by_image={}, warm=0, booting=0, assigned=0, queued=0, max_vms=10, cold_start_s=600.0)
        return PoolView(**(base | kw))

    clusters = [
        ClusterView("far-warm", "asia-east1", True, False, {"gpu-p100": pool(warm_by_image={"gpu:v160": 1}, warm=1)}),
        ClusterView("home-cold", "us-central1", True, False, {"gpu-p100": pool()}),
        ClusterView("home-partial-busy", "us-central1", True, False,
                    {"gpu-p100": pool(warm_by_image={"gpu:v150": 1}, warm=1, assigned=8)}),
        ClusterView("home-partial-idle", "us-central1", True, False,
                    {"gpu-p100": pool(warm_by_image={"gpu:v150": 1}, warm=1)}),
        ClusterView("home-full", "us-central1", True, False, {"gpu-p100": pool(assigned=10, queued=3)}),
    ]
    order = [c.cluster for c in rank(clusters, "gpu-p100", "gpu:v160", "us-central1", False, PENALTY_S)]
    # A remote warm VM (1 s + 30 s penalty) beats a home partial pull (120 s) and a cold start.
    assert order == ["far-warm", "home-partial-idle", "home-partial-busy", "home-cold", "home-full"]


def test_breaker_opens_after_repeated_failures_and_lets_one_trial_through_later():
    b = CircuitBreaker(failures_to_open=3, open_s=5.0)
    for t in (0.0, 0.1):
        b.failure(t)
        assert b.allows(t)  # two failures: still closed
    b.failure(0.2)
    assert b.state(0.2) == "open" and not b.allows(4.0)
    assert b.state(5.2) == "half-open" and b.allows(5.2)
    b.attempt(5.2)
    assert not b.allows(5.3)  # one trial at a time
    b.failure(5.4)  # the trial failed: wait again
    assert not b.allows(10.0) and b.allows(10.4)
    b.attempt(10.4)
    b.success()
    assert b.state(10.5) == "closed" and b.allows(10.5) and b.failures == 0


def test_an_answer_resets_the_count():
    b = CircuitBreaker(failures_to_open=2)
    b.failure(0.0)
    b.success()
    b.failure(1.0)
    assert b.state(1.0) == "closed"


def test_a_burst_of_creates_spreads_once_the_warm_vms_it_was_shown_are_taken():
    # Capacity pushes are throttled: between two pushes the front counts each create it routed as
    # holding a warm VM, so a burst does not send everyone to the one cluster the last push favoured.
    from provisioner.front.clusters import taken

    def cluster(name: str, warm: int) -> ClusterView:
        return ClusterView(name, "us-central1", True, False, {"gpu-p100": PoolView(
            {"gpu:v160": warm}, warm=warm, booting=0, assigned=0, queued=0, max_vms=20, cold_start_s=600)})

    views = [cluster("a", 3), cluster("b", 2)]
    routed = []
    for _ in range(6):
        best = rank(views, "gpu-p100", "gpu:v160", "us-central1", False, PENALTY_S)[0]
        routed.append((best.cluster, best.how))
        views = [ClusterView(v.name, v.region, v.healthy, v.draining,
                             {"gpu-p100": taken(v.pools["gpu-p100"], {"gpu:v160": 1})}) if v.name == best.cluster else v
                 for v in views]
    assert sorted(routed[:5]) == [("a", "warm")] * 3 + [("b", "warm")] * 2
    assert routed[5][1] == "cold"  # the sixth finds no warm VM left anywhere


def test_creates_held_at_once_take_what_as_many_taken_one_by_one_would():
    from provisioner.front.clusters import taken

    pool = PoolView({"a": 2, "b": 1, "c": 0}, warm=4, booting=0, assigned=1, queued=0, max_vms=9, cold_start_s=600)
    one_by_one = pool
    for image in ["a", "a", "a", "c", "b", "b"]:
        one_by_one = taken(one_by_one, {image: 1})
    assert taken(pool, {"a": 3, "c": 1, "b": 2}) == one_by_one
    assert (one_by_one.warm, one_by_one.assigned, one_by_one.queued) == (0, 5, 2)
    assert one_by_one.warm_by_image == {"a": 0, "b": 0, "c": 0}


def test_a_push_of_changed_pools_only_keeps_the_others_as_they_were():
    from provisioner.front.clusters import merged
    from provisioner.v1 import cluster_service_pb2 as cluster_pb
    from provisioner.v1 import types_pb2 as pb

    def push(changes_only: bool, draining: bool, **warm: int) -> cluster_pb.WatchCapacityResponse:
        return cluster_pb.WatchCapacityResponse(changes_only=changes_only, capacity=pb.ClusterCapacity(
            cluster="c", draining=draining, pools=[pb.PoolCapacity(pool=p, warm=n) for p, n in warm.items()]))

    known = merged(None, push(False, False, p100=3, t4=5))
    known = merged(known, push(True, True, t4=4))
    assert [(p.pool, p.warm) for p in known.pools] == [("p100", 3), ("t4", 4)] and known.draining
    known = merged(known, push(False, False, t4=1))  # a whole one (a new stream) replaces everything
    assert [(p.pool, p.warm) for p in known.pools] == [("t4", 1)]
