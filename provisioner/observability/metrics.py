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

from provisioner.observability.collectors import (CatalogCollector, Children, ClusterCollector, FrontCollector,
                                                  GuardCollector, Merged, SessionCounter, VmMeter)
from provisioner.observability.loop_lag import INTERVAL_S, watch_lag
from provisioner.rules.ratelimit import TokenBuckets
from provisioner.cloud.base import CloudFailure
from provisioner.common.pacing import Pacer
from provisioner.common.port_holder import PortTaken

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
MAX_PAUSED_SCRAPES = 512  # refused scrapes held before their answer at once (then answered at once)
LOOP_LAG = "provisioner_event_loop_lag_seconds"  # read back by the serving benchmark (perf/usage.py)
# No `_created` series beside every counter: they double the series and nothing here reads them.
disable_created_metrics()


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
        # A refused scrape is answered after a pause: the port needs no credential, and a loop
        # that asks again at once would spend the serving loop on refusals (common/pacing.py).
        self._pacer = Pacer(max_paused=MAX_PAUSED_SCRAPES)
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
        self._clusters: Merged | None = None

    # ---- clusters ------------------------------------------------------------------------

    def watch_cluster(self, runtime: ClusterRuntime) -> None:
        """Counts the runtime's session changes and reports its state on every scrape."""
        runtime.observers.append(SessionCounter(self, runtime.core.name).changed)
        meter = VmMeter(runtime)
        runtime.observers.append(meter.changed)
        if self._clusters is None:  # one collector for every cluster of the process (`up` runs three)
            self._clusters = Merged()
            self.registry.register(self._clusters)
        self._clusters.parts.append(ClusterCollector(runtime, meter))

    def leading(self, cluster: str, leading: bool) -> None:
        self.leader.labels(cluster).set(1 if leading else 0)
        if leading:
            self.leader_since.labels(cluster).set(time.time())  # wall time: Prometheus compares it with time()

    def backend(self, backend, cluster: str) -> MeteredBackend:
        return MeteredBackend(backend, self, cluster)

    # ---- the front -------------------------------------------------------------------------

    def watch_front(self, fleet: Fleet, placement: Placement) -> None:
        self.registry.register(FrontCollector(fleet, placement))

    # ---- both ----------------------------------------------------------------------------

    def watch_guard(self, guard: Guard, process: str) -> None:
        """Counts the calls `guard` refuses, by `process` ("front" or a cluster's name) and status
        code (as `outcome`). One collector for every guard of the process, so that each family is
        written once."""
        if not self._guards:
            self.registry.register(GuardCollector(self._guards))
        self._guards[process] = guard

    def watch_catalog(self, feed: CatalogFeed) -> None:
        """The image catalog's refreshes by outcome (changed, unchanged, failed) and its size."""
        self.registry.register(CatalogCollector(feed))

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
            if not status.startswith("200"):
                await self._pacer.pause()
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


class MeteredBackend:
    """The cluster's cloud backend with each call counted and timed; anything else passes through."""

    _METHODS = ("create", "wait_ready", "pull", "wipe", "delete", "list_vms", "health")

    def __init__(self, backend, metrics: Metrics, cluster: str):
        self._backend = backend
        calls, seconds = Children(metrics.cloud_calls), Children(metrics.cloud_seconds)
        for name in self._METHODS:
            if hasattr(backend, name):
                setattr(self, name, self._metered(getattr(backend, name), name, cluster, calls, seconds))

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    @staticmethod
    def _metered(method, name: str, cluster: str, calls: Children, seconds: Children):
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
