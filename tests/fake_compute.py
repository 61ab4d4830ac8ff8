"""A local fake of the Compute Engine REST endpoints the gce and gke backends use, for the real
google-cloud-compute client to talk to: instances (insert, get, delete, stop, start, aggregated
list, setMetadata, setLabels, getGuestAttributes), managed instance groups (listManagedInstances,
deleteInstances: a GKE node pool's nodes) and zone operations (get).

It plays the VM's agent too: a booted instance reports `provisioner/ready`, and a command set in
the `provisioner-command` metadata item is carried out after a delay, reporting progress and
completion as guest attributes. With `agents="external"` it does not: each instance then has its
own metadata server (tests/fake_metadata.py) for a real agent process to talk to. Fault injection: stocked-out or over-quota zones (the insert's
operation fails, as on GCE, or with `sync_zone_errors` the insert itself answers 503 or 403), the
next N calls of a method answering an HTTP error (429, 503, 403 with a reason), slow
operations, a slow API (every answer delayed), failed operations, and an insert that commits and
then answers 503 or answers nothing until the client has timed out (the client retries it with
the same request id), and a stop or start carried out and then answered 503. A stop takes
`stop_s` (STOPPING, then TERMINATED: the instance and its disks stay, its agent's guest attributes
go); a start boots it again, and meets a stocked-out or over-quota zone as an insert does. Every request is logged, and the most requests ever in flight at once kept.

As Compute documents (compute_answers.py): a quota is exceeded per metric and region, or
globally (`exceed_quota`), and its error names both; a stockout may name the zones that have the
shape (`zones_available`); an insert from an instance template takes the template's properties
under its own; inserts Compute refuses (a bad name, GPUs without onHostMaintenance TERMINATE, a
Spot VM that restarts, a custom-mode network without a subnetwork) answer 400. Host maintenance
ahead and a Spot preemption (`announce_maintenance`, `preempt`) show on the instance's metadata
server; an emulated agent's answer can be dropped (`drop_done`), as one written beyond the
guest-attribute rate may be.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from urllib.parse import parse_qs, urlparse

from compute_answers import (error_body, gpu_metric, http_status, invalid_insert, label_filter, quota_message,
                             zone_error)
from fake_compute_vms import Call, Instance
from fake_http import FakeHttpServer

ZONE_PATH = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/(?P<rest>.*)$")
AGGREGATED = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/instances$")


class FakeCompute:
    def __init__(self, boot_s: float = 0.2, op_s: float = 0.05, command_s: float = 0.1, agents: str = "emulated",
                 stop_s: float = 0.1):
        self.boot_s, self.op_s, self.command_s, self.stop_s = boot_s, op_s, command_s, stop_s
        self.agents = agents  # "emulated" here, or "external": real agents through metadata servers
        self.instances: dict[tuple[str, str], Instance] = {}  # (project, name)
        self.operations: dict[str, dict] = {}
        self.by_request_id: dict[str, str] = {}  # insert/delete request id -> operation name
        self.migs: dict[tuple[str, str, str], list[str]] = {}  # (project, zone, group) -> instance names
        self.log: list[Call] = []
        self.stocked_out: set[str] = set()
        self.zones_available: dict[str, list[str]] = {}  # a stocked-out zone's hint: zones that have the shape
        # Exceeded quotas as Compute scopes them: (metric, region), e.g. ("NVIDIA_T4_GPUS",
        # "us-central1"), or (metric, "global") for a project-wide one (GPUS_ALL_REGIONS).
        self.quotas_exceeded: set[tuple[str, str]] = set()
        self.templates: dict[str, dict] = {}  # instance template URL -> its properties
        self.custom_networks: set[str] = set()  # custom-mode networks: an insert must name a subnetwork
        self.sync_zone_errors = False  # stockout and quota as the insert's answer, not the operation's
        self.failing: dict[str, list[tuple[int, str]]] = {}  # op -> (status, reason) for its next calls
        self.fail_operations = 0  # the next N operations end with an error
        self.commit_then_fail = 0  # the next N inserts are made, then answered 503
        self.commit_then_stall = 0  # the next N inserts are made, then answered after stall_s
        self.answers_lost: dict[str, int] = {}  # "stop"/"start" -> the next N are carried out, then answered 503
        self.stall_s = 1.0
        self.drop_done = 0  # emulated agents: the next N answers (done-<id>) are dropped, as beyond the rate
        self.latency_s = 0.0  # every answer waits this long
        self.in_flight = self.max_in_flight = 0
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self.metadata_changed = threading.Condition(self._lock)  # wakes metadata wait-for-change
        self._http = FakeHttpServer(self._answer, ("GET", "POST", "DELETE"))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._http.port}"

    def start(self) -> FakeCompute:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    # ---- fault injection and inspection -----------------------------------------------------

    def exceed_quota(self, metric: str, region: str = "global") -> None:
        self.quotas_exceeded.add((metric, region))

    def fail_next(self, op: str, status: int, count: int = 1, reason: str = "") -> None:
        self.failing.setdefault(op, []).extend([(status, reason)] * count)

    def calls(self, op: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self.log if op is None or c.op == op]

    def plant(self, project: str, zone: str, name: str, labels: dict[str, str]) -> None:
        """A running instance nobody asked this fake for (e.g. left behind by a lost record)."""
        with self._lock:
            self.instances[(project, name)] = Instance(name, zone, {"name": name, "labels": labels}, time.time() - 60,
                                                       "RUNNING", {"ready": "1"})

    def running(self, project: str) -> dict[str, Instance]:
        """The project's instances that have booted, by name."""
        with self._lock:
            for inst in self.instances.values():
                inst.advance(time.time(), self)
            return {name: inst for (p, name), inst in self.instances.items() if p == project and inst.status == "RUNNING"}

    def status(self, project: str, name: str) -> str:
        """An instance's status now (instances advance by wall time as they are looked at)."""
        with self._lock:
            inst = self.instances[(project, name)]
            inst.advance(time.time(), self)
            return inst.status

    def announce_maintenance(self, project: str, name: str, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        """What Compute tells a GPU VM ahead of host maintenance (through its metadata server)."""
        with self._lock:
            inst = self.instances[(project, name)]
            inst.maintenance_event = event
            if self.agents == "emulated":
                inst.guest["maintenance"] = event
            self.metadata_changed.notify_all()

    def preempt(self, project: str, name: str) -> None:
        """A Spot VM preempted: `instance/preempted` turns TRUE and Compute stops it (its
        instanceTerminationAction STOP: the instance and its disk stay, TERMINATED)."""
        with self._lock:
            inst = self.instances[(project, name)]
            inst.preempted = "TRUE"
            if self.agents == "emulated":
                inst.guest["preempted"] = "TRUE"
            inst.status, inst.stopping_since = "STOPPING", time.time()
            self.metadata_changed.notify_all()

    def names(self, project: str) -> set[str]:
        with self._lock:
            return {name for (p, name) in self.instances if p == project}

    # ---- behaviour --------------------------------------------------------------------------

    def _operation(self, project: str, zone: str, kind: str, target: str, error: dict | None = None,
                   takes_s: float = 0.0) -> dict:
        name = f"operation-{next(self._ids)}"
        if error is None and self.fail_operations:
            self.fail_operations -= 1
            error = {"code": "INTERNAL_ERROR", "message": "injected operation failure"}
        op = {"kind": "compute#operation", "id": str(next(self._ids)), "name": name, "zone": zone,
              "operationType": kind, "targetLink": f"projects/{project}/zones/{zone}/instances/{target}",
              "status": "RUNNING", "_done_at": time.time() + max(self.op_s, takes_s), "_error": error}
        self.operations[name] = op
        return op

    def _op_view(self, op: dict) -> dict:
        view = {k: v for k, v in op.items() if not k.startswith("_")}
        if time.time() >= op["_done_at"]:
            view["status"] = "DONE"
            if op["_error"]:
                view["error"] = {"errors": [op["_error"]]}
                view["httpErrorStatusCode"] = http_status(op["_error"]["code"])
        return view

    def _instance_view(self, inst: Instance) -> dict:
        inst.advance(time.time(), self)
        return {**inst.body, "name": inst.name, "status": inst.status, "kind": "compute#instance",
                "zone": f"projects/x/zones/{inst.zone}", "id": str(abs(hash(inst.name)) % 10**12)}

    def handle(self, method: str, url: str, body: dict) -> tuple[int, dict, float]:
        """(HTTP status, body, seconds to wait before answering)."""
        parsed = urlparse(url)
        query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
        path = parsed.path
        with self._lock:
            if m := AGGREGATED.match(path):
                return self._logged(Call(method, "list", m["project"], "", "", query, body), self._list(m["project"], query))
            m = ZONE_PATH.match(path)
            if not m:
                return 404, error_body(404, f"no route {method} {path}")
            project, zone, rest = m["project"], m["zone"], m["rest"]
            parts = rest.split("/")
            if parts[0] == "operations" and len(parts) == 2:
                call = Call(method, "operations.get", project, zone, "", query, body)
                return self._logged(call, self._get_operation(parts[1]))
            if parts[0] == "instanceGroupManagers" and len(parts) == 3:
                call = Call(method, parts[2], project, zone, parts[1], query, body)
                handler = {"listManagedInstances": self._mig_list, "deleteInstances": self._mig_delete}.get(parts[2])
                if handler is None:
                    return self._logged(call, (404, error_body(404, f"no route {method} {path}")))
                return self._logged(call, handler(project, zone, parts[1], body))
            instance = parts[1] if len(parts) > 1 else body.get("name", "")
            op = {("POST", 1): "insert", ("GET", 2): "get", ("DELETE", 2): "delete"}.get((method, len(parts)))
            if op is None and len(parts) == 3:
                op = parts[2]  # setMetadata, getGuestAttributes
            call = Call(method, op or "?", project, zone, instance, query, body)
            if self.failing.get(call.op):
                status, reason = self.failing[call.op].pop(0)
                return self._logged(call, (status, error_body(status, f"injected {status} {reason}", reason)))
            handler = {"insert": self._insert, "get": self._get, "delete": self._delete, "setLabels": self._set_labels,
                       "setMetadata": self._set_metadata, "getGuestAttributes": self._guest,
                       "stop": self._stop, "start": self._start}.get(call.op)
            if handler is None:
                return self._logged(call, (404, error_body(404, f"no route {method} {path}")))
            return self._logged(call, handler(project, zone, instance, query, body))

    def _logged(self, call: Call, result: tuple) -> tuple[int, dict, float]:
        call.status = result[0]
        self.log.append(call)
        return result if len(result) == 3 else (*result, self.latency_s)

    def _insert(self, project, zone, name, query, body):
        rid = query.get("requestId")
        if rid and rid in self.by_request_id:  # a retried insert: the operation it already started
            return 200, self._op_view(self.operations[self.by_request_id[rid]])
        if (project, name) in self.instances:
            return 409, error_body(409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
                               "alreadyExists")
        if template := query.get("sourceInstanceTemplate"):
            if template not in self.templates:
                return 404, error_body(404, f"The resource '{template}' was not found")
            body = {**self.templates[template], **body}  # what the request sets overrides the template
        if (invalid := invalid_insert(body, self.custom_networks)) is not None:
            return 400, error_body(400, invalid, "invalid")
        if zone in self.stocked_out or self._quota_hit(zone, body):
            if self.sync_zone_errors:
                return self._zone_error(project, zone, body)
            op = self._zone_failed_operation(project, zone, "insert", name, body)
        else:
            body = {**body, "metadata": {**body.get("metadata", {}), "fingerprint": f"fp-{next(self._ids)}"},
                    "networkInterfaces": self._nics(body)}
            self.instances[(project, name)] = Instance(name, zone, body, time.time())
            op = self._operation(project, zone, "insert", name)
        if rid:
            self.by_request_id[rid] = op["name"]
        if self.commit_then_fail and (project, name) in self.instances:
            self.commit_then_fail -= 1
            return 503, error_body(503, "injected: the insert was committed but the answer was lost")
        if self.commit_then_stall and (project, name) in self.instances:
            self.commit_then_stall -= 1
            return 200, self._op_view(op), self.stall_s
        return 200, self._op_view(op)

    def _quota_hit(self, zone: str, body: dict) -> tuple[str, str] | None:
        """The exceeded quota an instance of this shape would go over in this zone: its GPU's
        metric in the zone's region, or the project's GPUs in all regions."""
        accelerators = body.get("guestAccelerators") or []
        if not accelerators:
            return None
        region = zone.rsplit("-", 1)[0]
        for key in ((gpu_metric(accelerators[0]["acceleratorType"]), region), ("GPUS_ALL_REGIONS", "global")):
            if key in self.quotas_exceeded:
                return key
        return None

    def _zone_error(self, project: str, zone: str, body: dict) -> tuple[int, dict]:
        """A stocked-out or over-quota zone as the call's own answer, as GCE words it: the code is
        only in the reason."""
        if zone in self.stocked_out:
            return 503, error_body(503, f"The zone 'projects/{project}/zones/{zone}' does not have enough "
                                    "resources available to fulfill the request.", "ZONE_RESOURCE_POOL_EXHAUSTED")
        metric, region = self._quota_hit(zone, body)
        return 403, error_body(403, quota_message(metric, region), "quotaExceeded")

    def _zone_failed_operation(self, project: str, zone: str, kind: str, name: str, body: dict) -> dict:
        """The operation's error as Compute gives it (compute_answers.zone_error)."""
        quota = None if zone in self.stocked_out else self._quota_hit(zone, body)
        vm_type = body.get("machineType", "").rsplit("/", 1)[-1]
        return self._operation(project, zone, kind, name,
                               zone_error(project, zone, quota, self.zones_available.get(zone), vm_type))

    def _stop(self, project, zone, name, query, body):
        inst = self.instances.get((project, name))
        if inst is None or inst.zone != zone:
            return 404, error_body(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        if (rid := query.get("requestId")) in self.by_request_id:
            return 200, self._op_view(self.operations[self.by_request_id[rid]])
        inst.advance(time.time(), self)
        takes_s = 0.0
        if inst.status != "TERMINATED":  # stopping a stopped instance is done at once
            if inst.status != "STOPPING":
                inst.status, inst.stopping_since = "STOPPING", time.time()
            takes_s = inst.stopping_since + self.stop_s - time.time()
        return self._answered(query, "stop", self._operation(project, zone, "stop", name, takes_s=takes_s))

    def _start(self, project, zone, name, query, body):
        inst = self.instances.get((project, name))
        if inst is None or inst.zone != zone:
            return 404, error_body(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        if (rid := query.get("requestId")) in self.by_request_id:
            return 200, self._op_view(self.operations[self.by_request_id[rid]])
        inst.advance(time.time(), self)
        if inst.status == "STOPPING":
            return 400, error_body(400, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready",
                               "resourceNotReady")
        if inst.status != "TERMINATED":  # running or booting already: nothing to do
            return self._answered(query, "start", self._operation(project, zone, "start", name))
        if zone in self.stocked_out or self._quota_hit(zone, inst.body):  # a stopped instance holds no GPU
            if self.sync_zone_errors:
                return self._zone_error(project, zone, inst.body)
            return self._answered(query, "start", self._zone_failed_operation(project, zone, "start", name, inst.body))
        inst.status, inst.created = "PROVISIONING", time.time()  # boots again from now
        return self._answered(query, "start", self._operation(project, zone, "start", name))

    def _answered(self, query: dict, kind: str, op: dict) -> tuple[int, dict]:
        """A stop's or start's answer, or its loss: the operation runs either way."""
        if rid := query.get("requestId"):
            self.by_request_id[rid] = op["name"]
        if self.answers_lost.get(kind):
            self.answers_lost[kind] -= 1
            return 503, error_body(503, f"injected: the {kind} was carried out but the answer was lost")
        return 200, self._op_view(op)

    def _nics(self, body: dict) -> list[dict]:
        """The instance's interfaces, the first with an internal address as Compute assigns one."""
        nics = [dict(n) for n in body.get("networkInterfaces") or [{"network": "global/networks/default"}]]
        n = next(self._ids)
        nics[0]["networkIP"] = f"10.128.{n // 250 % 250}.{n % 250 + 2}"
        return nics

    def _set_labels(self, project, zone, name, query, body):
        inst = self.instances.get((project, name))
        if inst is None or inst.zone != zone:
            return 404, error_body(404, "not found")
        inst.body["labels"] = dict(body.get("labels", {}))
        return 200, self._op_view(self._operation(project, zone, "setLabels", name))

    # ---- managed instance groups (the nodes of a GKE node pool) -------------------------------

    def resize_group(self, project: str, zone: str, group: str, size: int) -> None:
        """What GKE does to a node pool's instance group on a resize: grow with fresh instances,
        shrink by the newest."""
        with self._lock:
            names = self.migs.setdefault((project, zone, group), [])
            while len(names) < size:
                name = f"{group}-{next(self._ids):04d}"
                body = {"name": name, "labels": {"goog-gke-node": ""}, "metadata": {"fingerprint": "fp-node"},
                        "networkInterfaces": self._nics({})}
                self.instances[(project, name)] = Instance(name, zone, body, time.time())
                names.append(name)
            while len(names) > size:
                self.instances.pop((project, names.pop()), None)

    def _mig_list(self, project, zone, group, body):
        names = self.migs.get((project, zone, group))
        if names is None:
            return 404, error_body(404, f"instance group manager {group} not found")
        out = [{"instance": f"https://compute.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/{n}",
                "instanceStatus": self._instance_view(self.instances[(project, n)])["status"], "currentAction": "NONE"}
               for n in names]
        return 200, {"managedInstances": out}

    def _mig_delete(self, project, zone, group, body):
        names = self.migs.get((project, zone, group))
        if names is None:
            return 404, error_body(404, f"instance group manager {group} not found")
        for url in body.get("instances", []):
            name = url.rsplit("/", 1)[-1]
            if name in names:
                names.remove(name)
                self.instances.pop((project, name), None)
        return 200, self._op_view(self._operation(project, zone, "deleteInstances", group))

    def _get(self, project, zone, name, query, body):
        inst = self.instances.get((project, name))
        if inst is None or inst.zone != zone:
            return 404, error_body(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        return 200, self._instance_view(inst)

    def _delete(self, project, zone, name, query, body):
        inst = self.instances.get((project, name))
        if inst is None or inst.zone != zone:
            return 404, error_body(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        del self.instances[(project, name)]
        return 200, self._op_view(self._operation(project, zone, "delete", name))

    def _set_metadata(self, project, zone, name, query, body):
        inst = self.instances.get((project, name))
        if inst is None or inst.zone != zone:
            return 404, error_body(404, "not found")
        current = inst.body.get("metadata", {}).get("fingerprint", "")
        if body.get("fingerprint", "") != current:
            return 412, error_body(412, "Supplied fingerprint does not match current metadata fingerprint.",
                               "conditionNotMet")
        items = {i["key"]: i.get("value", "") for i in body.get("items", [])}
        inst.body["metadata"] = {"items": body.get("items", []), "fingerprint": f"fp-{next(self._ids)}"}
        self.metadata_changed.notify_all()
        if "provisioner-command" in items and self.agents == "emulated":
            cmd, pending = json.loads(items["provisioner-command"]), json.loads(inst.guest.get("_pending", "{}"))
            if cmd.get("ask") and pending.get("id") == cmd["id"]:  # asked while at work: says so, runs on
                inst.guest[f"asked-{cmd['id']}"] = str(cmd["ask"])
            else:
                inst.guest["_pending"] = json.dumps({**cmd, "_at": time.time()})
        return 200, self._op_view(self._operation(project, zone, "setMetadata", name))

    def _guest(self, project, zone, name, query, body):
        inst = self.instances.get((project, name))
        if inst is None or inst.zone != zone:
            return 404, error_body(404, "not found")
        inst.advance(time.time(), self)
        prefix = query.get("queryPath", "").removeprefix("provisioner/")
        items = [{"namespace": "provisioner", "key": k, "value": v} for k, v in sorted(inst.guest.items())
                 if not k.startswith("_") and k.startswith(prefix)]
        return 200, {"kind": "compute#guestAttributes", "queryPath": query.get("queryPath", ""),
                     "queryValue": {"items": items}}

    def _get_operation(self, name: str):
        op = self.operations.get(name)
        if op is None:
            return 404, error_body(404, f"operation {name} not found")
        return 200, self._op_view(op)

    def _list(self, project: str, query: dict):
        wanted = label_filter(query.get("filter", ""))
        zones: dict[str, dict] = {}
        for (p, _), inst in self.instances.items():
            labels = inst.body.get("labels", {})
            if p == project and all(labels.get(k) == v for k, v in wanted.items()):
                zones.setdefault(f"zones/{inst.zone}", {"instances": []})["instances"].append(self._instance_view(inst))
        return 200, {"kind": "compute#instanceAggregatedList", "items": zones}

    def _answer(self, method: str, path: str, headers, raw: bytes) -> tuple[int, bytes, dict[str, str]]:
        body = json.loads(raw) if raw else {}
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            status, out, stall_s = self.handle(method, path, body)
            time.sleep(stall_s)
        finally:
            with self._lock:
                self.in_flight -= 1
        return status, json.dumps(out).encode(), {"Content-Type": "application/json"}
