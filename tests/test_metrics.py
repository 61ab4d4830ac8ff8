"""/metrics of a running local fleet, scraped over HTTP and read with Prometheus's text parser,
agrees with what the API says; and its labels stay bounded (no user, session or VM ids)."""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from conftest import fleet_config, quick_warm_up, warm_fleet
from provisioner.observability.metrics import MAX_SCRAPERS, SCRAPE_BURST, SCRAPE_CACHE_S, Metrics
from provisioner.v1 import admin_service_pb2 as a_pb
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb

ALLOWED_LABELS = {"cluster", "pool", "kind", "state", "start", "method", "outcome", "zone", "image", "process",
                  "operation", "le"}


def scrape(port: int) -> dict[str, list]:
    """Samples by name, each as (labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((s.labels, s.value))
    return samples


def total(samples, name: str, **where) -> float:
    return sum(v for labels, v in samples.get(name, []) if all(labels.get(k) == w for k, w in where.items()))


async def test_scraped_counts_agree_with_the_api(tmp_path):
    metrics = Metrics()
    async with warm_fleet(fleet_config(tmp_path, quick_warm_up), tmp_path / "data", metrics=metrics) as fleet:
        server = await metrics.serve("127.0.0.1:0")
        try:
            await check(fleet, server.port)
        finally:
            await server.close()


async def sessions_and_a_still_scrape(fleet, port: int) -> tuple[list, dict, tuple]:
    """Four sessions made (one stopped), and a scrape taken while the API read the same before and
    after it: (the sessions, the scrape, what the API read)."""
    made = []
    for i, region in enumerate(["us-central1", "us-central1", "europe-west4", "asia-east1"]):
        s = await fleet.create(user_id="alice", region_hint=region, region_required=True, request_id=f"m-{i}")
        made.append(s)
    for s in made:
        await fleet.watch_until(s.id, pb.SESSION_STATE_RUNNING)
    await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=made[0].id), timeout=10)
    await fleet.watch_until(made[0].id, pb.SESSION_STATE_STOPPED)

    async def from_api():
        listed = await fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="alice", page_size=100),
                                                   timeout=10)
        running = sum(1 for s in listed.sessions if s.state == pb.SESSION_STATE_RUNNING)
        warm = {}
        for c in fleet.fleet.clusters:
            pools = await fleet.admin.ListPools(a_pb.ListPoolsRequest(cluster=c.config.name), timeout=10)
            warm |= {(p.cluster, p.name): p.capacity.warm for p in pools.pools}
        return len(listed.sessions), running, warm

    # Pools keep changing (prewarming, scaling): compare a scrape taken between two API reads that agree.
    for _ in range(100):
        before = await from_api()
        samples = await asyncio.to_thread(scrape, port)  # the server runs on this loop
        if before == await from_api():
            break
        await asyncio.sleep(SCRAPE_CACHE_S)  # so that the next scrape is made anew, not the last one's
    else:
        raise AssertionError("the fleet never held still for one scrape")
    return made, samples, before


async def check(fleet, port: int) -> None:
    made, samples, (created, running, warm) = await sessions_and_a_still_scrape(fleet, port)

    assert created == 4
    assert total(samples, "provisioner_sessions_created_total") == created
    assert total(samples, "provisioner_sessions_created_total", cluster="us-central1", kind="interactive") == 2
    assert total(samples, "provisioner_sessions", state="running") == running == 3
    assert total(samples, "provisioner_sessions_ended_total", state="stopped") == 1
    starts = total(samples, "provisioner_session_starts_total")
    assert starts == 4
    assert total(samples, "provisioner_session_time_to_running_seconds_count") == starts
    for (cluster, pool), n in warm.items():
        assert total(samples, "provisioner_vms", cluster=cluster, pool=pool, state="warm") == n, (cluster, pool)
    assert total(samples, "provisioner_vms", state="warm") > 0

    # The front: every cluster healthy, four placements, each at the cluster it named.
    assert total(samples, "provisioner_front_cluster_healthy") == 3
    assert total(samples, "provisioner_placements_total", outcome="placed") == 4
    assert total(samples, "provisioner_placement_attempts_total", cluster="us-central1", outcome="placed") == 2
    assert total(samples, "provisioner_front_breaker_state", state="closed") == 3
    # Cloud calls, store timings, leadership.
    assert total(samples, "provisioner_cloud_calls_total", method="create", outcome="ok") > 0
    assert total(samples, "provisioner_cloud_call_duration_seconds_count", method="create") > 0
    assert total(samples, "provisioner_store_transaction_duration_seconds_count", process="front",
                 operation="write") > 0
    assert total(samples, "provisioner_leader") == 3
    assert total(samples, "provisioner_autoscaler_desired_vms") > 0
    assert "provisioner_event_loop_lag_seconds_count" in samples  # what it measures: test_loop_lag.py
    # VM-hours and cost: billed VMs were running for a while, at their pools' prices.
    assert total(samples, "provisioner_vm_seconds_total", cluster="us-central1", pool="gpu-p100") > 0
    assert total(samples, "provisioner_vm_cost_dollars_total") > 0
    assert total(samples, "provisioner_pool_cost_dollars_per_hour") > 0

    ids = {s.id for s in made} | {s.vm_id for s in made} | {"alice"}
    for name, series in samples.items():
        assert re.fullmatch(r"provisioner_[a-z_]+", name), name
        for labels, _ in series:
            assert set(labels) <= ALLOWED_LABELS, (name, labels)
            assert not set(labels.values()) & ids, (name, labels)


async def test_only_metrics_is_served(tmp_path):
    server = await Metrics().serve("127.0.0.1:0")
    try:
        def get(path: str) -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code
        assert await asyncio.to_thread(get, "/metrics") == 200
        assert await asyncio.to_thread(get, "/") == 404
        # The lag is sampled every 0.25 s while the server runs; a scrape is made anew after SCRAPE_CACHE_S.
        await asyncio.sleep(max(0.6, SCRAPE_CACHE_S + 0.1))
        assert total(await asyncio.to_thread(scrape, server.port), "provisioner_event_loop_lag_seconds_count") >= 2
    finally:
        await server.close()


async def test_a_flood_of_scrapes_makes_one_snapshot_a_second_and_connections_are_capped():
    """The port needs no credential and shares the serving loop: 40 scrapes at once read the
    collectors once, those past the burst are refused (429), and past MAX_SCRAPERS open
    connections a scrape is refused at once (503)."""
    metrics = Metrics()
    reads = []

    class Counting:
        def collect(self):
            reads.append(1)
            return []

    metrics.registry.register(Counting())
    server = await metrics.serve("127.0.0.1:0")
    try:
        def get() -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code
        statuses = await asyncio.gather(*(asyncio.to_thread(get) for _ in range(40)))
        # (a token or two comes back while the 40 are answered)
        assert set(statuses) == {200, 429} and SCRAPE_BURST <= statuses.count(200) <= SCRAPE_BURST + 5
        assert len(reads) == 1
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(MAX_SCRAPERS)]
        await asyncio.sleep(0.1)  # each holds a scraper while it says nothing
        assert await asyncio.to_thread(get) == 503
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(SCRAPE_CACHE_S)
        assert await asyncio.to_thread(get) == 200 and len(reads) == 2
    finally:
        await server.close()
