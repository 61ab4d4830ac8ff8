"""The cluster core's VMs: their records, the cloud work on them (launching, starting, stopping,
wiping, deleting, pulling) and the cloud's answers. Pure.

The only writer of the VM records; it reads the sessions (decide/sessions.py) and tells the session
side what became of the VM a session waits for or runs on. Each answer handler is given the command
it answers: ClusterCore.handle has already dropped answers to commands no longer in flight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from provisioner.cloud.base import PREEMPTED, CloudFailure, HealthReport
from provisioner.decide import events as ev
from provisioner.decide.autoscale import pick_zone
from provisioner.decide.changes import Changes
from provisioner.decide.commands import Command, Delete, Launch, Pull, Start, StartNotebook, Stop, StopNotebook, Wipe
from provisioner.decide.ids import IdSource
from provisioner.decide.in_flight import InFlight
from provisioner.decide.pools import PoolState
from provisioner.decide.reconcile import Plan
from provisioner.decide.sizing import Sizing
from provisioner.model.errors import FailedPrecondition, NotFound, quote
from provisioner.model.images import ImageCatalog, LayerCache
from provisioner.model.records import Session, SessionKind, StartKind, Vm, vm_copy
from provisioner.model.states import SessionState, VmState

if TYPE_CHECKING:
    from provisioner.decide.notebooks import Notebooks
    from provisioner.decide.prewarming import Prewarming
    from provisioner.decide.sessions import Sessions

S, V = SessionState, VmState
# A VM leaving for good takes its other work with it: answers to that work no longer apply.
_GONE = frozenset({V.DELETING, V.FAILED, V.DELETED})


class Vms:
    """The cluster's VMs, by id, and what is done to them."""

    def __init__(self, name: str, ids: IdSource, catalog: Callable[[], ImageCatalog], sizing: Sizing,
                 in_flight: InFlight, changes: Changes):
        self._name, self._ids, self._catalog = name, ids, catalog
        self._sizing = sizing  # the pools' counts, kept as VMs change; stockouts remembered
        self._in_flight, self._changes = in_flight, changes
        self.vms: dict[str, Vm] = {}

    def connect(self, sessions: Sessions, notebooks: Notebooks, prewarming: Prewarming) -> None:
        """The session side, told what became of its VMs; the notebook steps, redone after a
        restart; prewarming, told when a VM's holdings changed or it came free."""
        self._sessions: Mapping[str, Session] = sessions.sessions  # read only
        self._session_side, self._notebooks, self._prewarming = sessions, notebooks, prewarming

    def set_state(self, vm: Vm, state: VmState, reason: str, now: float) -> None:
        if vm.state is not None:
            self._sizing.count_out(vm)
        vm.to(state, reason, now)
        if state is V.DELETED:
            self._changes.deleted(vm)
        else:
            self._changes.vm(vm)
        if state in _GONE:
            self._in_flight.settle_vm(vm.id)
        if state is V.DELETED:
            del self.vms[vm.id]
            self._prewarming.forget(vm.id)
        else:
            self._sizing.count_in(vm)

    def restore(self, vms: Iterable[Vm]) -> list[Vm]:
        """Takes the VMs of the pools this cluster still has, as the store kept them."""
        restored = []
        for vm in vms:
            if vm.pool not in self._sizing.pools:
                continue
            vm = self.vms[vm.id] = vm_copy(vm)  # the core's own: the event's value stays as it was
            self._sizing.count_in(vm)
            restored.append(vm)
        return restored

    # ---- issuing work --------------------------------------------------------------------

    def launch(self, pool: PoolState, now: float, images: tuple[str, ...] = (),
               reserved_for: Session | None = None, spot: bool = False) -> Vm | None:
        """Makes a VM; `spot`: a Spot one (the pool's Spot tier; a Spot pool's are all Spot)."""
        zone = pick_zone(pool.config.zones, pool.stocked_out_until, pool.per_zone, now)
        if zone is None:
            return None
        vm = Vm(id=self._ids.vm(pool.config.name), cluster=self._name, pool=pool.config.name, zone=zone,
                cache=LayerCache(pool.config.disk_cache_bytes), created_at=now,
                reserved_for=reserved_for.id if reserved_for else "", spot=spot or pool.config.spot)
        self.vms[vm.id] = vm
        why = f"cold start for {reserved_for.id}" if reserved_for else "filling the warm pool"
        self.set_state(vm, V.CREATING, why, now)
        self._in_flight.issue(Launch, now, vm.id, pool.config.name, zone, images, vm.reserved_for, vm.spot)
        return vm

    def start(self, vm: Vm, now: float, reserved_for: Session | None = None) -> None:
        """Starts a standby VM, for a session waiting on it or to refill the warm pool."""
        vm.reserved_for = reserved_for.id if reserved_for else ""
        why = f"started for {reserved_for.id}" if reserved_for else "started to refill the warm pool"
        self.set_state(vm, V.STARTING, why, now)
        self._in_flight.issue(Start, now, vm.id, vm.pool, vm.zone, vm.reserved_for)

    def unreserve(self, vm: Vm) -> None:
        """The session it was made or started for no longer waits: it joins the pool when up."""
        vm.reserved_for = ""
        self._changes.vm(vm)

    def assign(self, vm: Vm, session_id: str, now: float) -> None:
        vm.session_id, vm.reserved_for = session_id, ""
        self.set_state(vm, V.ASSIGNED, f"assigned to session {session_id}", now)

    def hold_image(self, vm: Vm, image: str, missing: tuple, session_id: str, now: float) -> None:
        """The assigned VM gets the session's image: the `missing` layers pulled, or the cache's
        use of the image noted when none are."""
        if not missing:
            vm.cache.touch(image, self._catalog(), now)
        elif vm.pulling != image:
            # A prewarm of this very image is already under way: wait for it. Otherwise this pull
            # supersedes whatever prewarm the VM was doing.
            vm.pulling = image
            self._pull(now, vm, image, missing, session_id)

    def prewarm(self, vm: Vm, image: str, missing: tuple, now: float) -> None:
        """Pulls an image onto an idle warm VM ahead of demand."""
        vm.pulling = image
        self._changes.vm(vm)
        self._pull(now, vm, image, missing)

    def _pull(self, now: float, vm: Vm, image: str, layers: tuple, session_id: str = "") -> Command:
        """Pulls `image` onto the VM: for a session, the digest it was pinned to at creation."""
        s = self._sessions.get(session_id) if session_id else None
        catalog = self._catalog()
        digest = s.image_digest if s is not None and s.image == image and s.image_digest else catalog.digest(image)
        return self._in_flight.issue(Pull, now, vm.id, vm.zone, image, layers, session_id, digest, catalog.repository)

    def to_standby(self, vm: Vm, reason: str, now: float) -> None:
        """Stops an idle warm VM: it keeps its disk (image cache) and bills for the disk alone. A
        prewarm under way dies with it: its answer, whatever it is, no longer applies."""
        self._in_flight.settle_vm(vm.id)
        vm.pulling = ""
        self.set_state(vm, V.STOPPING_STANDBY, reason, now)
        self._in_flight.issue(Stop, now, vm.id, vm.zone)

    def release(self, vm: Vm, now: float) -> None:
        """After a session: wipe and keep, or delete, per pool policy. Never reuse unwiped."""
        pool, s = self._sizing.pools[vm.pool], self._sessions.get(vm.session_id)
        self._sizing.departed(pool, now, s is not None and s.spec.kind is SessionKind.BATCH)
        if pool.policy.recycle and vm.healthy:
            self.set_state(vm, V.RECYCLING, f"wiping after session {vm.session_id}", now)
            self._in_flight.issue(Wipe, now, vm.id, vm.zone, vm.session_id)
        else:
            why = "unhealthy" if not vm.healthy else "pool deletes VMs after use"
            self.delete(vm, why, now)

    def delete(self, vm: Vm, reason: str, now: float) -> None:
        self.set_state(vm, V.DELETING, reason, now)
        self._in_flight.issue(Delete, now, vm.id, vm.zone, vm.session_id)

    def reissue(self, vm: Vm, now: float) -> None:
        """After a restart: the cloud work the VM's state says was under way, again (every
        command is idempotent by VM id, so repeating one that had finished is harmless)."""
        if vm.state in (V.CREATING, V.BOOTING):
            self._in_flight.issue(Launch, now, vm.id, vm.pool, vm.zone, (), vm.reserved_for, vm.spot)
        elif vm.state is V.RECYCLING:
            self._in_flight.issue(Wipe, now, vm.id, vm.zone, vm.session_id)
        elif vm.state is V.DELETING:
            self._in_flight.issue(Delete, now, vm.id, vm.zone, vm.session_id)
        elif vm.state is V.STOPPING_STANDBY:
            self._in_flight.issue(Stop, now, vm.id, vm.zone)
        elif vm.state is V.STARTING:
            self._in_flight.issue(Start, now, vm.id, vm.pool, vm.zone, vm.reserved_for)
        else:
            self._notebooks.reissue(vm, now)
            if vm.pulling:
                missing = tuple(vm.cache.missing(vm.pulling, self._catalog()))
                self._pull(now, vm, vm.pulling, missing, vm.session_id)

    # ---- answers -------------------------------------------------------------------------

    def answer(self, cmd: Command, event: ev.Event, now: float) -> None:
        """The cloud's answer to `cmd`, still in flight."""
        match event:
            case ev.VmCreated():
                self._vm_created(cmd, event.endpoint, now)
            case ev.VmReady():
                self._vm_ready(cmd, event.endpoint, now)
            case ev.PullProgress():
                self._pull_progress(cmd, event.bytes_done, now)
            case ev.PullDone():
                self._pull_done(cmd, now)
            case ev.WipeDone():
                self._wipe_done(cmd, now)
            case ev.VmDeleted():
                self._vm_deleted(self.vms[cmd.vm_id], now)
            case ev.VmStopped():
                self.set_state(self.vms[cmd.vm_id], V.STANDBY, "stopped: its disk and image cache kept", now)
            case ev.VmStarted():
                self._vm_started(cmd, event.endpoint, now)

    def _vm_created(self, cmd: Launch, endpoint: str, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        if vm.state is V.CREATING:  # a launch re-issued for a booting VM is only waited for
            vm.endpoint = endpoint
            self.set_state(vm, V.BOOTING, "the cloud accepted the create; booting", now)

    def _vm_ready(self, cmd: Launch, endpoint: str, now: float) -> None:
        """`endpoint`: where the booted VM is reached, when the cloud gives it only now."""
        vm = self.vms[cmd.vm_id]
        if vm.state is V.CREATING:  # the create's own answer was lost on the way
            self._vm_created(cmd, endpoint, now)
        self._warm_for_reserved(vm, endpoint, "booted", StartKind.COLD, now)

    def _vm_started(self, cmd: Start, endpoint: str, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        s = self._sessions.get(vm.reserved_for)
        # Its disk came back with it: a session finds the layers it had.
        start = StartKind.WARM if s is not None and vm.cache.has_image(s.image, self._catalog()) else StartKind.PARTIAL
        self._warm_for_reserved(vm, endpoint, "started from standby", start, now)

    def _warm_for_reserved(self, vm: Vm, endpoint: str, why: str, start: StartKind, now: float) -> None:
        """The VM is up: the session it was made or started for gets it, else the pool does."""
        vm.endpoint = endpoint or vm.endpoint
        self.set_state(vm, V.WARM, why, now)
        s = self._sessions.get(vm.reserved_for)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm.id:
            self._session_side.assign(s, vm, start, now)
            return
        vm.reserved_for = ""
        self._after_vm_freed(vm, now)

    def _pull_progress(self, cmd: Pull, bytes_done: int, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        if vm.pulling != cmd.image:
            return  # a superseded prewarm
        s = self._sessions.get(vm.session_id)
        if s is not None and s.state is S.PULLING_IMAGE:
            self._session_side.pull_progress(s, bytes_done, now)

    def _pull_done(self, cmd: Pull, now: float) -> None:
        vm, image, catalog = self.vms[cmd.vm_id], cmd.image, self._catalog()
        # The layers are on disk, even if superseded; eviction spares the pool's top images.
        if vm.cache.add_layers(catalog.layers(image), now, spare=self._sizing.pools[vm.pool].keep_layers):
            self._prewarming.forget(vm.id)  # something was evicted: look again from the top
        if vm.pulling == image:
            vm.pulling = ""
        self._changes.vm(vm)
        s = self._sessions.get(vm.session_id)
        if (vm.state is V.ASSIGNED and s is not None and s.state is S.PULLING_IMAGE
                and vm.cache.has_image(s.image, catalog)):
            self._session_side.pulled(s, vm, now)
        elif vm.state is V.WARM and not vm.pulling:
            self._after_vm_freed(vm, now)

    def _wipe_done(self, cmd: Wipe, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        s = self._sessions.get(vm.session_id)
        vm.session_id = ""
        self.set_state(vm, V.WARM, "wiped", now)
        self._session_side.let_go(s, now)
        self._after_vm_freed(vm, now)

    def _vm_deleted(self, vm: Vm, now: float, reason: str = "deleted") -> None:
        self._session_side.let_go(self._sessions.get(vm.session_id), now)
        self.set_state(vm, V.DELETED, reason, now)

    def _after_vm_freed(self, vm: Vm, now: float) -> None:
        """A VM became idle and warm: queued sessions come first."""
        if vm.state is V.WARM and not vm.healthy:
            self.delete(vm, f"unhealthy: {vm.health_detail}", now)
            return
        self._session_side.dispatch(self._sizing.pools[vm.pool], now)
        self._prewarming.fill(vm, now)

    # ---- failures ------------------------------------------------------------------------

    def failed(self, cmd: Command, failure: CloudFailure, now: float, expired: bool = False) -> None:
        """A command failed, by the cloud's answer, its executor's exception or its deadline."""
        match cmd:
            case Launch():
                self._launch_failed(cmd, failure, now, maybe_there=expired)
            case Pull():
                self._pull_failed(cmd, failure, now)
            case Wipe():
                vm = self.vms[cmd.vm_id]
                s = self._sessions.get(vm.session_id)
                self.delete(vm, f"wipe failed ({failure.code}); never reused unwiped", now)
                self._session_side.let_go(s, now)
            case Delete():
                self._delete_failed(cmd, failure, now)
            case Stop():
                self.delete(self.vms[cmd.vm_id], f"stop failed: {failure.code}: {failure.message}", now)
            case Start():
                self._start_failed(cmd, failure, now, expired)
            case StartNotebook():
                self._notebooks.start_failed(cmd, failure, now)
            case StopNotebook():
                self._notebooks.stopped(cmd, now)

    def _start_failed(self, cmd: Start, failure: CloudFailure, now: float, expired: bool = False) -> None:
        """Like a failed create: after a stockout the VM stays stopped (its zone is skipped for a
        while) and the session is placed again without it counting; any other failure, or no
        answer, and the VM is deleted and the failure counts against the session."""
        vm = self.vms[cmd.vm_id]
        pool = self._sizing.pools[vm.pool]
        s = self._sessions.get(vm.reserved_for)
        vm.reserved_for = ""
        what = f"{failure.code}: {failure.message}"
        stockout = failure.zone_exhausted and not expired
        if stockout:
            self._sizing.remember(pool, failure, vm.zone, now)
            self.set_state(vm, V.STANDBY, f"start failed ({what}); stays stopped", now)
        else:
            self.delete(vm, f"start failed: {what}", now)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm.id:
            self._session_side.replace(
                s, f"starting standby VM {vm.id} in {vm.zone} failed ({failure.code}); waiting for capacity", now,
                "" if stockout else f"start failed: {what}")

    def _launch_failed(self, cmd: Launch, failure: CloudFailure, now: float, maybe_there: bool = False) -> None:
        """The create or the boot failed (or never answered: `maybe_there`). Remember a
        stocked-out zone; place the session again."""
        vm = self.vms[cmd.vm_id]
        if failure.zone_exhausted:
            # The cloud's word on where (a GKE node pool has its own zone), else where we asked.
            self._sizing.remember(self._sizing.pools[vm.pool], failure, vm.zone, now)
        created = maybe_there or vm.state is V.BOOTING
        self.set_state(vm, V.FAILED, f"{failure.code}: {failure.message}", now)
        if created:  # something may be left in the cloud
            self.delete(vm, "clean up after a failed boot", now)
        else:
            self.set_state(vm, V.DELETED, "nothing was created", now)
        self._replace_for(vm, f"VM creation failed in {vm.zone} ({failure.code}); waiting for capacity", now,
                          "" if failure.zone_exhausted else f"{failure.code}: {failure.message}")

    def _replace_for(self, vm: Vm, why: str, now: float, failure: str) -> None:
        """The session waiting for the VM's boot gets another."""
        s = self._sessions.get(vm.reserved_for)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm.id:
            self._session_side.replace(s, why, now, failure)

    def _pull_failed(self, cmd: Pull, failure: CloudFailure, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        if vm.pulling != cmd.image:
            return  # a superseded prewarm: nothing waits for it
        vm.pulling = ""
        s = self._sessions.get(vm.session_id)
        waiting = s is not None and s.state is S.PULLING_IMAGE
        if vm.state is V.WARM or (vm.state is V.ASSIGNED and waiting):
            vm.session_id = ""
            self.delete(vm, f"pull failed: {failure.code}: {failure.message}", now)
        else:  # a prewarm under a session already running on the VM: the session keeps it
            self._changes.vm(vm)
        if waiting:
            self._session_side.replace(s, "the image pull failed; waiting for another VM", now,
                                       f"pull failed: {failure.code}: {failure.message}")

    def _delete_failed(self, cmd: Delete, failure: CloudFailure, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        # The session stopping on it is over: the failed VM is never reused, and its delete is
        # the reconciler's to retry.
        self._session_side.let_go(self._sessions.get(vm.session_id), now)
        self.set_state(vm, V.FAILED, f"delete failed: {failure.code}: {failure.message}", now)

    # ---- reports -------------------------------------------------------------------------

    def reconciled(self, plan: Plan, now: float) -> None:
        """Applies what the reconciler found comparing records with the cloud's inventory."""
        for vm_id in plan.lost:
            self._vm_lost(self.vms[vm_id], now)
        for vm_id in plan.terminated:
            self._vm_lost(self.vms[vm_id], now, still_there=True, preempted=vm_id in plan.preempted)
        for vm_id in plan.deleted:
            self._vm_deleted(self.vms[vm_id], now, "nothing was left in the cloud")
        for vm_id in plan.retry_delete:
            self.delete(self.vms[vm_id], "the reconciler retries the delete of a failed VM", now)

    def _vm_lost(self, vm: Vm, now: float, still_there: bool = False, preempted: bool = False) -> None:
        """The VM is gone from the cloud (preempted, deleted outside us) while we counted on it;
        `still_there`: it was terminated, so what is left of it is deleted; `preempted`: a Spot VM
        the cloud took back."""
        s = self._sessions.get(vm.session_id)
        if s is not None and not s.terminal:
            if s.state is S.STOPPING:
                self._session_side.let_go(s, now)
            elif preempted:
                self._taken(s, PREEMPTED, True, now)
            else:
                self._session_side.lost_vm(s, "the VM is gone from the cloud (preempted or deleted outside)", now)
        vm.session_id, vm.pulling = "", ""
        self.set_state(vm, V.FAILED, "terminated in the cloud" if still_there else "gone from the cloud", now)
        if still_there:
            self.delete(vm, "terminated: nothing runs on it any more", now)
        else:
            self.set_state(vm, V.DELETED, "nothing was left in the cloud", now)
        self._replace_for(vm, "the VM being made for it is gone from the cloud; waiting for capacity", now,
                          "the VM being made for it is gone from the cloud")

    def health(self, vm_id: str, report: HealthReport, now: float) -> None:
        """An unhealthy warm VM leaves the warm set; a session on one is told and ends."""
        vm = self.vms.get(vm_id)
        if vm is None or report.healthy or not vm.healthy:
            return
        vm.healthy, vm.health_detail = False, report.detail
        self._sizing.not_ready(vm)
        self._changes.vm(vm)
        if vm.state is V.WARM and not vm.pulling:
            self.delete(vm, f"unhealthy: {report.detail}", now)
        elif vm.state is V.ASSIGNED:
            # The cloud taking the VM (Spot preemption, host maintenance) is the reason itself.
            s = self._sessions[vm.session_id]
            if report.cause and s.state is not S.STOPPING:
                self._taken(s, report.detail, report.cause == "preempted", now)
            else:
                self._session_side.lost_vm(s, f"the VM became unhealthy: {report.detail}", now)
            self.delete(vm, f"unhealthy: {report.detail}", now)

    def _taken(self, s: Session, reason: str, preempted: bool, now: float) -> None:
        """The cloud took the session's VM (a Spot preemption, host maintenance): the session ends
        with that reason, and a preempted batch run starts over on another VM."""
        self._session_side.end(s, S.FAILED, reason, now)
        if preempted and s.spec.kind is SessionKind.BATCH:
            self._session_side.requeue(s, now)

    def evict(self, vm_id: str, reason: str, now: float) -> Vm:
        """An operator's eviction: the VM is deleted, and a session on it fails."""
        vm = self.vms.get(vm_id)
        if vm is None:
            raise NotFound(f"VM {quote(vm_id)} not found in cluster {self._name}", field="vm_id")
        reason = reason or "evicted by an operator"
        if vm.state is V.ASSIGNED:
            self._session_side.lost_vm(self._sessions[vm.session_id], f"VM evicted: {reason}", now)
            self.delete(vm, f"evicted: {reason}", now)
        elif vm.state in (V.WARM, V.STANDBY, V.FAILED):
            self.delete(vm, f"evicted: {reason}", now)
        else:
            raise FailedPrecondition(f"VM {vm_id} is {vm.state}; evict it once it is warm or assigned",
                                     field="vm_id")
        return vm
