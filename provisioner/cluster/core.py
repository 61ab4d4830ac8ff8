"""One cluster's logic: sessions, VMs, queue, culling, autoscaling. No I/O, no clock, no asyncio.

The core is fed events (a request, "VM booted", "pull done", a tick) with the time they happen,
and answers with commands for the cloud (launch, pull, wipe, delete). A thin shell carries the
commands out and feeds the results back: the live cluster service does it with real RPCs and a
cloud backend, the simulator with a virtual clock. Both run exactly this code.

After each event the shell takes `take_commands()` and `take_changes()` (the sessions and VMs to
persist and to tell watchers about) before acting.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from dataclasses import dataclass, field

from provisioner.decide.assignment import choose_vm, queue_order
from provisioner.decide.autoscale import (
    SCALE_DOWN_IDLE_S,
    PREDICTIVE_STABILIZATION_S,
    STABILIZATION_S,
    STOCKOUT_MEMORY_S,
    PoolSnapshot,
    WindowMax,
    desired_vms,
    pick_deletions,
    pick_zone,
    plan_scale,
    zones_available,
)
from provisioner.cloud.base import CloudFailure, HealthReport
from provisioner.decide.reconcile import Plan
from provisioner.config import ClusterConfig, PoolConfig, SessionsConfig
from provisioner.errors import FailedPrecondition, NotFound, quote
from provisioner.decide.forecast import Forecast
from provisioner.decide.images import ImageCatalog, Layer, LayerCache
from provisioner.model import Session, SessionKind, SessionSpec, StartKind, Vm
from provisioner.decide.policy import merge_policy
from provisioner.decide.prewarm import holdable, next_pull, rank_images
from provisioner.decide.states import VM_ACTIVE, SessionState, VmState
from provisioner.validation import validate_spec

S, V = SessionState, VmState

# Demand counts per image decay with this half-life, so the warm mix follows recent requests.
DEMAND_HALF_LIFE_S = 6 * 3600.0
# Each of the newest releases counts as this much demand, so each is kept on an idle VM.
RECENT_RELEASES = 40
RECENT_RELEASE_DEMAND = 0.25
# How often the image ranking is recomputed from the decaying demand.
RANKING_REFRESH_S = 300.0
# Idle VMs re-follow the ranking when its set of images changes or its order changes among the
# first few (what a fresh VM pulls first); reshuffles further down are not worth a rescan.
RANKING_ORDER_MATTERS = 3
# How often the predictive autoscaler redoes its forecast.
FORECAST_REFRESH_S = 60.0
# A pool whose VMs and queue did not change is reconsidered this often (for what only time
# changes: VMs idle long enough to go, the peak window, the forecast).
AUTOSCALE_QUIET_S = 30.0
# Seconds from "create" to the cloud having the VM, added to boot time in estimates.
CREATE_ESTIMATE_S = 5.0


# Commands for the cloud. `session_id` links the work to the request's trace.
@dataclass(frozen=True, slots=True)
class Launch:
    vm_id: str
    pool: str
    zone: str
    images: tuple[str, ...] = ()
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class Pull:
    vm_id: str
    zone: str
    image: str
    layers: tuple[Layer, ...]
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class Wipe:
    vm_id: str
    zone: str
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class Delete:
    vm_id: str
    zone: str
    session_id: str = ""


Command = Launch | Pull | Wipe | Delete


class IdSource:
    """Session and VM ids. Live clusters draw them from the OS's CSPRNG, so an id cannot be
    guessed from another; a seeded source (replays, tests) names things the same way each run."""

    def __init__(self, cluster: str, seed: int | None = None):
        self.cluster = cluster
        self._rng = random.SystemRandom() if seed is None else random.Random(seed)

    def _suffix(self) -> str:
        return f"{self._rng.getrandbits(40):010x}"

    def session(self) -> str:
        # The id names its home cluster, so the front routes Get/Stop/Watch without a lookup.
        return f"{self.cluster}.s-{self._suffix()}"

    def vm(self, pool: str) -> str:
        # GCE instance names: lowercase letters, digits and dashes, at most 63 characters.
        return f"{self.cluster}-{pool}-{self._suffix()}"[:63]


def cluster_of(session_id: str) -> str:
    return session_id.split(".", 1)[0] if "." in session_id else ""


@dataclass
class PoolPolicy:
    min_vms: int
    max_vms: int
    headroom_fraction: float
    autoscaler: str
    recycle: bool
    warm_vms: int
    wait_probability: float

    @classmethod
    def of(cls, p: PoolConfig) -> PoolPolicy:
        return cls(p.min_vms, p.max_vms, p.headroom_fraction, p.autoscaler, p.recycle, p.warm_vms,
                   p.wait_probability)


@dataclass
class PoolState:
    """One pool's VMs and queue, with counts and indexes kept as VMs change (read every tick)."""

    config: PoolConfig
    policy: PoolPolicy
    # Dicts, not sets: iteration follows insertion, so runs are the same in every process.
    vms: dict[str, Vm] = field(default_factory=dict)  # every VM of the pool not yet deleted
    queue: dict[str, None] = field(default_factory=dict)  # queued session ids
    ready: dict[str, Vm] = field(default_factory=dict)  # assignable: warm and healthy
    count: dict[VmState, int] = field(default_factory=lambda: defaultdict(int))  # VMs by state
    per_zone: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    stocked_out_until: dict[str, float] = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)  # decaying request counts by image
    demand_at: float = 0.0
    peak: WindowMax = field(default_factory=lambda: WindowMax(STABILIZATION_S))  # of VMs wanted
    forecast: Forecast = field(default_factory=Forecast)
    forecast_warm: int = 0
    forecast_at: float = -FORECAST_REFRESH_S
    changed: bool = True  # VMs or queue changed since the autoscaler last looked
    scaled_at: float = -AUTOSCALE_QUIET_S
    ranking: tuple[str, ...] = ()  # images idle VMs should hold, best first (prewarm.holdable)
    keep_layers: frozenset[str] = frozenset()  # their layers, spared by eviction while others exist
    ranking_gen: int = 0  # bumped when idle VMs must re-follow the ranking
    ranking_at: float = -RANKING_REFRESH_S


class ClusterCore:
    def __init__(self, cluster: ClusterConfig, catalog: ImageCatalog, sessions: SessionsConfig,
                 ids: IdSource | None = None):
        self.config = cluster
        self.name = cluster.name
        self.catalog = catalog
        self.sessions_config = sessions
        self.ids = ids or IdSource(cluster.name)
        self.pools = {p.name: PoolState(p, PoolPolicy.of(p)) for p in cluster.pools}
        self.sessions: dict[str, Session] = {}
        self.by_request: dict[str, str] = {}  # request key (SessionSpec.key) -> session id
        self.vms: dict[str, Vm] = {}
        self.draining = False
        self._commands: list[Command] = []
        # (time, session id) when a running session may need culling; checked lazily by the tick.
        self._deadlines: list[tuple[float, str]] = []
        self._age = {v: i for i, v in enumerate(catalog.newest(len(catalog)))}
        # vm id -> (ranking_gen, position in the ranking up to which the VM holds every image).
        self._filled: dict[str, tuple[int, int]] = {}
        self._changed_sessions: dict[str, Session] = {}
        self._changed_vms: dict[str, Vm] = {}

    def restore(self, sessions: list[Session], vms: list[Vm], now: float) -> None:
        """Rebuilds state from the store and re-issues the cloud work that was under way.

        Every command is idempotent (VMs are named by our id), so repeating one that had
        finished before the crash is harmless.
        """
        for vm in vms:
            if vm.pool not in self.pools:
                continue
            self.vms[vm.id] = vm
            self._count_in(self.pools[vm.pool], vm)
        for s in sessions:
            self.sessions[s.id] = s
            self.by_request[s.spec.key] = s.id
            if s.state is S.QUEUED:
                self.pools[s.pool].queue[s.id] = None
            elif s.state is S.RUNNING:
                self._watch_deadline(s)
        for vm in self.vms.values():
            if vm.state in (V.CREATING, V.BOOTING):
                self._commands.append(Launch(vm.id, vm.pool, vm.zone, (), vm.reserved_for))
            elif vm.state is V.RECYCLING:
                self._commands.append(Wipe(vm.id, vm.zone, vm.session_id))
            elif vm.state is V.DELETING:
                self._commands.append(Delete(vm.id, vm.zone, vm.session_id))
            elif vm.pulling:
                missing = tuple(vm.cache.missing(vm.pulling, self.catalog))
                self._commands.append(Pull(vm.id, vm.zone, vm.pulling, missing, vm.session_id))

    # ---- outputs -------------------------------------------------------------------------

    def take_commands(self) -> list[Command]:
        out, self._commands = self._commands, []
        return out

    def take_changes(self) -> tuple[list[Session], list[Vm]]:
        s, v = list(self._changed_sessions.values()), list(self._changed_vms.values())
        self._changed_sessions, self._changed_vms = {}, {}
        return s, v

    def _session_changed(self, s: Session) -> None:
        s.revision += 1
        self._changed_sessions[s.id] = s

    def _vm_changed(self, vm: Vm) -> None:
        vm.revision += 1
        self._changed_vms[vm.id] = vm

    def _set_session(self, s: Session, state: SessionState, reason: str, now: float) -> None:
        s.to(state, reason, now)
        self._session_changed(s)

    def _set_vm(self, vm: Vm, state: VmState, reason: str, now: float) -> None:
        pool = self.pools[vm.pool]
        if vm.state is not None:
            self._count_out(pool, vm)
        vm.to(state, reason, now)
        self._vm_changed(vm)
        if state is V.DELETED:
            del self.vms[vm.id]
            self._filled.pop(vm.id, None)
        else:
            self._count_in(pool, vm)

    @staticmethod
    def _count_in(pool: PoolState, vm: Vm) -> None:
        pool.changed = True
        pool.vms[vm.id] = vm
        pool.count[vm.state] += 1
        pool.per_zone[vm.zone] += 1
        if vm.state is V.WARM and vm.healthy:
            pool.ready[vm.id] = vm

    @staticmethod
    def _count_out(pool: PoolState, vm: Vm) -> None:
        pool.changed = True
        del pool.vms[vm.id]
        pool.count[vm.state] -= 1
        pool.per_zone[vm.zone] -= 1
        pool.ready.pop(vm.id, None)

    # ---- requests ------------------------------------------------------------------------

    def validate(self, spec: SessionSpec) -> str:
        """Checks a request against this cluster; returns the resolved image version."""
        return validate_spec(spec, self.pools, self.catalog, self.sessions_config.max_runtime_limit_s)

    def allocate(self, spec: SessionSpec, now: float, trace_context: dict[str, str] | None = None) -> Session:
        """Creates the session (idempotent by request id) and places it at once if it can."""
        if existing := self.by_request.get(spec.key):
            return self.sessions[existing]
        image = self.validate(spec)
        if self.draining:
            raise FailedPrecondition(f"cluster {self.name} is draining")
        if spec.max_runtime_s:
            max_runtime = spec.max_runtime_s
        elif spec.kind is SessionKind.BATCH:
            max_runtime = self.sessions_config.batch_max_runtime_s
        else:
            max_runtime = self.sessions_config.max_runtime_limit_s
        s = Session(
            id=self._new_session_id(), spec=spec, cluster=self.name, pool=spec.accelerator, image=image,
            created_at=now, last_activity_at=now, idle_timeout_s=self.sessions_config.idle_timeout_s,
            max_runtime_s=max_runtime, trace_context=dict(trace_context or {}),
        )
        self.sessions[s.id] = s
        self.by_request[spec.key] = s.id
        pool = self.pools[s.pool]
        self._count_demand(pool, image, now)
        pool.forecast.arrival(now)
        if not self._place(s, now):
            self._enqueue(s, "waiting for capacity: the pool is at its maximum or stocked out", now)
        return s

    def _new_session_id(self) -> str:
        # 40 random bits: a collision is rare, not impossible, and would merge two users' records.
        while (sid := self.ids.session()) in self.sessions:
            pass
        return sid

    def get(self, session_id: str, user_id: str = "") -> Session:
        """The session; with `user_id`, only if it is that user's (another user's session is
        reported as missing, not as forbidden, so its existence is not revealed)."""
        s = self.sessions.get(session_id)
        if s is not None and (not user_id or s.spec.user_id == user_id):
            return s
        raise NotFound(f"session {quote(session_id)} not found", field="session_id")

    def get_by_request(self, key: str) -> Session:
        if sid := self.by_request.get(key):
            return self.sessions[sid]
        raise NotFound("no session for this request id", field="request_id")

    def touch(self, session_id: str, now: float, user_id: str = "") -> Session:
        s = self.get(session_id, user_id)
        if not s.terminal:
            s.last_activity_at = now
            self._session_changed(s)
        return s

    def stop(self, session_id: str, reason: str, now: float, user_id: str = "") -> Session:
        """Idempotent: a session already stopping or ended is returned as it is."""
        s = self.get(session_id, user_id)
        if s.terminal or s.state is S.STOPPING:
            return s
        reason = reason or "stopped by the user"
        if s.state is S.QUEUED:
            del self.pools[s.pool].queue[s.id]
            self._end(s, S.STOPPED, reason, now)
            self._renumber_queue(self.pools[s.pool], now)
        elif s.state is S.PROVISIONING:
            vm = self.vms.get(s.vm_id)
            if vm is not None:
                vm.reserved_for = ""  # the VM joins the pool when it boots
                self._vm_changed(vm)
            s.vm_id = ""
            self._end(s, S.STOPPED, reason, now)
        else:
            self._set_session(s, S.STOPPING, reason, now)
            self._release(self.vms[s.vm_id], now)
        return s

    def forget(self, session_id: str) -> None:
        """Drops an ended session from memory (its record stays in the store)."""
        s = self.get(session_id)
        if not s.terminal:
            raise FailedPrecondition(f"session {session_id} is {s.state}; only ended sessions can be forgotten")
        del self.sessions[session_id]
        if self.by_request.get(s.spec.key) == session_id:
            del self.by_request[s.spec.key]

    def discard(self, key: str, reason: str, now: float) -> Session | None:
        """Stops the session made for request `key`, which the front never acknowledged. Its
        record stays (ended, with the reason and any GPU time it used), so billing and quotas see
        it and the request key keeps naming it. None if there was none."""
        sid = self.by_request.get(key)
        if sid is None:
            return None
        return self.stop(sid, f"discarded: {reason}", now)

    def _end(self, s: Session, state: SessionState, reason: str, now: float) -> None:
        s.ended_at = now
        self._set_session(s, state, reason, now)

    # ---- placement -----------------------------------------------------------------------

    def assignable(self, pool: PoolState) -> list[Vm]:
        """Assignable VMs: warm and healthy, even while a prewarm pull runs (a session beats it)."""
        return list(pool.ready.values())

    def _idle_settled(self, pool: PoolState) -> list[Vm]:
        """Idle warm VMs with no pull under way: candidates for prewarming and scale-down."""
        return [vm for vm in pool.ready.values() if not vm.pulling]

    def _place(self, s: Session, now: float) -> bool:
        """Gives the session a warm VM or launches one; False when it must wait."""
        pool = self.pools[s.pool]
        choice = choose_vm(s.image, reversed(pool.ready.values()), self.catalog)  # newest warm first
        if choice.vm_id:
            vm = self.vms[choice.vm_id]
            self._assign(s, vm, choice.start, now)
            return True
        if not self._can_launch(pool, now):
            return False
        vm = self._launch(pool, now, images=(s.image,), reserved_for=s)
        if vm is None:
            return False
        s.vm_id = vm.id
        s.start = StartKind.COLD
        s.estimated_ready_at = now + self._cold_start_s(s.image)
        self._set_session(s, S.PROVISIONING, f"creating VM {vm.id} in {vm.zone}", now)
        return True

    def _assign(self, s: Session, vm: Vm, start: StartKind, now: float) -> None:
        vm.session_id, vm.reserved_for = s.id, ""
        self._set_vm(vm, V.ASSIGNED, f"assigned to session {s.id}", now)
        s.vm_id, s.endpoint, s.start = vm.id, vm.endpoint, start
        missing = tuple(vm.cache.missing(s.image, self.catalog))
        if missing:
            total = sum(layer.size_bytes for layer in missing)
            s.pull_bytes_total, s.pull_bytes_done = total, 0
            s.estimated_ready_at = now + total / self._bandwidth()
            self._set_session(s, S.PULLING_IMAGE, f"pulling {len(missing)} layers ({_gb(total)}) on {vm.id}", now)
            # A prewarm of this very image is already under way: wait for it. Otherwise this pull
            # supersedes whatever prewarm the VM was doing.
            if vm.pulling != s.image:
                vm.pulling = s.image
                self._commands.append(Pull(vm.id, vm.zone, s.image, missing, s.id))
        else:
            vm.cache.touch(s.image, self.catalog, now)
            self._running(s, vm, now)

    def _running(self, s: Session, vm: Vm, now: float) -> None:
        s.ready_at = s.last_activity_at = s.estimated_ready_at = now
        s.endpoint = vm.endpoint
        self._watch_deadline(s)
        how = {StartKind.WARM: "warm VM with the image", StartKind.PARTIAL: "warm VM after a partial pull",
               StartKind.COLD: "new VM"}[s.start or StartKind.COLD]
        self._set_session(s, S.RUNNING, f"running on {how} {vm.id}", now)

    def _enqueue(self, s: Session, reason: str, now: float) -> None:
        pool = self.pools[s.pool]
        pool.queue[s.id] = None
        s.vm_id = ""
        s.estimated_ready_at = now + self._cold_start_s(s.image)
        self._set_session(s, S.QUEUED, reason, now)
        self._renumber_queue(pool, now)

    def _renumber_queue(self, pool: PoolState, now: float) -> None:
        for pos, s in enumerate(self._queue_order(pool), start=1):
            if s.queue_position != pos:
                s.queue_position = pos
                self._session_changed(s)

    def _queue_order(self, pool: PoolState) -> list[Session]:
        holding: dict[str, int] = defaultdict(int)
        for vm in pool.vms.values():
            if (owner := self.sessions.get(vm.session_id or vm.reserved_for)) is not None:
                holding[owner.spec.user_id] += 1
        return queue_order([self.sessions[i] for i in pool.queue], holding)

    def _dispatch_queue(self, pool: PoolState, now: float) -> None:
        if not pool.queue:
            return
        for s in self._queue_order(pool):
            if not self._place(s, now):
                break
            del pool.queue[s.id]
        self._renumber_queue(pool, now)

    # ---- VMs -----------------------------------------------------------------------------

    @staticmethod
    def _pool_total(pool: PoolState) -> int:
        return sum(pool.count[state] for state in VM_ACTIVE)

    def _can_launch(self, pool: PoolState, now: float) -> bool:
        return (self._pool_total(pool) < pool.policy.max_vms
                and zones_available(pool.config.zones, pool.stocked_out_until, now))

    def _launch(self, pool: PoolState, now: float, images: tuple[str, ...] = (),
                reserved_for: Session | None = None) -> Vm | None:
        zone = pick_zone(pool.config.zones, pool.stocked_out_until, pool.per_zone, now)
        if zone is None:
            return None
        vm = Vm(id=self.ids.vm(pool.config.name), cluster=self.name, pool=pool.config.name, zone=zone,
                cache=LayerCache(pool.config.disk_cache_bytes), created_at=now,
                reserved_for=reserved_for.id if reserved_for else "")
        self.vms[vm.id] = vm
        why = f"cold start for {reserved_for.id}" if reserved_for else "filling the warm pool"
        self._set_vm(vm, V.CREATING, why, now)
        self._commands.append(Launch(vm.id, pool.config.name, zone, images, reserved_for.id if reserved_for else ""))
        return vm

    def _release(self, vm: Vm, now: float) -> None:
        """After a session: wipe and keep, or delete, per pool policy. Never reuse unwiped."""
        pool = self.pools[vm.pool]
        pool.forecast.departure(now)
        if pool.policy.recycle and vm.healthy:
            self._set_vm(vm, V.RECYCLING, f"wiping after session {vm.session_id}", now)
            self._commands.append(Wipe(vm.id, vm.zone, vm.session_id))
        else:
            why = "unhealthy" if not vm.healthy else "pool deletes VMs after use"
            self._delete(vm, why, now)

    def _delete(self, vm: Vm, reason: str, now: float) -> None:
        self._set_vm(vm, V.DELETING, reason, now)
        self._commands.append(Delete(vm.id, vm.zone, vm.session_id))

    def vm_created(self, vm_id: str, endpoint: str, now: float) -> None:
        vm = self.vms[vm_id]
        vm.endpoint = endpoint
        self._set_vm(vm, V.BOOTING, "the cloud accepted the create; booting", now)

    def vm_ready(self, vm_id: str, now: float, endpoint: str = "") -> None:
        """`endpoint`: where the booted VM is reached, when the cloud gives it only now."""
        vm = self.vms[vm_id]
        vm.endpoint = endpoint or vm.endpoint
        self._set_vm(vm, V.WARM, "booted", now)
        s = self.sessions.get(vm.reserved_for)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm.id:
            self._assign(s, vm, StartKind.COLD, now)
            return
        vm.reserved_for = ""
        self._after_vm_freed(vm, now)

    def launch_failed(self, vm_id: str, failure: CloudFailure, now: float) -> None:
        """The create or the boot failed. Remember a stocked-out zone; requeue the session."""
        vm = self.vms[vm_id]
        pool = self.pools[vm.pool]
        if failure.zone_exhausted:
            # The cloud's word on where (a GKE node pool has its own zone), else where we asked.
            pool.stocked_out_until[failure.zone or vm.zone] = now + STOCKOUT_MEMORY_S
        created = vm.state is V.BOOTING
        self._set_vm(vm, V.FAILED, f"{failure.code}: {failure.message}", now)
        if created:  # something may be left in the cloud
            self._delete(vm, "clean up after a failed boot", now)
        else:
            self._set_vm(vm, V.DELETED, "nothing was created", now)
        s = self.sessions.get(vm.reserved_for)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm_id:
            if not self._place(s, now):
                self._enqueue(s, f"VM creation failed in {vm.zone} ({failure.code}); waiting for capacity", now)

    def pull_progress(self, vm_id: str, image: str, bytes_done: int, now: float) -> None:
        vm = self.vms.get(vm_id)
        if vm is None or vm.pulling != image:
            return  # a superseded prewarm
        s = self.sessions.get(vm.session_id)
        if s is not None and s.state is S.PULLING_IMAGE:
            s.pull_bytes_done = bytes_done
            remaining = max(0, s.pull_bytes_total - bytes_done)
            s.estimated_ready_at = now + remaining / self._bandwidth()
            self._session_changed(s)

    def pull_done(self, vm_id: str, image: str, now: float) -> None:
        vm = self.vms.get(vm_id)
        if vm is None:
            return
        # The layers are on disk, even if superseded; eviction spares the pool's top images.
        if vm.cache.add_layers(self.catalog.layers(image), now, spare=self.pools[vm.pool].keep_layers):
            self._filled.pop(vm.id, None)  # something was evicted: look again from the top
        if vm.pulling == image:
            vm.pulling = ""
        self._vm_changed(vm)
        s = self.sessions.get(vm.session_id)
        if (vm.state is V.ASSIGNED and s is not None and s.state is S.PULLING_IMAGE
                and vm.cache.has_image(s.image, self.catalog)):
            s.pull_bytes_done = s.pull_bytes_total
            self._running(s, vm, now)
        elif vm.state is V.WARM and not vm.pulling:
            self._after_vm_freed(vm, now)

    def pull_failed(self, vm_id: str, image: str, failure: CloudFailure, now: float) -> None:
        vm = self.vms.get(vm_id)
        if vm is None or vm.pulling != image:
            return  # a superseded prewarm: nothing waits for it
        vm.pulling = ""
        s = self.sessions.get(vm.session_id)
        if vm.state in (V.WARM, V.ASSIGNED):
            vm.session_id = ""
            self._delete(vm, f"pull failed: {failure.code}: {failure.message}", now)
        if s is not None and s.state is S.PULLING_IMAGE:
            s.pull_bytes_total = s.pull_bytes_done = 0
            if not self._place(s, now):
                self._enqueue(s, "the image pull failed; waiting for another VM", now)

    def wipe_done(self, vm_id: str, now: float) -> None:
        vm = self.vms.get(vm_id)
        if vm is None or vm.state is not V.RECYCLING:  # the reconciler found it gone meanwhile
            return
        s = self.sessions.get(vm.session_id)
        vm.session_id = ""
        self._set_vm(vm, V.WARM, "wiped", now)
        if s is not None and s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)
        self._after_vm_freed(vm, now)

    def wipe_failed(self, vm_id: str, failure: CloudFailure, now: float) -> None:
        vm = self.vms.get(vm_id)
        if vm is None or vm.state is not V.RECYCLING:
            return
        s = self.sessions.get(vm.session_id)
        self._delete(vm, f"wipe failed ({failure.code}); never reused unwiped", now)
        if s is not None and s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)

    def vm_deleted(self, vm_id: str, now: float, reason: str = "deleted") -> None:
        vm = self.vms.get(vm_id)
        if vm is None:
            return
        s = self.sessions.get(vm.session_id)
        if s is not None and s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)
        self._set_vm(vm, V.DELETED, reason, now)

    def delete_failed(self, vm_id: str, failure: CloudFailure, now: float) -> None:
        vm = self.vms.get(vm_id)
        if vm is not None and vm.state is V.DELETING:
            # The session stopping on it is over: the failed VM is never reused, and its delete is
            # the reconciler's to retry.
            s = self.sessions.get(vm.session_id)
            if s is not None and s.state is S.STOPPING:
                self._end(s, S.STOPPED, s.reason, now)
            self._set_vm(vm, V.FAILED, f"delete failed: {failure.code}: {failure.message}", now)

    def reconciled(self, plan: Plan, now: float) -> None:
        """Applies what the reconciler found comparing records with the cloud's inventory."""
        for vm_id in plan.lost:
            self._vm_lost(self.vms[vm_id], now)
        for vm_id in plan.terminated:
            self._vm_lost(self.vms[vm_id], now, still_there=True)
        for vm_id in plan.deleted:
            self.vm_deleted(vm_id, now, "nothing was left in the cloud")
        for vm_id in plan.retry_delete:
            self._delete(self.vms[vm_id], "the reconciler retries the delete of a failed VM", now)

    def _vm_lost(self, vm: Vm, now: float, still_there: bool = False) -> None:
        """The VM is gone from the cloud (preempted, deleted outside us) while we counted on it;
        `still_there`: it was terminated, so what is left of it is deleted."""
        s = self.sessions.get(vm.session_id)
        if s is not None and not s.terminal:
            if s.state is S.STOPPING:
                self._end(s, S.STOPPED, s.reason, now)
            else:
                self._end(s, S.FAILED, "the VM is gone from the cloud (preempted or deleted outside)", now)
        vm.session_id, vm.pulling = "", ""
        self._set_vm(vm, V.FAILED, "terminated in the cloud" if still_there else "gone from the cloud", now)
        if still_there:
            self._delete(vm, "terminated: nothing runs on it any more", now)
        else:
            self._set_vm(vm, V.DELETED, "nothing was left in the cloud", now)

    def vm_health(self, vm_id: str, report: HealthReport, now: float) -> None:
        """An unhealthy warm VM leaves the warm set; a session on one is told and ends."""
        vm = self.vms.get(vm_id)
        if vm is None or report.healthy or not vm.healthy:
            return
        vm.healthy, vm.health_detail = False, report.detail
        self.pools[vm.pool].ready.pop(vm.id, None)
        self._vm_changed(vm)
        if vm.state is V.WARM and not vm.pulling:
            self._delete(vm, f"unhealthy: {report.detail}", now)
        elif vm.state is V.ASSIGNED:
            s = self.sessions[vm.session_id]
            self._end(s, S.FAILED, f"the VM became unhealthy: {report.detail}", now)
            self._delete(vm, f"unhealthy: {report.detail}", now)

    def _after_vm_freed(self, vm: Vm, now: float) -> None:
        """A VM became idle and warm: queued sessions come first."""
        if vm.state is V.WARM and not vm.healthy:
            self._delete(vm, f"unhealthy: {vm.health_detail}", now)
            return
        self._dispatch_queue(self.pools[vm.pool], now)
        self._fill(vm, now)

    # ---- periodic work -------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self._cull(now)
        for pool in self.pools.values():
            if now - pool.ranking_at >= RANKING_REFRESH_S:
                self._refresh_ranking(pool, now)
            self._dispatch_queue(pool, now)
            if pool.changed or pool.queue or now - pool.scaled_at >= AUTOSCALE_QUIET_S:
                self._autoscale(pool, now)

    def _watch_deadline(self, s: Session) -> None:
        heapq.heappush(self._deadlines, (self._deadline(s), s.id))

    @staticmethod
    def _deadline(s: Session) -> float:
        """When a running session is next due for culling, as things stand."""
        due = s.ready_at + s.max_runtime_s if s.max_runtime_s else float("inf")
        if s.spec.kind is SessionKind.INTERACTIVE:
            due = min(due, s.last_activity_at + s.idle_timeout_s)
        return due

    def _cull(self, now: float) -> None:
        """Stops sessions idle too long or past their max runtime. A touch moves a deadline
        later without touching the heap: an entry found early is pushed back at the new time."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            s = self.sessions.get(sid)
            if s is None or s.state is not S.RUNNING:
                continue
            if (due := self._deadline(s)) > now:
                heapq.heappush(heap, (due, sid))
            elif s.spec.kind is SessionKind.INTERACTIVE and now - s.last_activity_at >= s.idle_timeout_s:
                self.stop(s.id, f"idle for {_minutes(s.idle_timeout_s)}", now)
            else:
                self.stop(s.id, f"reached its max runtime of {_minutes(s.max_runtime_s)}", now)

    def snapshot(self, pool: PoolState) -> PoolSnapshot:
        c, p = pool.count, pool.policy
        return PoolSnapshot(
            warm=c[V.WARM], starting=c[V.CREATING] + c[V.BOOTING], assigned=c[V.ASSIGNED],
            recycling=c[V.RECYCLING], queued=len(pool.queue), min_vms=p.min_vms, max_vms=p.max_vms,
            headroom_fraction=p.headroom_fraction, autoscaler=p.autoscaler, warm_vms=p.warm_vms,
            forecast_warm=pool.forecast_warm,
        )

    def _autoscale(self, pool: PoolState, now: float) -> None:
        pool.changed, pool.scaled_at = False, now
        policy = pool.policy
        if policy.autoscaler == "predictive" and now - pool.forecast_at >= FORECAST_REFRESH_S:
            lead_s = self._cold_start_s(pool.ranking[0] if pool.ranking else self.catalog.latest)
            pool.forecast_warm = pool.forecast.warm_needed(now, lead_s, policy.wait_probability)
            pool.forecast_at = now
        snap = self.snapshot(pool)
        pool.peak.window_s = PREDICTIVE_STABILIZATION_S if policy.autoscaler == "predictive" else STABILIZATION_S
        hold = pool.peak.add(now, desired_vms(snap))
        # An upper bound on the VMs idle long enough: the real list is made only to delete some.
        plan = plan_scale(snap, hold, len(pool.ready))
        for _ in range(plan.launch):
            if self._launch(pool, now, images=pool.ranking[:1]) is None:
                break
        if plan.delete:
            # A prewarm under way does not save a surplus VM.
            idle = [vm for vm in pool.ready.values() if now - vm.warm_since >= SCALE_DOWN_IDLE_S]
            for vm in pick_deletions(idle, plan.delete, lambda v: self._held_of_ranking(pool, v)):
                self._delete(vm, "scale-down: surplus warm VM", now)

    def _refresh_ranking(self, pool: PoolState, now: float) -> None:
        """Re-ranks the images idle VMs should hold; when the ranking moved, idle VMs follow it."""
        pool.ranking_at = now
        catalog = self.catalog
        ranking = holdable(rank_images(self._wanted_images(pool, now), self._age),
                           lambda i: {layer.id: layer.size_bytes for layer in catalog.layers(i)},
                           pool.config.disk_cache_bytes)
        n = RANKING_ORDER_MATTERS
        if set(ranking) == set(pool.ranking) and ranking[:n] == pool.ranking[:n]:
            return
        pool.ranking = ranking
        pool.keep_layers = frozenset().union(*(catalog.layer_ids(i) for i in ranking))
        pool.ranking_gen += 1
        for vm in self._idle_settled(pool):
            self._fill(vm, now)

    def _held_of_ranking(self, pool: PoolState, vm: Vm) -> int:
        """How many of the pool's ranked images the VM holds, as far as its filling went."""
        gen, k = self._filled.get(vm.id, (-1, 0))
        return k if gen == pool.ranking_gen else 0

    def _fill(self, vm: Vm, now: float) -> None:
        """An idle warm VM pulls the next image its pool wants it to hold, if any."""
        if vm.state is not V.WARM or vm.pulling or vm.session_id or not vm.healthy:
            return
        pool, cache, catalog = self.pools[vm.pool], vm.cache, self.catalog
        gen, start = self._filled.get(vm.id, (-1, 0))
        k = next_pull(pool.ranking, lambda i: cache.has_image(i, catalog),
                      start if gen == pool.ranking_gen else 0)
        self._filled[vm.id] = (pool.ranking_gen, k)
        if k < len(pool.ranking):
            self._prewarm(vm, pool.ranking[k], now)

    def _wanted_images(self, pool: PoolState, now: float) -> dict[str, float]:
        """Recent demand by image, plus a baseline for each of the newest releases: notebooks stay
        pinned to the version they were made with, so the first request for a recent version in
        a while should still find it warm."""
        wanted = dict(self._decayed_demand(pool, now))
        for version in self.catalog.newest(RECENT_RELEASES):
            wanted[version] = wanted.get(version, 0.0) + RECENT_RELEASE_DEMAND
        return wanted

    def _count_demand(self, pool: PoolState, image: str, now: float) -> None:
        demand = self._decayed_demand(pool, now)
        demand[image] = demand.get(image, 0.0) + 1.0

    def _decayed_demand(self, pool: PoolState, now: float) -> dict[str, float]:
        # Decayed a minute at a time: the half-life is hours, and requests come many a minute.
        if now - pool.demand_at >= 60.0:
            factor = 0.5 ** ((now - pool.demand_at) / DEMAND_HALF_LIFE_S)
            pool.demand = {i: c * factor for i, c in pool.demand.items() if c * factor > 0.01}
            pool.demand_at = now
        return pool.demand

    def _prewarm(self, vm: Vm, image: str, now: float) -> None:
        """Pulls an image onto an idle warm VM ahead of demand."""
        if vm.state is not V.WARM or vm.pulling or vm.session_id:
            return
        missing = tuple(vm.cache.missing(image, self.catalog))
        if missing:
            vm.pulling = image
            self._vm_changed(vm)
            self._commands.append(Pull(vm.id, vm.zone, image, missing))

    # ---- operators -----------------------------------------------------------------------

    def set_draining(self, draining: bool) -> None:
        self.draining = draining

    def pool(self, name: str) -> PoolState:
        if name not in self.pools:
            raise NotFound(f"cluster {self.name} has no pool {quote(name)}", field="pool")
        return self.pools[name]

    def set_policy(self, name: str, now: float, **changes) -> PoolPolicy:
        pool = self.pool(name)
        pool.policy = PoolPolicy(**merge_policy(vars(pool.policy), changes, pool.config.vm_ceiling))
        pool.changed = True
        return pool.policy

    def prewarm(self, name: str, image: str, count: int, now: float) -> list[str]:
        """Pulls `image` onto up to `count` idle warm VMs (those missing the fewest bytes)."""
        pool = self.pool(name)
        version = self.catalog.resolve(image)
        have = sum(1 for vm in self.assignable(pool) if vm.cache.has_image(version, self.catalog))
        candidates = sorted((vm for vm in self._idle_settled(pool) if not vm.cache.has_image(version, self.catalog)),
                            key=lambda vm: (self.catalog.missing_bytes(version, vm.cache.layer_ids), vm.id))
        chosen = candidates[:max(0, count - have)]
        for vm in chosen:
            self._prewarm(vm, version, now)
        self._count_demand(pool, version, now)
        return [vm.id for vm in chosen]

    def evict(self, vm_id: str, reason: str, now: float) -> Vm:
        vm = self.vms.get(vm_id)
        if vm is None:
            raise NotFound(f"VM {quote(vm_id)} not found in cluster {self.name}", field="vm_id")
        reason = reason or "evicted by an operator"
        if vm.state is V.ASSIGNED:
            s = self.sessions[vm.session_id]
            if not s.terminal:
                self._end(s, S.FAILED, f"VM evicted: {reason}", now)
            self._delete(vm, f"evicted: {reason}", now)
        elif vm.state in (V.WARM, V.FAILED):
            self._delete(vm, f"evicted: {reason}", now)
        else:
            raise FailedPrecondition(f"VM {vm_id} is {vm.state}; evict it once it is warm or assigned",
                                     field="vm_id")
        return vm

    # ---- estimates ----------------------------------------------------------------------

    def _bandwidth(self) -> float:
        return self.config.sim.pull_bytes_per_s

    def _cold_start_s(self, image: str) -> float:
        return CREATE_ESTIMATE_S + self.config.sim.boot_s + self.catalog.size_bytes(image) / self._bandwidth()

    def cold_start_s(self) -> float:
        return self._cold_start_s(self.catalog.latest)


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.0f}h"
