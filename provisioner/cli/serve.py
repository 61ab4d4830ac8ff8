"""Starting the processes: one cluster, the front, or the whole local fleet in one process.

This is the process edge: the only place that picks the real clock, opens the store files and
builds cloud backends.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from provisioner.api.guard import Guard, bearer_identity, certificate_identity, stream_caps
from provisioner.api.server import HealthPort, Server
from provisioner.store.audit_log import AuditLog
from provisioner.common.clock import Clock, RealClock
from provisioner.cloud.base import CloudBackend
from provisioner.cluster import service as cluster_service
from provisioner.decide.core import ClusterCore
from provisioner.decide.ids import IdSource
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.config import ClusterConfig, FleetConfig
from provisioner.front import blocks, project_quota
from provisioner.front import service as front_service
from provisioner.front.clusters import ClusterClient
from provisioner.front.placement import Placement
from provisioner.common.gc_freeze import LongLivedFreezer
from provisioner.front.service import Fleet
from provisioner.front.budget_enforcer import BudgetEnforcer
from provisioner.observability.metrics import Metrics
from provisioner.registry.catalog import CatalogFeed
from provisioner.cluster import leader
from provisioner.security import auth, tls
from provisioner.security.pki import TlsFiles, ensure_local_pki, local_files
from provisioner.security.tokens import LOCAL_ISSUER, Issuer, TokenVerifier, ensure_local_key, load_public_key
from provisioner.store import Store, open_store
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import cluster_service_pb2 as cluster_pb

ADMIN_METHODS = [m.name for m in admin_pb.DESCRIPTOR.services_by_name["AdminService"].methods]
CLUSTER_METHODS = [m.name for m in cluster_pb.DESCRIPTOR.services_by_name["ClusterService"].methods]
# At the front: sessions for users and services, AdminService for admins.
FRONT_POLICY = auth.with_admin_service(auth.FRONT_POLICY, auth.Rule.ADMIN, ADMIN_METHODS)
# At a cluster: the front alone, for both of its services (but the AdminService RPCs only the
# front serves, which no caller may call at a cluster).
CLUSTER_POLICY = auth.with_cluster_service(
    auth.with_admin_service(auth.CLUSTER_POLICY, auth.Rule.FRONT,
                            [m for m in ADMIN_METHODS if m not in front_service.FRONT_ONLY_ADMIN_RPCS]),
    CLUSTER_METHODS)

log = logging.getLogger(__name__)


def freeze_startup_heap() -> LongLivedFreezer:
    """Called once a process has started (config, catalog, restored sessions and VMs, servers):
    what is alive now lives as long as the process, so it leaves the collector's generations
    and full collections stop walking it again and again. What accumulates later (a warming
    pool's VMs, sessions) follows it after a full collection that found it all alive
    (provisioner/common/gc_freeze.py), until the freezer returned is exited."""
    gc.collect()
    gc.freeze()
    return LongLivedFreezer().start()


def make_backend(cluster: ClusterConfig, clock: Clock, tracer_provider=None,
                 data_dir: Path | None = None) -> CloudBackend:
    kind = cluster.backend.kind
    if kind == "sim":
        from opentelemetry import trace

        from provisioner.cloud.sim import Inventory, SimCloud

        # Under a data dir the simulated cloud's VMs persist, like a real cloud's, across restarts.
        inventory = Inventory(Path(data_dir) / f"sim-cloud-{cluster.name}.db") if data_dir else None
        return SimCloud(cluster.sim, clock, inventory=inventory,
                        tracer=trace.get_tracer("provisioner.cloud.sim", tracer_provider=tracer_provider),
                        spot_rates={p.name: p.spot_preemptions_per_hour for p in cluster.pools if p.spot or p.spot_tier},
                        spot_tiers=frozenset(p.name for p in cluster.pools if p.spot_tier))
    if kind == "gce":
        from provisioner.cloud.gce import GceBackend

        return GceBackend(cluster, clock)
    from provisioner.cloud.gke import GkeBackend

    return GkeBackend(cluster, clock)


async def catalog_feed(fleet: FleetConfig, metrics: Metrics | None = None) -> tuple[CatalogFeed, asyncio.Task | None]:
    """The images a process serves: images.yaml's synthetic catalog, or the registry's as it is
    now, refreshed in the background task returned (on the wall clock: it is network time)."""
    if fleet.registry is None:
        return CatalogFeed(fleet.catalog), None
    from provisioner.registry.source import open_feed

    feed = await asyncio.to_thread(open_feed, fleet.registry, RealClock())
    if metrics is not None:
        metrics.watch_catalog(feed)
    return feed, asyncio.create_task(feed.run())


@dataclass
class ClusterProcess:
    config: ClusterConfig
    runtime: ClusterRuntime
    server: Server
    store: Store
    lease: leader.Lease
    watchdog: asyncio.Task
    catalog_refresh: asyncio.Task | None = None  # when this process reads the registry itself

    @property
    def address(self) -> str:
        return self.server.address

    async def stop(self, grace_s: float = 5.0, settle_s: float = 0.0) -> None:
        self.watchdog.cancel()
        if self.catalog_refresh is not None:
            self.catalog_refresh.cancel()
        await self.server.stop(grace_s, settle_s)
        await self.runtime.close()
        self.store.close()
        self.lease.release()


def make_lease(database_url: str | None, data_dir: Path, cluster: str) -> leader.Lease:
    """Where the replicas' shared state is: the PostgreSQL database, or beside the SQLite file."""
    if database_url and database_url.startswith(("postgresql://", "postgres://")):
        return leader.PostgresLease(database_url, cluster)
    if database_url and database_url.startswith("sqlite:///"):
        data_dir = Path(database_url.removeprefix("sqlite:///")).parent
    return leader.FileLease(Path(data_dir) / f"cluster-{cluster}.lease")


async def _exit_when_lease_lost(lease: leader.Lease, cluster: str) -> None:
    await leader.watch(lease, cluster)
    os._exit(75)  # crash-only: not one more cloud call once another replica may be acting


# ---- security material ---------------------------------------------------------------------

def tls_leaves(fleet: FleetConfig) -> dict[str, list[str]]:
    """Each process's certificate file name and the names it must carry."""
    sec = fleet.settings.security
    return {"front": [sec.front_tls_name, *sec.front_tls_extra_names], **{f"cluster-{c.name}": [sec.cluster_name(c.name)] for c in fleet.clusters}}


def local_tls(fleet: FleetConfig, data_dir: Path, process: str) -> TlsFiles:
    """The TLS files of `process` ("front" or a cluster's name) from the fleet's throwaway local
    CA under the data dir, made on first use: for a fleet on one machine, with no TLS flags."""
    ensure_local_pki(Path(data_dir) / "tls", tls_leaves(fleet))
    return local_files(Path(data_dir) / "tls", process if process == "front" else f"cluster-{process}")


def token_verifier(fleet: FleetConfig, data_dir: Path) -> TokenVerifier:
    """The issuers the front trusts; the local fleet's signing key is made on first use."""
    issuers = []
    for cfg in fleet.settings.security.issuers:
        key = None
        if cfg.public_key_file is not None:
            path = Path(data_dir) / cfg.public_key_file
            if cfg.issuer == LOCAL_ISSUER and not path.exists():
                ensure_local_key(path.parent)
            key = load_public_key(path)
        issuers.append(Issuer(cfg.issuer, cfg.audience, cfg.identity_claim, frozenset(cfg.default_roles),
                              {k: frozenset(v) for k, v in cfg.roles.items()}, key, cfg.jwks_url))
    return TokenVerifier(issuers)


async def start_cluster(fleet: FleetConfig, name: str, clock: Clock, data_dir: Path, *,
                        address: str | None = None, backend: CloudBackend | None = None,
                        tracer_provider=None, database_url: str | None = None,
                        tls_files: TlsFiles | None = None, metrics: Metrics | None = None,
                        health_port: HealthPort | None = None, feed: CatalogFeed | None = None) -> ClusterProcess:
    """Waits for the cluster's lease (another replica may lead), then restores and serves over
    mutual TLS (`tls_files`, default: the local CA's), answering the front's certificate only.
    `metrics`: the process's registry, fed by this cluster; `health_port` mirrors its status.
    `feed`: the image catalog shared with other parts of this process (default: its own)."""
    cfg = fleet.cluster(name)
    lease = make_lease(database_url, data_dir, name)
    if metrics is not None:
        metrics.leading(name, False)
    await leader.acquire(lease, name)
    if metrics is not None:
        metrics.leading(name, True)
    refresh = None
    if feed is None:
        feed, refresh = await catalog_feed(fleet, metrics)
    store = open_store(database_url, Path(data_dir) / f"cluster-{name}.db")
    core = ClusterCore(cfg, feed.current, fleet.settings.sessions, IdSource(name),
                       priority=fleet.settings.priority, abuse=fleet.settings.abuse)
    backend = backend or make_backend(cfg, clock, tracer_provider, data_dir)
    if metrics is not None:
        metrics.time_store(store, name)
        backend = metrics.backend(backend, name)
    runtime = ClusterRuntime(core, backend, clock, store, tracer_provider)
    if metrics is not None:
        metrics.watch_cluster(runtime)
    await runtime.start()
    feed.subscribe(runtime.set_catalog)
    files = tls_files or local_tls(fleet, data_dir, name)
    guard = Guard(CLUSTER_POLICY, certificate_identity({fleet.settings.security.front_tls_name: frozenset({auth.FRONT})}),
                  AuditLog(store, clock, source=name, retention_s=fleet.settings.security.audit_retention_s))
    if metrics is not None:
        metrics.watch_guard(guard, name)
    server = Server(address or cfg.address,
                    lambda s: cluster_service.register(s, runtime, address or cfg.address), tracer_provider,
                    on_drain=runtime.watchers.end_streams, guard=guard,
                    credentials=tls.server_credentials(files, require_client_cert=True), health_port=health_port)
    await server.start()
    log.info("cluster %s listening on %s", name, server.address)
    return ClusterProcess(cfg, runtime, server, store, lease,
                          asyncio.create_task(_exit_when_lease_lost(lease, name)), refresh)


@dataclass
class FrontProcess:
    fleet: Fleet
    server: Server
    store: Store
    placement: Placement
    sessions: front_service.SessionServicer
    resolver: asyncio.Task
    budgets: asyncio.Task  # the GPU budget sweep (front/budget_enforcer.py)
    catalog_refresh: asyncio.Task | None = None  # when this process reads the registry itself

    @property
    def address(self) -> str:
        return self.server.address

    async def stop(self, grace_s: float = 5.0, settle_s: float = 0.0) -> None:
        await self.server.stop(grace_s, settle_s)
        if self.catalog_refresh is not None:
            self.catalog_refresh.cancel()
        self.resolver.cancel()
        self.budgets.cancel()
        await asyncio.gather(self.resolver, self.budgets, return_exceptions=True)
        await self.fleet.block_pusher.close()
        await self.fleet.quota_relay.close()
        await self.sessions.flush()
        for client in self.fleet.clients.values():
            await client.close()
        # Commits the writes still queued (the group committer drains), off the event loop.
        await asyncio.to_thread(self.store.close)


def _front_fleet(fleet_cfg: FleetConfig, addresses: dict[str, str], link, store, clock: Clock, wall: Clock,
                 tracer_provider, link_interceptors: Sequence) -> Fleet:
    """The front's clients of the clusters, following their capacity, with what it tells them
    in the background: the blocked users, and the project's GPU quota one of them met."""
    security = fleet_cfg.settings.security

    def on_flags(cluster: str):
        async def apply(decisions) -> None:
            if await blocks.apply_all(store, cluster, decisions):  # a new block: the clusters hear of it
                fleet.block_pusher.soon()
        return apply

    def on_connect(cluster: str):
        def connected() -> None:  # the cluster may have restarted: it is told what it may have forgotten
            fleet.block_pusher.soon()
            fleet.quota_relay.connected(cluster)
        return connected

    clients = [ClusterClient(c.name, c.region, addresses[c.name], tracer_provider, link_interceptors,
                             credentials=link, server_name=security.cluster_name(c.name), clock=wall,
                             on_flags=on_flags(c.name), on_connect=on_connect(c.name),
                             on_push=lambda: fleet.quota_relay.pushed(),
                             ceilings={p.name: p.vm_ceiling for p in c.pools})
               for c in fleet_cfg.clusters]
    fleet = Fleet(clients)
    fleet.block_pusher = blocks.Pusher(store, fleet.clients)
    fleet.quota_relay = project_quota.Relay(fleet.clients, clock)
    for c in clients:
        c.start()
    return fleet


async def start_front(fleet_cfg: FleetConfig, clock: Clock, data_dir: Path, *, address: str | None = None,
                      cluster_addresses: dict[str, str] | None = None, tracer_provider=None,
                      link_interceptors: Sequence = (), database_url: str | None = None,
                      tls_files: TlsFiles | None = None, plaintext: bool = False,
                      plaintext_anywhere: bool = False, metrics: Metrics | None = None,
                      health_port: HealthPort | None = None, feed: CatalogFeed | None = None) -> FrontProcess:
    """Serves over TLS (`tls_files`, default: the local CA's; `plaintext` only behind something
    that terminates TLS) and dials the clusters over mutual TLS with the same certificate.
    `link_interceptors` sit on the front's channels to the clusters (tests inject faults there)."""
    addresses = {c.name: c.address for c in fleet_cfg.clusters} | (cluster_addresses or {})
    files = tls_files or local_tls(fleet_cfg, data_dir, "front")
    ca, chain, key = files.read()
    link = tls.channel_credentials(ca, chain, key)
    security = fleet_cfg.settings.security
    # Network time (commit_by, call deadlines, the breaker) runs at wall speed, whatever `clock` does.
    wall = RealClock()
    store = open_store(database_url, Path(data_dir) / "front.db")
    store.writer.start()  # the front's durable writes are all group-committed
    fleet = _front_fleet(fleet_cfg, addresses, link, store, clock, wall, tracer_provider, link_interceptors)
    if metrics is not None:
        metrics.time_store(store, "front")
    address = address or fleet_cfg.settings.front.address
    sessions = front_service.SessionServicer(fleet_cfg, fleet, store, clock, wall)
    refresh = None
    if feed is None:
        feed, refresh = await catalog_feed(fleet_cfg, metrics)
    sessions.catalog = feed.current
    feed.subscribe(functools.partial(setattr, sessions, "catalog"))
    if metrics is not None:
        metrics.watch_front(fleet, sessions.placement)
    guard = Guard(FRONT_POLICY, bearer_identity(token_verifier(fleet_cfg, data_dir)), AuditLog(store, clock, retention_s=security.audit_retention_s),
                  stream_caps(dict(security.max_streams)), pacer=sessions.pacer)
    if metrics is not None:
        metrics.watch_guard(guard, "front")
    server = Server(address, lambda s: front_service.register(s, sessions), tracer_provider,
                    on_drain=sessions.end_streams, guard=guard,
                    credentials=None if plaintext else tls.server_credentials(files, require_client_cert=False),
                    plaintext_anywhere=plaintext_anywhere, health_port=health_port)
    await server.start()
    log.info("front listening on %s", server.address)
    return FrontProcess(fleet, server, store, sessions.placement, sessions,
                        asyncio.create_task(sessions.placement.run_resolver()),
                        asyncio.create_task(BudgetEnforcer(sessions.weeks, fleet).run()), refresh)


@dataclass
class LocalFleet:
    front: FrontProcess
    clusters: list[ClusterProcess] = field(default_factory=list)
    catalog: CatalogFeed | None = None
    catalog_refresh: asyncio.Task | None = None

    async def stop(self, grace_s: float = 5.0) -> None:
        if self.catalog_refresh is not None:
            self.catalog_refresh.cancel()
        await self.front.stop(grace_s)
        await asyncio.gather(*(c.stop(grace_s) for c in self.clusters))


async def start_local_fleet(fleet_cfg: FleetConfig, clock: Clock, data_dir: Path, *, front_address: str | None = None,
                            cluster_port_base: int | None = None, tracer_provider=None,
                            database_url: str | None = None, metrics: Metrics | None = None,
                            link_interceptors: Sequence = ()) -> LocalFleet:
    """Every cluster of the fleet plus the front, in this process, on loopback.

    `cluster_port_base` overrides the configured cluster addresses (0: any free ports);
    `link_interceptors` as for start_front.
    """
    feed, refresh = await catalog_feed(fleet_cfg, metrics)  # one catalog for every part of the process
    clusters = []
    for i, c in enumerate(fleet_cfg.clusters):
        address = None if cluster_port_base is None else \
            f"127.0.0.1:{cluster_port_base + i if cluster_port_base else 0}"
        clusters.append(await start_cluster(fleet_cfg, c.name, clock, data_dir, address=address,
                                            tracer_provider=tracer_provider, database_url=database_url,
                                            metrics=metrics, feed=feed))
    front = await start_front(fleet_cfg, clock, data_dir, address=front_address, feed=feed,
                              cluster_addresses={p.config.name: p.address for p in clusters},
                              tracer_provider=tracer_provider, database_url=database_url, metrics=metrics,
                              link_interceptors=link_interceptors)
    await front.fleet.wait_until_ready(timeout_s=10.0)
    return LocalFleet(front, clusters, feed, refresh)
