"""The Compute Engine backend: one GPU VM per pool VM, through google-cloud-compute (REST).

- create: instances.insert with the instance gce_instance.instance_for describes (the pool's
  shape, boot disk and scheduling, the configured service account and subnetwork, our labels,
  the startup script and the images to prewarm in metadata; an instance template, if configured,
  supplies the rest). The instance name is our VM id and the insert carries a request id
  derived from it, so an insert retried after a timeout finds the VM it already made (the API
  dedupes the request id; a 409 "already exists" counts as made). The operation is polled
  (zoneOperations.get every `poll_s`, up to `operation_timeout_s`) with our own
  ZoneOperationsClient: the client library's own poller would use the default endpoint, and
  zoneOperations.wait would hold a call slot for minutes. A failed operation with
  ZONE_RESOURCE_POOL_EXHAUSTED is a stockout (with the zones Compute says have the shape),
  QUOTA_EXCEEDED a quota failure scoped as its quota is (gce_errors): the cluster core remembers
  what it covers and tries elsewhere.
- the VM's agent (`provisioner agent`, installed by the startup script or in the boot image): it
  reports `provisioner/ready` as a guest attribute once the VM is up, and carries out one command
  at a time given in the `provisioner-command` metadata item (JSON: id, op pull|wipe, layers with
  their sizes, bytes), reporting `provisioner/progress-<id>` (bytes, then an estimate) and
  `provisioner/done-<id>` (`ok` or an error); a fault it sees is `provisioner/healthy` 0 with
  `provisioner/health-detail`, host maintenance ahead `provisioner/maintenance`, a Spot
  preemption `provisioner/preempted`. A new command (new id) supersedes the one before; the
  same command asked again (`ask`) is answered again, or, still at work, says `asked-<id>`.
  Instances carry `enable-guest-attributes: TRUE` (the project's metadata may set it too).
- an answer dropped on the way (Compute may drop guest attributes written beyond about 10 a
  minute) cannot hang a command: after `command_silence_s` without news the command is asked
  again, and after ASKS askings left unanswered (`asked-<id>` answers one) it fails.
- guest attributes are read within Google's documented rate (about 10 reads a minute per VM):
  one query for the whole `provisioner/` namespace, never two for a VM within
  GUEST_READ_INTERVAL_S, and further apart while nothing changes (up to GUEST_IDLE_MAX_S).
- the session endpoint is the VM's internal address (`networkInterfaces[0].networkIP`) and the
  notebook port; a VM counts as ready only once it has one.
- unknown is never bad news: a read that fails with a retryable error (429, 5xx, a timeout) after
  its retries says nothing about the VM. Health stays as it was, a boot or an agent command keeps
  waiting within its own deadline, and a VM whose insert was accepted is never taken for gone.
- delete: instances.delete; 404 counts as done. list: aggregatedList filtered by our labels.
- stop and start (the standby tier): instances.stop (the instance is TERMINATED, its boot disk
  and so its image cache kept, billed for the disk alone) and instances.start, each operation
  followed as an insert's. A stopped VM holds no GPU: a start's ZONE_RESOURCE_POOL_EXHAUSTED or
  QUOTA_EXCEEDED is a stockout or quota failure, as a create's. A start returns once the instance
  runs again; wait_ready then waits for its agent.
- every call: at most `max_concurrent_calls` at once; 429 (or 403 rateLimitExceeded), 5xx, timeouts
  and broken connections retried with exponential backoff and jitter, bounded by `retry_attempts`
  and `retry_total_s`. A stockout or quota error is never retried in the same zone, whether it
  comes as the operation's error or as the insert's own answer.

Credentials: Application Default Credentials, unless an `endpoint` override is configured (an
emulator or a fake server), which gets anonymous ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from typing import Any, Awaitable, Callable, Sequence

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.cloud import compute_v1
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from provisioner.agent.usage import parse as parse_usage
from provisioner.common.clock import Clock
from provisioner.cloud.base import (LABEL_CLUSTER, PREEMPTED, CloudFailure, CloudVm, HealthReport,
                                     LaunchSpec, NotebookRequest, ProgressCallback, maintenance)
from provisioner.cloud.gce_errors import failure_of, operation_failure, retryable, transport_errors
from provisioner.cloud.gce_instance import GUEST_ATTRIBUTES_KEY, instance_for, notebook_endpoint, vm_of
from provisioner.config import BackendConfig, ClusterConfig
from provisioner.model.images import Layer

log = logging.getLogger(__name__)

COMMAND_KEY = "provisioner-command"
GUEST_PATH = "provisioner/"
# Google documents about 10 guest-attribute reads a minute per VM: one read per 6 s at most.
GUEST_READ_INTERVAL_S = 6.0
# While an agent's answer is not changing, reads of it slow down to this.
GUEST_IDLE_MAX_S = 30.0
# A silent agent is asked again this many times before its command is given up.
ASKS = 2
# Request ids are UUIDs; one per VM id, so every retry of an insert carries the same one.
REQUEST_NAMESPACE = uuid.UUID("6f1c2a52-9d0e-4f5e-8a43-6d2b1c0e7a11")


def request_id(vm_id: str) -> str:
    return str(uuid.uuid5(REQUEST_NAMESPACE, f"insert:{vm_id}"))


def gce_label(value: str) -> str:
    """A valid label value: lowercase letters, digits, _ and -, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "_", value.lower())[:63]


def gce_labels(labels: dict[str, str]) -> dict[str, str]:
    return {gce_label(k): gce_label(v) for k, v in labels.items()}


class GceBackend:
    name = "gce"

    def __init__(self, cluster: ClusterConfig, clock: Clock, credentials=None):
        self.cluster = cluster
        self.config: BackendConfig = cluster.backend
        self.project = self.config.project or ""
        self.clock = clock
        options = ClientOptions(api_endpoint=self.config.endpoint) if self.config.endpoint else None
        if self.config.endpoint and credentials is None:
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
        # credentials None: Application Default Credentials.
        self.credentials, self.client_options = credentials, options
        self.instances = compute_v1.InstancesClient(credentials=credentials, client_options=options)
        self.operations = compute_v1.ZoneOperationsClient(credentials=credentials, client_options=options)
        self._slots = asyncio.Semaphore(self.config.max_concurrent_calls)
        self._pools = {p.name: p for p in cluster.pools}
        self._gates: dict[str, _Gate] = {}  # vm id -> its guest-attribute read gate

    # ---- calls -----------------------------------------------------------------------------

    def _retrying(self) -> AsyncRetrying:
        """Retries on 429 and 5xx, with backoff and jitter, within the configured bounds."""
        cfg = self.config
        return AsyncRetrying(retry=retry_if_exception(retryable), reraise=True,
                             stop=stop_after_attempt(cfg.retry_attempts) | stop_after_delay(cfg.retry_total_s),
                             wait=wait_random_exponential(multiplier=0.2, max=10.0))

    async def _call(self, fn: Callable[..., Any], **kwargs) -> Any:
        """One API call in a worker thread, retried. The client library's own retry is off (it
        would retry some 503s for minutes on the wall clock, outside our bounds and our clock)."""
        async for attempt in self._retrying():
            with attempt:
                async with self._slots:
                    with transport_errors():
                        return await asyncio.to_thread(fn, retry=None, timeout=self.config.call_timeout_s, **kwargs)

    async def _all(self, pages) -> list:
        """Every item of a pager (iterating it fetches the next pages), as bounded as a call."""
        def drain() -> list:
            with transport_errors():
                return list(pages)

        async with self._slots:
            return await asyncio.to_thread(drain)

    async def _wait(self, op: compute_v1.Operation, zone: str, accelerator: str = "") -> CloudFailure | None:
        """Until the zone operation is done; its error, or the failure to follow it, as a failure."""
        name = op.name
        try:
            op = await self._poll(op, lambda o: o.status == compute_v1.Operation.Status.DONE,
                                  lambda: self._call(self.operations.get, project=self.project, zone=zone,
                                                     operation=name),
                                  f"operation {name}", zone)
        except gexc.GoogleAPICallError as err:
            return failure_of(err, zone)
        return op if isinstance(op, CloudFailure) else operation_failure(op, zone, accelerator)

    async def _poll(self, op, done: Callable[[Any], bool], refresh: Callable[[], Awaitable[Any]], what: str,
                    zone: str):
        """The operation once `done`, refreshed every `poll_s`; a failure past `operation_timeout_s`."""
        deadline = self.clock.now() + self.config.operation_timeout_s
        while not done(op):
            if self.clock.now() >= deadline:
                return CloudFailure("unavailable", f"{what} not done in {self.config.operation_timeout_s:.0f}s", zone)
            await self.clock.sleep(self.config.poll_s)
            try:
                op = await refresh()
            except gexc.GoogleAPICallError as err:
                if not retryable(err):
                    raise  # a retryable one leaves the operation's outcome unknown: keep following it
        return op

    # ---- CloudBackend ----------------------------------------------------------------------

    def instance_for(self, spec: LaunchSpec) -> compute_v1.Instance:
        return instance_for(spec, self._pools[spec.pool], self.config, gce_labels(spec.labels))

    async def create(self, spec: LaunchSpec) -> CloudVm | CloudFailure:
        request = compute_v1.InsertInstanceRequest(
            project=self.project, zone=spec.zone, instance_resource=self.instance_for(spec),
            request_id=request_id(spec.vm_id))
        if self.config.instance_template:
            request.source_instance_template = self.config.instance_template
        made = CloudVm(spec.vm_id, spec.zone, "provisioning", gce_labels(spec.labels))
        try:
            op = await self._call(self.instances.insert_unary, request=request)
        except gexc.Conflict:
            return await self._look(made, exists=True)  # made by an earlier attempt
        except gexc.GoogleAPICallError as err:
            failure = failure_of(err, spec.zone, spec.accelerator)
        else:
            failure = await self._wait(op, spec.zone, spec.accelerator)
            if failure is None:
                return await self._look(made, exists=True)
        if failure.retryable:
            # Retries ran out with the outcome unknown (the insert may be committed): look first.
            found = await self._look(made, exists=False)
            if isinstance(found, CloudVm):
                return found
        return failure

    async def _look(self, made: CloudVm, exists: bool) -> CloudVm | CloudFailure:
        """The instance as the cloud has it, read again while reads fail retryably (for up to
        `operation_timeout_s`). One whose insert succeeded (`exists`) is never reported gone on an
        unknown answer (it would leak): it is taken as made, and the boot wait finds out."""
        deadline = self.clock.now() + self.config.operation_timeout_s
        while True:
            found = await self._get(made.vm_id, made.zone)
            if isinstance(found, CloudVm) or found.code == "not_found":
                return found
            if exists and (not found.retryable or self.clock.now() >= deadline):
                return made
            if not found.retryable or self.clock.now() >= deadline:
                return found
            await self.clock.sleep(self.config.poll_s)

    async def where(self, vm_id: str, zone: str) -> tuple[str, str]:
        """The instance name and zone of one of our VMs: here its own id, where the core put it."""
        return vm_id, zone

    async def _get(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        try:
            name, zone = await self.where(vm_id, zone)
            inst = await self._call(self.instances.get, project=self.project, zone=zone, instance=name)
        except gexc.GoogleAPICallError as err:
            return failure_of(err, zone)
        return vm_of(inst, zone)

    async def _guest(self, vm_id: str, zone: str, max_age_s: float = 0.0) -> dict[str, str] | CloudFailure:
        """The VM's `provisioner/` guest attributes in one query, never within
        GUEST_READ_INTERVAL_S of the last read of this VM (whoever asked: boot wait, command, health).
        With `max_age_s`, a read that recent is answered again instead of waiting for a new one."""
        gate = self._gates.setdefault(vm_id, _Gate())
        if max_age_s and gate.value is not None and self.clock.now() - gate.value_at <= max_age_s:
            return gate.value
        async with gate.lock:
            if (wait := gate.last + GUEST_READ_INTERVAL_S - self.clock.now()) > 0:
                await self.clock.sleep(wait)
            gate.last = self.clock.now()
            try:
                name, zone = await self.where(vm_id, zone)
                attrs = await self._call(self.instances.get_guest_attributes,
                                         request=compute_v1.GetGuestAttributesInstanceRequest(
                                             project=self.project, zone=zone, instance=name, query_path=GUEST_PATH))
            except gexc.GoogleAPICallError as err:
                return failure_of(err, zone)
            gate.value = {item.key: item.value for item in attrs.query_value.items}
            gate.value_at = self.clock.now()
        return gate.value

    async def wait_ready(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        """Until the VM runs, has its address, and its agent reports ready. Reads that fail
        retryably are waited out (within boot_timeout_s): they say nothing about the VM."""
        deadline = self.clock.now() + self.config.boot_timeout_s
        while self.clock.now() < deadline:
            vm = await self._get(vm_id, zone)
            if isinstance(vm, CloudFailure) and not vm.retryable:
                return vm
            if isinstance(vm, CloudVm) and vm.status == "terminated":
                return CloudFailure("unavailable", f"{vm_id} stopped while booting", zone)
            if isinstance(vm, CloudVm) and vm.status == "running" and vm.endpoint:
                guest = await self._guest(vm_id, zone)
                if isinstance(guest, dict) and guest.get("ready") == "1":
                    return vm
            await self.clock.sleep(self.config.poll_s)
        return CloudFailure("unavailable", f"{vm_id} did not report ready in {self.config.boot_timeout_s:.0f}s", zone)

    async def _command(self, vm_id: str, zone: str, command: dict, on_progress: ProgressCallback | None,
                       ) -> CloudFailure | None:
        answer = await self._answer(vm_id, zone, command, on_progress)
        return answer if isinstance(answer, CloudFailure) else None

    async def _answer(self, vm_id: str, zone: str, command: dict, on_progress: ProgressCallback | None,
                      ) -> CloudFailure | str:
        """Hands the agent a command through metadata and follows its guest attributes; on success,
        the agent's answer (`ok`, or `ok <detail>`). An agent silent for `command_silence_s` is
        asked again (its answer may have been dropped); given up after ASKS askings unanswered."""
        cid = uuid.uuid4().hex[:12]
        command = {"id": cid, **command}
        deadline = self.clock.now() + self.config.command_timeout_s
        if (failure := await self._send(vm_id, zone, command, deadline)) is not None:
            return failure
        reported, interval, heard_at, acked = -1, GUEST_READ_INTERVAL_S, self.clock.now(), None
        while self.clock.now() < deadline:
            guest = await self._guest(vm_id, zone)
            changed = False
            if isinstance(guest, CloudFailure):
                if not guest.retryable:
                    return guest
            else:
                done = guest.get(f"done-{cid}")
                progress = max(reported, progress_of(guest.get(f"progress-{cid}")))
                if done == "ok":
                    progress = max(progress, command.get("bytes", 0))
                if on_progress is not None and progress != reported:
                    on_progress(progress)
                changed, reported, acked = progress != reported, progress, guest.get(f"asked-{cid}")
                if done is not None:
                    return done if done.split(" ")[0] == "ok" else CloudFailure("internal", f"agent: {done}", zone)
            if changed:
                heard_at = self.clock.now()
            elif self.clock.now() - heard_at >= self.config.command_silence_s:
                if command.get("ask", 0) - int(acked if (acked or "").isdigit() else 0) >= ASKS:  # unanswered
                    return CloudFailure("unavailable", f"the agent of {vm_id} stopped answering {command['op']}", zone)
                command["ask"], heard_at = command.get("ask", 0) + 1, self.clock.now()
                if (failure := await self._send(vm_id, zone, command, deadline)) is not None:
                    return failure
            # Nothing moving: nothing is expected soon, so read less often.
            interval = GUEST_READ_INTERVAL_S if changed else min(interval * 1.5, GUEST_IDLE_MAX_S)
            await self.clock.sleep(interval)
        return CloudFailure("unavailable", f"the agent of {vm_id} did not finish {command['op']}", zone)

    async def _send(self, vm_id: str, zone: str, command: dict, deadline: float) -> CloudFailure | None:
        """Writes the command into the instance's metadata. A concurrent metadata change is read
        again; a retryable failure is tried again until the command's deadline."""
        while True:
            try:
                name, where = await self.where(vm_id, zone)
                inst = await self._call(self.instances.get, project=self.project, zone=where, instance=name)
                items = [i for i in inst.metadata.items if i.key not in (COMMAND_KEY, GUEST_ATTRIBUTES_KEY)]
                items += [compute_v1.Items(key=GUEST_ATTRIBUTES_KEY, value="TRUE"),
                          compute_v1.Items(key=COMMAND_KEY, value=json.dumps(command))]
                op = await self._call(self.instances.set_metadata_unary, project=self.project, zone=where,
                                      instance=name, metadata_resource=compute_v1.Metadata(
                                          fingerprint=inst.metadata.fingerprint, items=items))
            except gexc.PreconditionFailed:
                failure = CloudFailure("unavailable", f"metadata of {vm_id} kept changing", zone)
            except gexc.GoogleAPICallError as err:
                failure = failure_of(err, zone)
                if not failure.retryable:
                    return failure
            else:
                failure = await self._wait(op, where)
                # Unknown whether it landed: the agent's answer (or the deadline) will tell.
                return None if failure is None or failure.retryable else failure
            if self.clock.now() >= deadline:
                return failure
            await self.clock.sleep(self.config.poll_s)

    async def pull(self, vm_id: str, zone: str, layers: Sequence[Layer], on_progress: ProgressCallback | None = None,
                   repository: str = "", digest: str = "") -> CloudFailure | None:
        total = sum(layer.size_bytes for layer in layers)
        return await self._command(vm_id, zone, {
            "op": "pull", "repository": repository, "digest": digest, "bytes": total,
            "layers": [{"id": layer.id, "bytes": layer.size_bytes} for layer in layers]}, on_progress)

    async def wipe(self, vm_id: str, zone: str) -> CloudFailure | None:
        return await self._command(vm_id, zone, {"op": "wipe"}, None)

    async def start_notebook(self, vm_id: str, zone: str, request: NotebookRequest) -> str | CloudFailure:
        """The agent answers once the container serves, with the host port it is published on."""
        answer = await self._answer(vm_id, zone, request.agent_command(), None)
        vm = answer if isinstance(answer, CloudFailure) else await self._get(vm_id, zone)
        return vm if isinstance(vm, CloudFailure) else notebook_endpoint(vm.endpoint, answer)

    async def stop_notebook(self, vm_id: str, zone: str, session_id: str) -> CloudFailure | None:
        return await self._command(vm_id, zone, {"op": "stop", "session_id": session_id}, None)

    async def delete(self, vm_id: str, zone: str) -> CloudFailure | None:
        # One request id per delete, kept by its retries: a later delete must not get this one's answer.
        try:
            op = await self._call(self.instances.delete_unary, request=compute_v1.DeleteInstanceRequest(
                project=self.project, zone=zone, instance=vm_id, request_id=str(uuid.uuid4())))
        except gexc.NotFound:
            self._gates.pop(vm_id, None)
            return None  # already gone
        except gexc.GoogleAPICallError as err:
            return failure_of(err, zone)
        if (failure := await self._wait(op, zone)) is None:
            self._gates.pop(vm_id, None)
        return failure

    async def stop(self, vm_id: str, zone: str) -> CloudFailure | None:
        # One request id per stop, kept by its retries, as for a delete.
        try:
            name, zone = await self.where(vm_id, zone)
            op = await self._call(self.instances.stop_unary, request=compute_v1.StopInstanceRequest(
                project=self.project, zone=zone, instance=name, request_id=str(uuid.uuid4())))
        except gexc.GoogleAPICallError as err:
            return failure_of(err, zone)
        if (failure := await self._wait(op, zone)) is None:
            self._gates.pop(vm_id, None)  # what its agent reported belongs to the boot that ended
        return failure

    async def start(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        try:
            name, zone = await self.where(vm_id, zone)
            op = await self._call(self.instances.start_unary, request=compute_v1.StartInstanceRequest(
                project=self.project, zone=zone, instance=name, request_id=str(uuid.uuid4())))
        except gexc.GoogleAPICallError as err:
            return failure_of(err, zone)
        if (failure := await self._wait(op, zone)) is not None:
            return failure
        return await self._look(CloudVm(vm_id, zone, "provisioning"), exists=True)

    async def list_vms(self, cluster: str) -> list[CloudVm]:
        return [vm_of(inst, zone) for inst, zone in await self._labelled(cluster)]

    async def _labelled(self, cluster: str) -> list[tuple[compute_v1.Instance, str]]:
        """Every instance carrying this cluster's label, with its zone."""
        pages = await self._call(self.instances.aggregated_list, request=compute_v1.AggregatedListInstancesRequest(
            project=self.project, filter=f"labels.{LABEL_CLUSTER} = {gce_label(cluster)}"))
        return [(inst, scope.rsplit("/", 1)[-1]) for scope, scoped in await self._all(pages)
                for inst in scoped.instances]

    async def health(self, vm_id: str, zone: str) -> HealthReport:
        vm = await self._get(vm_id, zone)
        if isinstance(vm, CloudFailure):
            # A retryable failure (429, 5xx, timeout) says nothing about the VM: unknown, not unhealthy.
            return HealthReport(vm.retryable, detail=f"unknown: {vm.message}" if vm.retryable else vm.message)
        if vm.status != "running":
            if vm.spot:  # we stop only standby VMs, and do not ask after their health
                return HealthReport(False, detail=PREEMPTED, cause="preempted")
            return HealthReport(False, detail=f"the VM is {vm.status}")
        # A read made for a command under way is recent enough: the health pass never queues
        # behind the VM's read interval.
        guest = await self._guest(vm_id, zone, max_age_s=GUEST_IDLE_MAX_S)
        usage = parse_usage(guest.get("usage")) if isinstance(guest, dict) else None
        if isinstance(guest, dict) and guest.get("preempted") == "TRUE":
            return HealthReport(False, detail=PREEMPTED, usage=usage, cause="preempted")
        if isinstance(guest, dict) and guest.get("maintenance", "NONE") != "NONE":
            return HealthReport(False, detail=maintenance(guest["maintenance"]), usage=usage, cause="maintenance")
        if isinstance(guest, dict) and guest.get("healthy") == "0":
            return HealthReport(False, detail=guest.get("health-detail", "the agent reports a fault"), usage=usage)
        return HealthReport(True, usage=usage)

    async def close(self) -> None:
        for client in (self.instances, self.operations):
            client.transport.close()


class _Gate:
    """Spaces one VM's guest-attribute reads."""

    def __init__(self):
        self.lock = asyncio.Lock()
        self.last = float("-inf")
        self.value: dict[str, str] | None = None  # what the last successful read answered, and when
        self.value_at = float("-inf")


def progress_of(value: str | None) -> int:
    """Bytes done, from the agent's `progress-<id>` ("<bytes> <seconds left>")."""
    try:
        return int((value or "0").split()[0])
    except (ValueError, IndexError):
        return 0
