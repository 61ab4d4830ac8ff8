"""The cluster core's VMs: launching, releasing and deleting them, and the cloud's answers.

Part of ClusterCore (provisioner/decide/core.py), split out by concern; pure like the rest.
Each answer handler is given the command it answers: ClusterCore.handle has already dropped
answers to commands no longer in flight.
"""

from __future__ import annotations

from provisioner.cloud.base import PREEMPTED, CloudFailure, HealthReport
from provisioner.decide.autoscale import pick_zone, zones_available
from provisioner.decide.commands import Delete, Launch, Pull, Start, StartNotebook, Stop, StopNotebook, Wipe
from provisioner.model.images import LayerCache
from provisioner.decide.pools import PoolState
from provisioner.decide.reconcile import Plan
from provisioner.model.states import SessionState, VmState
from provisioner.decide.zone_memory import ProjectQuota, hold_project_quota, project_quota_of, remember
from provisioner.model.errors import FailedPrecondition, NotFound, quote
from provisioner.model.records import Session, SessionKind, StartKind, Vm

S, V = SessionState, VmState


class VmLifecycle:
    """ClusterCore's VM side."""

    # ---- issuing work --------------------------------------------------------------------

    def _can_launch(self, pool: PoolState, now: float) -> bool:
        return pool.total < pool.policy.max_vms and zones_available(pool.config.zones, pool.stocked_out_until, now)

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
        self._in_flight.issue(Launch, now, vm.id, pool.config.name, zone, images, reserved_for.id if reserved_for else "")
        return vm

    def _can_start(self, pool: PoolState) -> bool:
        return bool(pool.standby) and pool.total < pool.policy.max_vms

    def _start(self, vm: Vm, now: float, reserved_for: Session | None = None) -> None:
        """Starts a standby VM, for a session waiting on it or to refill the warm pool."""
        vm.reserved_for = reserved_for.id if reserved_for else ""
        why = f"started for {reserved_for.id}" if reserved_for else "started to refill the warm pool"
        self._set_vm(vm, V.STARTING, why, now)
        self._in_flight.issue(Start, now, vm.id, vm.pool, vm.zone, vm.reserved_for)

    def _to_standby(self, vm: Vm, reason: str, now: float) -> None:
        """Stops an idle warm VM: it keeps its disk (image cache) and bills for the disk alone. A
        prewarm under way dies with it: its answer, whatever it is, no longer applies."""
        self._in_flight.settle_vm(vm.id)
        vm.pulling = ""
        self._set_vm(vm, V.STOPPING_STANDBY, reason, now)
        self._in_flight.issue(Stop, now, vm.id, vm.zone)

    def _release(self, vm: Vm, now: float) -> None:
        """After a session: wipe and keep, or delete, per pool policy. Never reuse unwiped."""
        pool = self.pools[vm.pool]
        pool.forecast.departure(now)
        if pool.policy.recycle and vm.healthy:
            self._set_vm(vm, V.RECYCLING, f"wiping after session {vm.session_id}", now)
            self._in_flight.issue(Wipe, now, vm.id, vm.zone, vm.session_id)
        else:
            why = "unhealthy" if not vm.healthy else "pool deletes VMs after use"
            self._delete(vm, why, now)

    def _delete(self, vm: Vm, reason: str, now: float) -> None:
        self._set_vm(vm, V.DELETING, reason, now)
        self._in_flight.issue(Delete, now, vm.id, vm.zone, vm.session_id)

    def _reissue(self, vm: Vm, now: float) -> None:
        """After a restart: the cloud work the VM's state says was under way, again (every
        command is idempotent by VM id, so repeating one that had finished is harmless)."""
        if vm.state in (V.CREATING, V.BOOTING):
            self._in_flight.issue(Launch, now, vm.id, vm.pool, vm.zone, (), vm.reserved_for)
        elif vm.state is V.RECYCLING:
            self._in_flight.issue(Wipe, now, vm.id, vm.zone, vm.session_id)
        elif vm.state is V.DELETING:
            self._in_flight.issue(Delete, now, vm.id, vm.zone, vm.session_id)
        elif vm.state is V.STOPPING_STANDBY:
            self._in_flight.issue(Stop, now, vm.id, vm.zone)
        elif vm.state is V.STARTING:
            self._in_flight.issue(Start, now, vm.id, vm.pool, vm.zone, vm.reserved_for)
        else:
            self._reissue_notebook(vm, now)
            if vm.pulling:
                missing = tuple(vm.cache.missing(vm.pulling, self.catalog))
                self._pull(now, vm, vm.pulling, missing, vm.session_id)

    def _remember(self, pool: PoolState, failure: CloudFailure, zone: str, now: float) -> None:
        """A stockout or quota failure: the zones it reaches are skipped for a while, and a
        project-wide quota is held for the fleet too (the capacity stream reports it)."""
        remember(self.pools, pool, failure, zone, now)
        if (quota := project_quota_of(failure, self.name, now)) is not None:
            self._hold_project_quota(quota)

    def _hold_project_quota(self, quota: ProjectQuota) -> bool:
        """Holds the later of the quota known and `quota` (learned here or told by a front);
        whether it changed."""
        if self.project_quota is not None and self.project_quota.until >= quota.until:
            return False
        self.project_quota = quota
        hold_project_quota(self.pools, quota)
        return True

    # ---- answers -------------------------------------------------------------------------

    def _vm_created(self, cmd: Launch, endpoint: str, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        if vm.state is V.CREATING:  # a launch re-issued for a booting VM is only waited for
            vm.endpoint = endpoint
            self._set_vm(vm, V.BOOTING, "the cloud accepted the create; booting", now)

    def _vm_ready(self, cmd: Launch, endpoint: str, now: float) -> None:
        """`endpoint`: where the booted VM is reached, when the cloud gives it only now."""
        vm = self.vms[cmd.vm_id]
        if vm.state is V.CREATING:  # the create's own answer was lost on the way
            self._vm_created(cmd, endpoint, now)
        self._warm_for_reserved(vm, endpoint, "booted", StartKind.COLD, now)

    def _vm_started(self, cmd: Start, endpoint: str, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        s = self.sessions.get(vm.reserved_for)
        # Its disk came back with it: a session finds the layers it had.
        start = StartKind.WARM if s is not None and vm.cache.has_image(s.image, self.catalog) else StartKind.PARTIAL
        self._warm_for_reserved(vm, endpoint, "started from standby", start, now)

    def _warm_for_reserved(self, vm: Vm, endpoint: str, why: str, start: StartKind, now: float) -> None:
        """The VM is up: the session it was made or started for gets it, else the pool does."""
        vm.endpoint = endpoint or vm.endpoint
        self._set_vm(vm, V.WARM, why, now)
        s = self.sessions.get(vm.reserved_for)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm.id:
            self._assign(s, vm, start, now)
            return
        vm.reserved_for = ""
        self._after_vm_freed(vm, now)

    def _vm_stopped(self, cmd: Stop, now: float) -> None:
        self._set_vm(self.vms[cmd.vm_id], V.STANDBY, "stopped: its disk and image cache kept", now)

    def _stop_failed(self, cmd: Stop, failure: CloudFailure, now: float) -> None:
        self._delete(self.vms[cmd.vm_id], f"stop failed: {failure.code}: {failure.message}", now)

    def _start_failed(self, cmd: Start, failure: CloudFailure, now: float, expired: bool = False) -> None:
        """Like a failed create: after a stockout the VM stays stopped (its zone is skipped for a
        while) and the session is placed again without it counting; any other failure, or no
        answer, and the VM is deleted and the failure counts against the session."""
        vm = self.vms[cmd.vm_id]
        pool = self.pools[vm.pool]
        s = self.sessions.get(vm.reserved_for)
        vm.reserved_for = ""
        what = f"{failure.code}: {failure.message}"
        stockout = failure.zone_exhausted and not expired
        if stockout:
            self._remember(pool, failure, vm.zone, now)
            self._set_vm(vm, V.STANDBY, f"start failed ({what}); stays stopped", now)
        else:
            self._delete(vm, f"start failed: {what}", now)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm.id:
            self._replace(s, f"starting standby VM {vm.id} in {vm.zone} failed ({failure.code}); waiting for capacity",
                          now, "" if stockout else f"start failed: {what}")

    def _launch_failed(self, cmd: Launch, failure: CloudFailure, now: float, maybe_there: bool = False) -> None:
        """The create or the boot failed (or never answered: `maybe_there`). Remember a
        stocked-out zone; place the session again."""
        vm = self.vms[cmd.vm_id]
        pool = self.pools[vm.pool]
        if failure.zone_exhausted:
            # The cloud's word on where (a GKE node pool has its own zone), else where we asked.
            self._remember(pool, failure, vm.zone, now)
        created = maybe_there or vm.state is V.BOOTING
        self._set_vm(vm, V.FAILED, f"{failure.code}: {failure.message}", now)
        if created:  # something may be left in the cloud
            self._delete(vm, "clean up after a failed boot", now)
        else:
            self._set_vm(vm, V.DELETED, "nothing was created", now)
        self._replace_for(vm, f"VM creation failed in {vm.zone} ({failure.code}); waiting for capacity", now,
                          "" if failure.zone_exhausted else f"{failure.code}: {failure.message}")

    def _replace_for(self, vm: Vm, why: str, now: float, failure: str) -> None:
        """The session waiting for the VM's boot gets another."""
        s = self.sessions.get(vm.reserved_for)
        if s is not None and s.state is S.PROVISIONING and s.vm_id == vm.id:
            self._replace(s, why, now, failure)

    def _pull_progress(self, cmd: Pull, bytes_done: int, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        if vm.pulling != cmd.image:
            return  # a superseded prewarm
        s = self.sessions.get(vm.session_id)
        if s is not None and s.state is S.PULLING_IMAGE:
            s.pull_bytes_done = bytes_done
            remaining = max(0, s.pull_bytes_total - bytes_done)
            s.estimated_ready_at = now + remaining / self._bandwidth()
            self._changes.session(s)

    def _pull_done(self, cmd: Pull, now: float) -> None:
        vm, image = self.vms[cmd.vm_id], cmd.image
        # The layers are on disk, even if superseded; eviction spares the pool's top images.
        if vm.cache.add_layers(self.catalog.layers(image), now, spare=self.pools[vm.pool].keep_layers):
            self.prewarming.forget(vm.id)  # something was evicted: look again from the top
        if vm.pulling == image:
            vm.pulling = ""
        self._changes.vm(vm)
        s = self.sessions.get(vm.session_id)
        if (vm.state is V.ASSIGNED and s is not None and s.state is S.PULLING_IMAGE
                and vm.cache.has_image(s.image, self.catalog)):
            s.pull_bytes_done = s.pull_bytes_total
            self._start_notebook(s, vm, now)
        elif vm.state is V.WARM and not vm.pulling:
            self._after_vm_freed(vm, now)

    def _pull_failed(self, cmd: Pull, failure: CloudFailure, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        if vm.pulling != cmd.image:
            return  # a superseded prewarm: nothing waits for it
        vm.pulling = ""
        s = self.sessions.get(vm.session_id)
        waiting = s is not None and s.state is S.PULLING_IMAGE
        if vm.state is V.WARM or (vm.state is V.ASSIGNED and waiting):
            vm.session_id = ""
            self._delete(vm, f"pull failed: {failure.code}: {failure.message}", now)
        else:  # a prewarm under a session already running on the VM: the session keeps it
            self._changes.vm(vm)
        if waiting:
            self._replace(s, "the image pull failed; waiting for another VM", now,
                          f"pull failed: {failure.code}: {failure.message}")

    def _wipe_done(self, cmd: Wipe, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        s = self.sessions.get(vm.session_id)
        vm.session_id = ""
        self._set_vm(vm, V.WARM, "wiped", now)
        if s is not None and s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)
        self._after_vm_freed(vm, now)

    def _wipe_failed(self, cmd: Wipe, failure: CloudFailure, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        s = self.sessions.get(vm.session_id)
        self._delete(vm, f"wipe failed ({failure.code}); never reused unwiped", now)
        if s is not None and s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)

    def _vm_deleted(self, vm: Vm, now: float, reason: str = "deleted") -> None:
        s = self.sessions.get(vm.session_id)
        if s is not None and s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)
        self._set_vm(vm, V.DELETED, reason, now)

    def _delete_failed(self, cmd: Delete, failure: CloudFailure, now: float) -> None:
        vm = self.vms[cmd.vm_id]
        # The session stopping on it is over: the failed VM is never reused, and its delete is
        # the reconciler's to retry.
        s = self.sessions.get(vm.session_id)
        if s is not None and s.state is S.STOPPING:
            self._end(s, S.STOPPED, s.reason, now)
        self._set_vm(vm, V.FAILED, f"delete failed: {failure.code}: {failure.message}", now)

    def _failed(self, cmd, failure: CloudFailure, now: float, expired: bool = False) -> None:
        """A command failed, by the cloud's answer, its executor's exception or its deadline."""
        match cmd:
            case Launch():
                self._launch_failed(cmd, failure, now, maybe_there=expired)
            case Pull():
                self._pull_failed(cmd, failure, now)
            case Wipe():
                self._wipe_failed(cmd, failure, now)
            case Delete():
                self._delete_failed(cmd, failure, now)
            case Stop():
                self._stop_failed(cmd, failure, now)
            case Start():
                self._start_failed(cmd, failure, now, expired)
            case StartNotebook():
                self._notebook_start_failed(cmd, failure, now)
            case StopNotebook():
                self._notebook_stopped(cmd, now)

    # ---- reports -------------------------------------------------------------------------

    def _reconciled(self, plan: Plan, now: float) -> None:
        """Applies what the reconciler found comparing records with the cloud's inventory."""
        for vm_id in plan.lost:
            self._vm_lost(self.vms[vm_id], now)
        for vm_id in plan.terminated:
            self._vm_lost(self.vms[vm_id], now, still_there=True, preempted=vm_id in plan.preempted)
        for vm_id in plan.deleted:
            self._vm_deleted(self.vms[vm_id], now, "nothing was left in the cloud")
        for vm_id in plan.retry_delete:
            self._delete(self.vms[vm_id], "the reconciler retries the delete of a failed VM", now)

    def _vm_lost(self, vm: Vm, now: float, still_there: bool = False, preempted: bool = False) -> None:
        """The VM is gone from the cloud (preempted, deleted outside us) while we counted on it;
        `still_there`: it was terminated, so what is left of it is deleted; `preempted`: a Spot VM
        the cloud took back."""
        s = self.sessions.get(vm.session_id)
        if s is not None and not s.terminal:
            if s.state is S.STOPPING:
                self._end(s, S.STOPPED, s.reason, now)
            elif preempted:
                self._taken(s, PREEMPTED, True, now)
            else:
                self._end(s, S.FAILED, "the VM is gone from the cloud (preempted or deleted outside)", now)
        vm.session_id, vm.pulling = "", ""
        self._set_vm(vm, V.FAILED, "terminated in the cloud" if still_there else "gone from the cloud", now)
        if still_there:
            self._delete(vm, "terminated: nothing runs on it any more", now)
        else:
            self._set_vm(vm, V.DELETED, "nothing was left in the cloud", now)
        self._replace_for(vm, "the VM being made for it is gone from the cloud; waiting for capacity", now,
                          "the VM being made for it is gone from the cloud")

    def _vm_health(self, vm_id: str, report: HealthReport, now: float) -> None:
        """An unhealthy warm VM leaves the warm set; a session on one is told and ends."""
        vm = self.vms.get(vm_id)
        if vm is None or report.healthy or not vm.healthy:
            return
        vm.healthy, vm.health_detail = False, report.detail
        self.pools[vm.pool].ready.pop(vm.id, None)
        self._changes.vm(vm)
        if vm.state is V.WARM and not vm.pulling:
            self._delete(vm, f"unhealthy: {report.detail}", now)
        elif vm.state is V.ASSIGNED:
            # The cloud taking the VM (Spot preemption, host maintenance) is the reason itself.
            s = self.sessions[vm.session_id]
            if report.cause and s.state is not S.STOPPING:
                self._taken(s, report.detail, report.cause == "preempted", now)
            else:
                self._vm_lost_under(s, f"the VM became unhealthy: {report.detail}", now)
            self._delete(vm, f"unhealthy: {report.detail}", now)

    def _taken(self, s: Session, reason: str, preempted: bool, now: float) -> None:
        """The cloud took the session's VM (a Spot preemption, host maintenance): the session ends
        with that reason, and a preempted batch run starts over on another VM."""
        self._end(s, S.FAILED, reason, now)
        if preempted and s.spec.kind is SessionKind.BATCH:
            self._requeue(s, now)

    def _after_vm_freed(self, vm: Vm, now: float) -> None:
        """A VM became idle and warm: queued sessions come first."""
        if vm.state is V.WARM and not vm.healthy:
            self._delete(vm, f"unhealthy: {vm.health_detail}", now)
            return
        self._dispatch_queue(self.pools[vm.pool], now)
        self.prewarming.fill(vm, now)

    # ---- operators -----------------------------------------------------------------------

    def _evict(self, vm_id: str, reason: str, now: float) -> Vm:
        vm = self.vms.get(vm_id)
        if vm is None:
            raise NotFound(f"VM {quote(vm_id)} not found in cluster {self.name}", field="vm_id")
        reason = reason or "evicted by an operator"
        if vm.state is V.ASSIGNED:
            self._vm_lost_under(self.sessions[vm.session_id], f"VM evicted: {reason}", now)
            self._delete(vm, f"evicted: {reason}", now)
        elif vm.state in (V.WARM, V.STANDBY, V.FAILED):
            self._delete(vm, f"evicted: {reason}", now)
        else:
            raise FailedPrecondition(f"VM {vm_id} is {vm.state}; evict it once it is warm or assigned",
                                     field="vm_id")
        return vm
