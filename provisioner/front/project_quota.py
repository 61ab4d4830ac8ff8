"""The project-wide GPU quota, shared by every cluster: what one cluster learns, the fronts tell the
others.

Google's GPUS_ALL_REGIONS is one quota of the project, whatever the region: once one cluster's
insert is refused for it, every other cluster's would be too. The cluster that learns it stops
inserting and starting GPU VMs for a while (decide/zone_memory.py) and says so in its capacity
report (ClusterCapacity.project_quota); each front tells every cluster whose own report holds an
earlier end (ClusterService.SetProjectQuota), and routes creates knowing that no cluster can add a
VM (front/router.py).

No front keeps the quota: what it knows is the clusters' last reports. So replicas agree, each
telling the same thing (a cluster keeps the later end, so twice or in any order is harmless); a
restarted front learns it from the first pushes of every cluster that holds it; a restarted
cluster is told again when its capacity stream starts. It is lost only if every cluster that
held it restarts within the memory, and then it costs one more refused insert.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from provisioner.api import convert
from provisioner.api.status import RemoteError
from provisioner.common.clock import Clock
from provisioner.decide.zone_memory import ProjectQuota
from provisioner.front.attempts import ATTEMPT_TIMEOUT_S
from provisioner.front.clusters import ClusterClient
from provisioner.front.coalesced import Coalesced
from provisioner.front.retry import call
from provisioner.v1 import cluster_service_pb2 as cluster_pb

log = logging.getLogger(__name__)


def reported(c: ClusterClient) -> float:
    """When the quota `c` last reported ends (0: it reports none)."""
    cap = c.capacity
    if cap is None or not cap.HasField("project_quota"):
        return 0.0
    return cap.project_quota.until.ToNanoseconds() / 1e9


def current(clients: Iterable[ClusterClient], now: float) -> ProjectQuota | None:
    """The project-wide quota with the latest end any cluster reports, while it lasts."""
    best = max(clients, key=reported, default=None)
    if best is None or reported(best) <= now:
        return None
    return convert.project_quota_from_pb(best.capacity.project_quota)


class Relay(Coalesced):
    """Tells the clusters, in the background, the quota another one reported."""

    def __init__(self, clients: dict[str, ClusterClient], clock: Clock):
        """`clients` by name (Fleet.clients); `clock` the fleet's (model) time, as the ends are."""
        self.clients, self.clock = clients, clock
        self._told: dict[str, float] = {}  # cluster -> the end it was told (not to tell it again and again)
        super().__init__(self.tell, "tell the clusters the project's GPU quota")

    def connected(self, cluster: str) -> None:
        """`cluster`'s capacity stream started: it may have restarted, and forgotten."""
        self._told.pop(cluster, None)
        self.soon()

    def pushed(self) -> None:
        """A capacity push was taken: tells the clusters that do not hold the latest quota yet."""
        if self._due(self.clock.now()):
            self.soon()

    def _due(self, now: float) -> list[ClusterClient]:
        quota = current(self.clients.values(), now)
        if quota is None:
            return []
        return [c for c in self.clients.values()
                if c.healthy and reported(c) < quota.until and self._told.get(c.name) != quota.until]

    async def tell(self) -> None:
        now = self.clock.now()
        quota, due = current(self.clients.values(), now), self._due(now)
        if quota is None or not due:
            return
        request = cluster_pb.SetProjectQuotaRequest(quota=convert.project_quota_to_pb(quota))
        results = await asyncio.gather(*(call(c.sessions.SetProjectQuota, request, ATTEMPT_TIMEOUT_S) for c in due),
                                       return_exceptions=True)
        for c, result in zip(due, results):
            if isinstance(result, RemoteError):
                log.warning("cluster %s was not told the project's %s quota is exhausted; its next push or stream "
                            "start tells it: %s", c.name, quota.metric, result.code.name)
            elif isinstance(result, BaseException):
                raise result
            else:
                self._told[c.name] = quota.until
