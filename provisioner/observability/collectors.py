"""What a scrape reads: the collectors of a cluster's, the front's, the guards' and the catalog's
state (read at scrape time), and the counters fed from the session changes a cluster applies.
provisioner/observability/metrics.py registers them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from provisioner.decide.autoscale import desired_vms
from provisioner.model.records import Session
from provisioner.model.states import VM_ACTIVE, SessionState, VmState

if TYPE_CHECKING:
    from provisioner.api.guard import Guard
    from provisioner.cluster.runtime import ClusterRuntime
    from provisioner.front.placement import Placement
    from provisioner.front.service import Fleet
    from provisioner.observability.metrics import Metrics
    from provisioner.registry.catalog import CatalogFeed

_LIVE_SESSION_STATES = [s for s in SessionState if s not in (SessionState.STOPPED, SessionState.FAILED)]
_BREAKER_STATES = ("closed", "open", "half-open")


class Children:
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


class SessionCounter:
    """Feeds the counters from changed sessions: each history entry is seen once (the runtime
    hands over every changed session after each event; several changes may come at once)."""

    def __init__(self, metrics: Metrics, cluster: str):
        self.cluster = cluster
        self.created, self.ended = Children(metrics.sessions_created), Children(metrics.sessions_ended)
        self.starts, self.to_running = Children(metrics.session_starts), Children(metrics.time_to_running)
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


class VmMeter:
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


class Merged(Collector):
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


class ClusterCollector(Collector):
    """A cluster's state at scrape time: sessions and queues, VMs, the autoscaler's aim, cost."""

    def __init__(self, runtime: ClusterRuntime, meter: VmMeter):
        self.rt, self.meter = runtime, meter

    def collect(self):
        core, now = self.rt.core, self.rt.clock.now()
        c, f = core.name, _cluster_families()
        f["draining"].add_metric([c], 1 if core.draining else 0)
        self.meter.changed()
        for name in core.pools:
            f["vm_seconds"].add_metric([c, name], self.meter.vm_seconds[name])
            f["spent"].add_metric([c, name], self.meter.cost[name])
        counts, waiting = _live_sessions(core, now)
        for name, pool in core.pools.items():
            for kind in ("interactive", "batch"):
                for state in _LIVE_SESSION_STATES:
                    f["sessions"].add_metric([c, name, kind, state.value], counts.get((name, kind, state.value), 0))
            f["queue"].add_metric([c, name], len(pool.queue))
            f["oldest"].add_metric([c, name], waiting.get(name, 0.0))
            self._pool_vms(f, core, c, name, pool, now)
        yield from f.values()

    def _pool_vms(self, f: dict, core, c: str, name: str, pool, now: float) -> None:
        for state in VmState:
            if state is not VmState.DELETED:
                f["vms"].add_metric([c, name, state.value], pool.count.get(state, 0))
        f["unhealthy"].add_metric([c, name], sum(1 for vm in pool.vms.values() if not vm.healthy))
        held: dict[str, int] = {}
        for vm in core.assignable(pool):
            for image in vm.cache.images(core.catalog):
                held[image] = held.get(image, 0) + 1
        for image, n in sorted(held.items()):
            f["by_image"].add_metric([c, name, image], n)
        f["desired"].add_metric([c, name], desired_vms(core.snapshot(pool)))
        f["actual"].add_metric([c, name], len(pool.vms) - pool.count.get(VmState.DELETING, 0))
        f["cost"].add_metric([c, name], self.meter.billed[name] * pool.config.running_usd_per_h)
        for zone in pool.config.zones:
            f["stocked"].add_metric([c, name, zone], 1 if pool.stocked_out_until.get(zone, 0) > now else 0)


def _live_sessions(core, now: float) -> tuple[dict[tuple[str, str, str], int], dict[str, float]]:
    """Live sessions counted by (pool, kind, state), and each pool's longest wait in the queue."""
    counts: dict[tuple[str, str, str], int] = {}
    waiting: dict[str, float] = {}
    for s in core.sessions.values():
        if s.terminal or s.state is None:
            continue
        key = (s.pool, s.spec.kind.value, s.state.value)
        counts[key] = counts.get(key, 0) + 1
        if s.state is SessionState.QUEUED:
            waiting[s.pool] = max(waiting.get(s.pool, 0.0), now - s.created_at)
    return counts, waiting


def _cluster_families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    gauge, counter = GaugeMetricFamily, CounterMetricFamily
    pool = ["cluster", "pool"]
    return {
        "sessions": gauge("provisioner_sessions", "Live sessions by state and kind.",
                          labels=["cluster", "pool", "kind", "state"]),
        "queue": gauge("provisioner_queue_length", "Sessions waiting for a VM.", labels=pool),
        "oldest": gauge("provisioner_queue_oldest_wait_seconds",
                        "How long the longest-waiting queued session has waited (model seconds).", labels=pool),
        "vms": gauge("provisioner_vms", "VMs by state (deleted ones not counted).", labels=["cluster", "pool", "state"]),
        "unhealthy": gauge("provisioner_vms_unhealthy", "VMs whose last health check failed.", labels=pool),
        "by_image": gauge("provisioner_warm_vms_with_image", "Assignable warm VMs holding each image version.",
                          labels=["cluster", "pool", "image"]),
        "desired": gauge("provisioner_autoscaler_desired_vms",
                         "VMs the autoscaler wants now (demand plus warm, within min and max).", labels=pool),
        "actual": gauge("provisioner_autoscaler_actual_vms", "VMs the pool has or is making (all but deleting ones).",
                        labels=pool),
        "cost": gauge("provisioner_pool_cost_dollars_per_hour", "What the pool's billed VMs cost now.", labels=pool),
        "stocked": gauge("provisioner_zone_stocked_out", "1 while a zone is skipped after a stockout.",
                         labels=["cluster", "pool", "zone"]),
        "draining": gauge("provisioner_cluster_draining", "1 while the cluster is drained.", labels=["cluster"]),
        "vm_seconds": counter("provisioner_vm_seconds", "VM-seconds billed (model time), by pool.", labels=pool),
        "spent": counter("provisioner_vm_cost_dollars", "What the pool's VMs have cost (model time).", labels=pool),
    }


class CatalogCollector(Collector):
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


class FrontCollector(Collector):
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


class GuardCollector(Collector):
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
