"""Prometheus metrics, read at the edges: gauges from the state the cluster core and the front
already keep (at scrape time), counters and histograms from the changes the runtime applies, the
cloud calls and the store's transactions. Nothing in the core knows about them.

Labels are bounded: cluster, pool, zone, state, kind, start, method, outcome, image (from the
catalog). Never a user, session or VM id. One registry per process; a local fleet in one process
shares one, told apart by the `cluster` label. Times in the cluster's model time are labelled as
such in their help text (the simulated cloud may run faster than the wall).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from provisioner.decide.autoscale import desired_vms
from provisioner.observability.loop_lag import INTERVAL_S, watch_lag
from provisioner.rules.ratelimit import TokenBuckets
from provisioner.cloud.base import CloudFailure
from provisioner.model.records import Session
from provisioner.common.port_holder import PortTaken
from provisioner.model.states import VM_ACTIVE, SessionState, VmState

if TYPE_CHECKING:
    from provisioner.api.guard import Guard
    from provisioner.cluster.runtime import ClusterRuntime
    from provisioner.front.placement import Placement
    from provisioner.front.service import Fleet
    from provisioner.store import Store
    from provisioner.registry.catalog import CatalogFeed

log = logging.getLogger(__name__)

# Model seconds from request to running: a warm start takes well under a second, a cold one
# with a full pull ten minutes or more.
TIME_TO_RUNNING_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600)
CLOUD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# A scrape is made at most this often (wall seconds); scrapes meanwhile get the same text.
SCRAPE_CACHE_S = 1.0
MAX_SCRAPERS = 8  # metrics connections answered at a time; more get 503 at once
# Scrapes answered a second, after a burst (a few Prometheus replicas scrape every 15 s or so);
# more get 429 at once, before anything is read.
SCRAPES_PER_S, SCRAPE_BURST = 5.0, 20
LOOP_LAG = "provisioner_event_loop_lag_seconds"  # read back by the serving benchmark (perf/usage.py)
_LIVE_SESSION_STATES = [s for s in SessionState if s not in (SessionState.STOPPED, SessionState.FAILED)]
_BREAKER_STATES = ("closed", "open", "half-open")
# No `_created` series beside every counter: they double the series and nothing here reads them.
disable_created_metrics()


class _Children:
    """A metric's children by label values, looked up without the client library's lock and
    checks after the first time: the cloud's health reads alone ask thousands a second at x30.
    Labels are bounded (see the module's docstring), and no child is ever removed."""

    def __init__(self, metric):
        self._metric, self._children = metric, {}

    def __call__(self, *values: str):
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Metrics:
    """One process's registry and the counters that are fed as things happen."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._guards: dict[str, Guard] = {}
        self._scrapers = 0  # metrics connections being answered
        self._snapshot: tuple[float, bytes] | None = None  # (when, the text) of the last scrape
        self._making: asyncio.Future | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="metrics")  # writes the scrape's text
        self._scrape_rate = TokenBuckets(SCRAPES_PER_S, SCRAPE_BURST)
        self.sessions_created = Counter("provisioner_sessions_created", "Sessions made by the cluster.",
                                        ["cluster", "pool", "kind"], registry=r)
        self.session_starts = Counter("provisioner_session_starts", "Sessions that reached running, by how "
                                      "they got their VM (warm, partial, cold).", ["cluster", "pool", "start"],
                                      registry=r)
        self.sessions_ended = Counter("provisioner_sessions_ended", "Sessions that ended, by final state.",
                                      ["cluster", "pool", "state"], registry=r)
        self.time_to_running = Histogram("provisioner_session_time_to_running_seconds",
                                         "From request to running, in the cluster's model seconds.",
                                         ["cluster", "pool", "start"], buckets=TIME_TO_RUNNING_BUCKETS, registry=r)
        self.cloud_calls = Counter("provisioner_cloud_calls", "Calls to the cloud backend by method and outcome "
                                   "(ok, a failure code such as stockout or rate_limited, or exception).",
                                   ["cluster", "method", "outcome"], registry=r)
        self.cloud_seconds = Histogram("provisioner_cloud_call_duration_seconds",
                                       "Wall time of calls to the cloud backend.", ["cluster", "method"],
                                       buckets=CLOUD_BUCKETS, registry=r)
        self.store_seconds = Histogram("provisioner_store_transaction_duration_seconds",
                                       "Wall time of a store transaction or read, waiting for the store included.",
                                       ["process", "operation"], buckets=STORE_BUCKETS, registry=r)
        self.leader = Gauge("provisioner_leader", "1 while this replica holds the cluster's lease.", ["cluster"],
                            registry=r)
        self.leader_since = Gauge("provisioner_leader_since_timestamp_seconds",
                                  "When this replica took the cluster's lease (Unix time).", ["cluster"], registry=r)
        self.loop_lag = Histogram(LOOP_LAG,
                                  f"How late the process's event loop ran a timer due every {INTERVAL_S:g} s: how "
                                  "long every call in flight then waited for the loop.", buckets=LAG_BUCKETS,
                                  registry=r)
        self._clusters: _Merged | None = None

    # ---- clusters ------------------------------------------------------------------------

    def watch_cluster(self, runtime: ClusterRuntime) -> None:
        """Counts the runtime's session changes and reports its state on every scrape."""
        runtime.observers.append(_SessionCounter(self, runtime.core.name).changed)
        meter = _VmMeter(runtime)
        runtime.observers.append(meter.changed)
        if self._clusters is None:  # one collector for every cluster of the process (`up` runs three)
            self._clusters = _Merged()
            self.registry.register(self._clusters)
        self._clusters.parts.append(_ClusterCollector(runtime, meter))

    def leading(self, cluster: str, leading: bool) -> None:
        self.leader.labels(cluster).set(1 if leading else 0)
        if leading:
            self.leader_since.labels(cluster).set(time.time())  # wall time: Prometheus compares it with time()

    def backend(self, backend, cluster: str) -> MeteredBackend:
        return MeteredBackend(backend, self, cluster)

    # ---- the front -------------------------------------------------------------------------

    def watch_front(self, fleet: Fleet, placement: Placement) -> None:
        self.registry.register(_FrontCollector(fleet, placement))

    # ---- both ----------------------------------------------------------------------------

    def watch_guard(self, guard: Guard, process: str) -> None:
        """Counts the calls `guard` refuses, by `process` ("front" or a cluster's name) and status
        code (as `outcome`). One collector for every guard of the process, so that each family is
        written once."""
        if not self._guards:
            self.registry.register(_GuardCollector(self._guards))
        self._guards[process] = guard

    def watch_catalog(self, feed: CatalogFeed) -> None:
        """The image catalog's refreshes by outcome (changed, unchanged, failed) and its size."""
        self.registry.register(_CatalogCollector(feed))

    def time_store(self, store: Store, process: str) -> Store:
        """Times every transaction and read of `store` (the same object, its two doors wrapped)."""
        write, read = store.transaction, store.reading
        store.transaction = _timed(write, self.store_seconds.labels(process, "write"))  # type: ignore[method-assign]
        store.reading = _timed(read, self.store_seconds.labels(process, "read"))  # type: ignore[method-assign]
        return store

    async def serve(self, address: str) -> MetricsServer:
        """Serves GET /metrics over HTTP at `address` (host:port; port 0 picks one), and measures
        the event loop's lag meanwhile. The port needs no credential and shares the serving loop,
        so a scrape costs that loop little whoever sends it: one snapshot a second at most, the
        collectors read on the loop (they read state the loop changes) and the text written in a
        thread; at most MAX_SCRAPERS connections at a time and SCRAPES_PER_S answered."""
        host, _, port = address.rpartition(":")
        try:
            server = await asyncio.start_server(self._http, host.strip("[]") or None, int(port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortTaken(address, "metrics") from None
            raise
        return MetricsServer(server, asyncio.create_task(watch_lag(self.loop_lag.observe)))

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._scrapers >= MAX_SCRAPERS:
                status, body, kind = "503 Service Unavailable", b"too many scrapes at once\n", "text/plain"
            else:
                self._scrapers += 1
                try:
                    status, body, kind = await self._answer(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10))
                finally:
                    self._scrapers -= 1
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError,
                ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method != "GET" or path != "/metrics":
            return "404 Not Found", b"only GET /metrics here\n", "text/plain"
        if self._scrape_rate.wait_s("", now := time.monotonic()):  # wall time: it paces requests from outside
            return "429 Too Many Requests", b"too many scrapes; Prometheus needs one every 15 s or so\n", "text/plain"
        self._scrape_rate.take("", now)
        try:
            return "200 OK", await self.scrape(), CONTENT_TYPE_LATEST
        except Exception:
            log.exception("collecting metrics failed")
            return "500 Internal Server Error", b"collecting metrics failed\n", "text/plain"

    async def scrape(self) -> bytes:
        """The exposition text, made at most once every SCRAPE_CACHE_S (wall time, on purpose:
        it paces requests from outside); scrapes meanwhile share it, or the one being made."""
        if self._snapshot is not None and time.monotonic() - self._snapshot[0] < SCRAPE_CACHE_S:
            return self._snapshot[1]
        if self._making is None:
            self._making = asyncio.ensure_future(self._make_snapshot())
        return await asyncio.shield(self._making)

    async def _make_snapshot(self) -> bytes:
        try:
            families = list(self.registry.collect())
            # A thread of its own: the loop's default executor may be busy with anything.
            body = await asyncio.get_running_loop().run_in_executor(self._writer, generate_latest, _Collected(families))
            self._snapshot = (time.monotonic(), body)
            return body
        finally:
            self._making = None


class _Collected:
    """Metric families already collected, as generate_latest takes a registry."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families


class MetricsServer:
    def __init__(self, server: asyncio.Server, lag: asyncio.Task):
        self._server, self._lag = server, lag
        self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._lag.cancel()
        self._server.close()
        await self._server.wait_closed()


def _timed(door, histogram):
    # Wall time on purpose: how long a transaction held the store, not how much model time passed.
    @contextmanager
    def timed(*args, **kwargs) -> Iterator:
        started = time.perf_counter()
        try:
            with door(*args, **kwargs) as cur:
                yield cur
        finally:
            histogram.observe(time.perf_counter() - started)
    return timed


class _SessionCounter:
    """Feeds the counters from changed sessions: each history entry is seen once (the runtime
    hands over every changed session after each event; several changes may come at once)."""

    def __init__(self, metrics: Metrics, cluster: str):
        self.cluster = cluster
        self.created, self.ended = _Children(metrics.sessions_created), _Children(metrics.sessions_ended)
        self.starts, self.to_running = _Children(metrics.session_starts), _Children(metrics.time_to_running)
        self.seen: dict[str, int] = {}  # live session id -> history entries already counted

    def changed(self, sessions: list[Session], restored: bool = False) -> None:
        for s in sessions:
            if restored:  # counted by the process that made them
                if not s.terminal:
                    self.seen[s.id] = len(s.history)
                continue
            first = self.seen.get(s.id, 0)
            for i, change in enumerate(s.history[first:], start=first):
                state = change.state
                if i == 0:
                    self.created(self.cluster, s.pool, s.spec.kind.value).inc()
                if state == SessionState.RUNNING.value and s.start is not None:
                    start = s.start.value
                    self.starts(self.cluster, s.pool, start).inc()
                    self.to_running(self.cluster, s.pool, start).observe(
                        max(0.0, change.time - s.created_at))
                elif state in (SessionState.STOPPED.value, SessionState.FAILED.value):
                    self.ended(self.cluster, s.pool, state).inc()
            if s.terminal:
                self.seen.pop(s.id, None)
            else:
                self.seen[s.id] = len(s.history)


class _VmMeter:
    """VM-seconds and cost per pool, integrated over the cluster's model time: after every change
    the runtime applies (and at every scrape), the billed VMs counted last time are charged for
    the time since, then counted again."""

    def __init__(self, runtime: ClusterRuntime):
        self.rt = runtime
        self.at: float | None = None
        self.billed: dict[str, int] = {}
        self.vm_seconds: dict[str, float] = {name: 0.0 for name in runtime.core.pools}
        self.cost: dict[str, float] = {name: 0.0 for name in runtime.core.pools}

    def changed(self, sessions=(), restored: bool = False) -> None:
        now = self.rt.clock.now()
        pools = self.rt.core.pools
        if self.at is not None and now > self.at:
            dt = now - self.at
            for name, n in self.billed.items():
                self.vm_seconds[name] += n * dt
                self.cost[name] += n * pools[name].config.running_usd_per_h * dt / 3600.0
        if self.at is None or now >= self.at:
            self.at = now
        self.billed = {name: sum(pool.count.get(state, 0) for state in VM_ACTIVE) for name, pool in pools.items()}


class _Merged(Collector):
    """The families of several collectors, one per name: the text format allows a family's HELP
    and TYPE once per scrape, so the clusters of one process share theirs."""

    def __init__(self) -> None:
        self.parts: list[Collector] = []

    def collect(self):
        families: dict[str, Metric] = {}
        for part in self.parts:
            for family in part.collect():
                if (kept := families.get(family.name)) is None:
                    families[family.name] = family
                else:
                    kept.samples.extend(family.samples)
        yield from families.values()


class _ClusterCollector(Collector):
    def __init__(self, runtime: ClusterRuntime, meter: _VmMeter):
        self.rt, self.meter = runtime, meter

    def collect(self):
        core, now = self.rt.core, self.rt.clock.now()
        c = core.name
        sessions = GaugeMetricFamily("provisioner_sessions", "Live sessions by state and kind.",
                                     labels=["cluster", "pool", "kind", "state"])
        queue = GaugeMetricFamily("provisioner_queue_length", "Sessions waiting for a VM.", labels=["cluster", "pool"])
        oldest = GaugeMetricFamily("provisioner_queue_oldest_wait_seconds",
                                   "How long the longest-waiting queued session has waited (model seconds).",
                                   labels=["cluster", "pool"])
        vms = GaugeMetricFamily("provisioner_vms", "VMs by state (deleted ones not counted).",
                                labels=["cluster", "pool", "state"])
        unhealthy = GaugeMetricFamily("provisioner_vms_unhealthy", "VMs whose last health check failed.",
                                      labels=["cluster", "pool"])
        by_image = GaugeMetricFamily("provisioner_warm_vms_with_image",
                                     "Assignable warm VMs holding each image version.",
                                     labels=["cluster", "pool", "image"])
        desired = GaugeMetricFamily("provisioner_autoscaler_desired_vms",
                                    "VMs the autoscaler wants now (demand plus warm, within min and max).",
                                    labels=["cluster", "pool"])
        actual = GaugeMetricFamily("provisioner_autoscaler_actual_vms",
                                   "VMs the pool has or is making (all but deleting ones).", labels=["cluster", "pool"])
        cost = GaugeMetricFamily("provisioner_pool_cost_dollars_per_hour",
                                 "What the pool's billed VMs cost now.", labels=["cluster", "pool"])
        stocked = GaugeMetricFamily("provisioner_zone_stocked_out", "1 while a zone is skipped after a stockout.",
                                    labels=["cluster", "pool", "zone"])
        draining = GaugeMetricFamily("provisioner_cluster_draining", "1 while the cluster is drained.",
                                     labels=["cluster"])
        draining.add_metric([c], 1 if core.draining else 0)
        self.meter.changed()
        vm_seconds = CounterMetricFamily("provisioner_vm_seconds", "VM-seconds billed (model time), by pool.",
                                         labels=["cluster", "pool"])
        spent = CounterMetricFamily("provisioner_vm_cost_dollars", "What the pool's VMs have cost (model time).",
                                    labels=["cluster", "pool"])
        for name in core.pools:
            vm_seconds.add_metric([c, name], self.meter.vm_seconds[name])
            spent.add_metric([c, name], self.meter.cost[name])
        counts: dict[tuple[str, str, str], int] = {}
        waiting: dict[str, float] = {}
        for s in core.sessions.values():
            if s.terminal or s.state is None:
                continue
            key = (s.pool, s.spec.kind.value, s.state.value)
            counts[key] = counts.get(key, 0) + 1
            if s.state is SessionState.QUEUED:
                waiting[s.pool] = max(waiting.get(s.pool, 0.0), now - s.created_at)
        for name, pool in core.pools.items():
            for kind in ("interactive", "batch"):
                for state in _LIVE_SESSION_STATES:
                    sessions.add_metric([c, name, kind, state.value], counts.get((name, kind, state.value), 0))
            queue.add_metric([c, name], len(pool.queue))
            oldest.add_metric([c, name], waiting.get(name, 0.0))
            for state in VmState:
                if state is not VmState.DELETED:
                    vms.add_metric([c, name, state.value], pool.count.get(state, 0))
            unhealthy.add_metric([c, name], sum(1 for vm in pool.vms.values() if not vm.healthy))
            held: dict[str, int] = {}
            for vm in core.assignable(pool):
                for image in vm.cache.images(core.catalog):
                    held[image] = held.get(image, 0) + 1
            for image, n in sorted(held.items()):
                by_image.add_metric([c, name, image], n)
            desired.add_metric([c, name], desired_vms(core.snapshot(pool)))
            actual.add_metric([c, name], len(pool.vms) - pool.count.get(VmState.DELETING, 0))
            cost.add_metric([c, name], self.meter.billed[name] * pool.config.running_usd_per_h)
            for zone in pool.config.zones:
                stocked.add_metric([c, name, zone], 1 if pool.stocked_out_until.get(zone, 0) > now else 0)
        yield from (sessions, queue, oldest, vms, unhealthy, by_image, desired, actual, cost, stocked, draining,
                    vm_seconds, spent)


class _CatalogCollector(Collector):
    def __init__(self, feed: CatalogFeed):
        self.feed = feed

    def collect(self):
        refreshes = CounterMetricFamily("provisioner_image_catalog_refreshes",
                                        "Reads of the image catalog from its registry, by outcome (a failed one "
                                        "keeps the last good catalog).", labels=["outcome"])
        for outcome, n in self.feed.refreshes.items():
            refreshes.add_metric([outcome], n)
        versions = GaugeMetricFamily("provisioner_image_catalog_versions", "Image versions in the catalog.")
        versions.add_metric([], len(self.feed.current))
        return [refreshes, versions]


class _FrontCollector(Collector):
    def __init__(self, fleet: Fleet, placement: Placement):
        self.fleet, self.placement = fleet, placement

    def collect(self):
        healthy = GaugeMetricFamily("provisioner_front_cluster_healthy",
                                    "1 while the front hears the cluster's capacity stream.", labels=["cluster"])
        routable = GaugeMetricFamily("provisioner_front_cluster_routable",
                                     "1 while the front may send the cluster new sessions.", labels=["cluster"])
        breaker = GaugeMetricFamily("provisioner_front_breaker_state",
                                    "The front's circuit breaker for the cluster (1 for its current state).",
                                    labels=["cluster", "state"])
        attempts = CounterMetricFamily("provisioner_placement_attempts",
                                       "Placement attempts at a cluster by outcome (placed, found after an "
                                       "ambiguous failure, refused, unresolved, duplicate).",
                                       labels=["cluster", "outcome"])
        placements = CounterMetricFamily("provisioner_placements", "CreateSession placements by outcome (placed, "
                                         "duplicate, failed, invalid, held).",
                                         labels=["outcome"])
        for client in self.fleet.clients.values():
            healthy.add_metric([client.name], 1 if client.healthy else 0)
            view = client.view()
            routable.add_metric([client.name], 1 if view.healthy and not view.draining else 0)
            state = client.breaker_state()
            for s in _BREAKER_STATES:
                breaker.add_metric([client.name, s], 1 if s == state else 0)
        last_known = CounterMetricFamily("provisioner_quota_checks_last_known",
                                         "Quota checks that counted a user's sessions at the cluster from the "
                                         "front's store (the last known), the cluster not listing them.",
                                         labels=["cluster"])
        for (cluster, outcome), n in sorted(self.placement.attempt_outcomes.items()):
            attempts.add_metric([cluster, outcome], n)
        for outcome, n in sorted(self.placement.outcomes.items()):
            placements.add_metric([outcome], n)
        for cluster, n in sorted(self.fleet.counted_last_known.items()):
            last_known.add_metric([cluster], n)
        yield from (healthy, routable, breaker, attempts, placements, last_known)


class _GuardCollector(Collector):
    def __init__(self, guards: dict[str, Guard]):
        self.guards = guards

    def collect(self):
        refused = CounterMetricFamily("provisioner_refused_calls", "Calls refused at the server's edge, by method "
                                      "and status code (UNAUTHENTICATED ones are counted here, not audited).",
                                      labels=["process", "method", "outcome"])
        for process, guard in sorted(self.guards.items()):
            for (method, code), n in sorted(guard.refusals.items()):
                refused.add_metric([process, method, code], n)
        yield refused


class MeteredBackend:
    """The cluster's cloud backend with each call counted and timed; anything else passes through."""

    _METHODS = ("create", "wait_ready", "pull", "wipe", "delete", "list_vms", "health")

    def __init__(self, backend, metrics: Metrics, cluster: str):
        self._backend = backend
        calls, seconds = _Children(metrics.cloud_calls), _Children(metrics.cloud_seconds)
        for name in self._METHODS:
            if hasattr(backend, name):
                setattr(self, name, self._metered(getattr(backend, name), name, cluster, calls, seconds))

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    @staticmethod
    def _metered(method, name: str, cluster: str, calls: _Children, seconds: _Children):
        async def call(*args, **kwargs):
            started = time.perf_counter()  # wall time: the cloud call's real latency
            outcome = "exception"
            try:
                result = await method(*args, **kwargs)
                outcome = result.code if isinstance(result, CloudFailure) else "ok"
                return result
            finally:
                calls(cluster, name, outcome).inc()
                seconds(cluster, name).observe(time.perf_counter() - started)
        return call
