"""Fakes of everything outside the agent, so the whole agent runs without a GPU, a container
runtime or a metadata server: in tests, and in `provisioner agent --simulate DIR`.

Their state is a plain dict, kept in memory or in a JSON file under DIR (reread on every use, so
a test in another process can change it: start a user's process, heat a GPU, make a disk
read-only). Files: `host.json` (processes with uid and name, some using the GPU, some with
connections; directories
and their entries; disks; GPU resets), `containers.json` (layers in the store, session
containers), `gpu.json` (per GPU temperature, throttle bits, ECC count, utilization, pending XIDs).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from provisioner.agent.runtime import (ByteCallback, ContainerError, Credentials, ImageRef, NotebookSpec,
                                       Placement, Running, SessionContainer)
from provisioner.agent.host import Disk, Process
from provisioner.agent.usage import Connection
from provisioner.common.clock import Clock


class State:
    """A dict, in memory or in a JSON file (written whole and renamed into place)."""

    def __init__(self, initial: dict, path: Path | None = None):
        self.path = path
        self._data = initial
        if path is not None and not path.exists():
            self.save()

    @property
    def data(self) -> dict:
        if self.path is not None:
            for _ in range(3):  # another process may be renaming a new version into place
                try:
                    self._data = json.loads(self.path.read_text())
                    break
                except (OSError, ValueError):
                    continue
        return self._data

    def save(self) -> None:
        if self.path is not None:
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(self._data))
            os.replace(tmp, self.path)


# ---- host -------------------------------------------------------------------------------------

class FakeHost:
    """Processes (pid -> {uid, name, gpu, stubborn, connections: [[address, port], ...]}),
    directories (path -> entries), disks (path -> {free_fraction, read_only}). A stubborn process
    survives every signal."""

    def __init__(self, state: State | None = None):
        self.state = state or State({})
        d = self.state.data
        for key in ("processes", "dirs", "disks"):
            d.setdefault(key, {})
        d.setdefault("gpu_resets", 0)
        self.state.save()

    @property
    def d(self) -> dict:
        return self.state.data

    def start_process(self, pid: int, uid: int, name: str, gpu: bool = False, stubborn: bool = False,
                      connections: tuple[Connection, ...] = (), ns: int = 0) -> None:
        """`ns`: the pid namespace's first process (a container's), 0 for the host's own."""
        self.d["processes"][str(pid)] = {"uid": uid, "name": name, "gpu": gpu, "stubborn": stubborn,
                                         "connections": [[c.address, c.port] for c in connections], "ns": ns}
        self.state.save()

    def in_namespace(self, pid: int) -> list[int]:
        if not pid:
            return []
        return sorted(int(p) for p, proc in self.d["processes"].items() if proc.get("ns") == pid or int(p) == pid)

    def alive(self, pids: Iterable[int]) -> list[Process]:
        procs = self.d["processes"]
        return [Process(pid, procs[str(pid)]["uid"], procs[str(pid)]["name"]) for pid in pids if str(pid) in procs]

    def answers(self, port: int) -> bool:
        return True  # a fake container's server is up as soon as it starts

    def user_processes(self, uid_min: int) -> list[Process]:
        return [Process(int(pid), p["uid"], p["name"]) for pid, p in self.d["processes"].items() if p["uid"] >= uid_min]

    def connections(self, pids: Iterable[int]) -> list[Connection]:
        procs = self.d["processes"]
        return [Connection(a, int(port)) for pid in pids for a, port in procs.get(str(pid), {}).get("connections", [])]

    def signal(self, pid: int, sig: int) -> None:
        d = self.d
        p = d["processes"].get(str(pid))
        if p is not None and not p.get("stubborn") and sig in (signal.SIGTERM, signal.SIGKILL):
            del d["processes"][str(pid)]
            self.state.save()

    def _disk_of(self, path: Path) -> dict | None:
        best = None
        for mount, disk in self.d["disks"].items():
            if Path(path).is_relative_to(mount) and (best is None or len(mount) > len(best[0])):
                best = (mount, disk)
        return best[1] if best else None

    def clear(self, path: Path) -> None:
        disk = self._disk_of(path)
        if disk is not None and disk.get("read_only") and self.d["dirs"].get(str(path)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        d = self.d
        if str(path) in d["dirs"]:
            d["dirs"][str(path)] = []
            self.state.save()

    def entries(self, path: Path) -> list[str]:
        return sorted(self.d["dirs"].get(str(path), []))

    def make_dir(self, path: Path) -> None:
        d = self.d
        d["dirs"].setdefault(str(path), [])
        siblings = d["dirs"].setdefault(str(Path(path).parent), [])
        if Path(path).name not in siblings:
            siblings.append(Path(path).name)
        self.state.save()

    def disk(self, path: Path) -> Disk | None:
        disk = self._disk_of(path)
        if disk is None:
            return None
        return Disk(float(disk.get("free_fraction", 0.5)), bool(disk.get("read_only", False)))

    def reset_gpus(self, indices: list[int]) -> None:
        """A GPU reset as the driver does it: refused while anything holds the GPU (a process on
        it, or an open NVML handle: `nvml_holders`); otherwise counted, ending nothing."""
        d = self.d
        holders = [p["name"] for p in d["processes"].values() if p.get("gpu")]
        if holders or d.get("nvml_holders", 0):
            raise OSError(f"GPU reset refused: In use by another client ({', '.join(holders) or 'NVML'})")
        d["gpu_resets"] += len(indices)
        self.state.save()


# ---- container runtime ------------------------------------------------------------------------

class FakeRuntime:
    """The container engine: layers in the store (id -> bytes), pulled at `bytes_per_s` on the
    injected clock, in steps; session containers (id -> {session, pid, port, exit}), whose
    processes are the host's processes in their pid namespace (`ns`: the container's pid).
    `fail_pulls`: every pull fails, as an unreachable registry would; `fail_start`: a start's
    container exits at once with this reason."""

    def __init__(self, clock: Clock, host: FakeHost, state: State | None = None, bytes_per_s: float = 1e9,
                 steps: int = 4):
        self.clock, self.host, self.bytes_per_s, self.steps = clock, host, bytes_per_s, steps
        self.logins: list[Credentials | None] = []  # what each pull presented to the registry
        self.state = state or State({})
        d = self.state.data  # one read: each read of a file-backed state reloads it
        for key, empty in (("layers", {}), ("containers", {}), ("fail_pulls", False), ("fail_start", ""),
                           ("pulls", [])):
            d.setdefault(key, empty)
        self.state.save()

    async def pull(self, image: ImageRef, credentials: Credentials | None, on_bytes: ByteCallback) -> None:
        if self.state.data["fail_pulls"]:
            raise ContainerError(f"pull of {image.pinned}: registry unreachable")
        self.logins.append(credentials)
        done = 0
        for layer_id, size in image.layers:
            if layer_id in self.state.data["layers"]:
                continue  # the engine skips a layer it holds
            for k in range(1, self.steps + 1):
                await self.clock.sleep(size / self.bytes_per_s / self.steps)
                on_bytes(done + size * k // self.steps)
            done += size
            d = self.state.data
            d["layers"][layer_id] = size
            d["pulls"].append(layer_id)
            self.state.save()

    def run(self, container_id: str, session_id: str, pid: int, port: int = 0, exit_reason: str | None = None) -> None:
        """A container as the engine would hold it (its processes: host processes with ns=pid)."""
        self.state.data["containers"][container_id] = {"session": session_id, "pid": pid, "port": port,
                                                       "exit": exit_reason}
        self.state.save()

    async def start(self, spec: NotebookSpec, placement: Placement) -> Running:
        cid = f"c-{spec.session_id}"
        d = self.state.data
        if cid not in d["containers"]:
            pid = 40000 + len(d["containers"])
            self.run(cid, spec.session_id, pid, placement.host_port or 30000 + pid % 1000,
                     d["fail_start"] or None)
            if not d["fail_start"]:
                self.host.start_process(pid, 1000, "jupyter-lab", ns=pid)
        c = self.state.data["containers"][cid]
        if c["exit"]:
            raise ContainerError(c["exit"])
        return Running(cid, c["port"])

    async def exited(self, container_id: str) -> str | None:
        c = self.state.data["containers"].get(container_id)
        return "the container is gone" if c is None else c["exit"]

    async def stop(self, container_id: str, grace_s: float) -> None:
        c = self.state.data["containers"].get(container_id)
        if c is None:
            return
        for p in self.host.in_namespace(c["pid"]):
            self.host.signal(p, signal.SIGKILL)
        d = self.state.data
        d["containers"].pop(container_id, None)
        self.state.save()

    async def session_containers(self) -> list[SessionContainer]:
        return [SessionContainer(cid, c["session"], c["pid"] if not c["exit"] else 0)
                for cid, c in sorted(self.state.data["containers"].items())]


# ---- NVML -------------------------------------------------------------------------------------

class NVMLError(Exception):
    def __init__(self, value: int = 999):
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (NVML's own spelling)
    def __init__(self):
        super().__init__(3)


class NVMLError_Timeout(NVMLError):  # noqa: N801
    def __init__(self):
        super().__init__(10)


@dataclass
class _Event:
    device: Any
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815


@dataclass(frozen=True)
class _Util:
    gpu: int
    memory: int


@dataclass(frozen=True)
class _Proc:
    pid: int
    usedGpuMemory: int  # noqa: N815


class FakeNvml:
    """The subset of the `pynvml` module the agent uses, answering as NVML does: handles are
    opaque, readings a GPU lacks raise NVMLError_NotSupported, an empty event set waits out its
    timeout with NVMLError_Timeout, and nothing works before nvmlInit. GPUs: `gpu.json`-style
    dicts (temperature_c, throttle, ecc, ecc_supported, utilization, xids pending); the processes
    on a GPU are the host's processes marked `gpu`."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout

    def __init__(self, host: FakeHost, state: State | None = None, count: int = 1):
        self.host = host
        self.state = state or State({})
        gpus = self.state.data.setdefault("gpus", [])
        while len(gpus) < count:
            gpus.append({"temperature_c": 40, "throttle": 0, "ecc": 0, "ecc_supported": True,
                         "utilization": 0, "xids": []})
        self.state.save()
        self._init = 0

    def _check(self) -> None:
        if not self._init:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED

    def _gpu(self, handle) -> dict:
        self._check()
        return self.state.data["gpus"][handle[1]]

    def nvmlInit(self) -> None:  # noqa: N802
        self._init += 1
        self._hold(1)

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._check()
        self._init -= 1
        self._hold(-1)

    def _hold(self, n: int) -> None:
        """An initialised NVML holds the GPUs open, as the driver sees it."""
        self.host.d["nvml_holders"] = self.host.d.get("nvml_holders", 0) + n
        self.host.state.save()

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check()
        return len(self.state.data["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802
        self._check()
        if not 0 <= index < len(self.state.data["gpus"]):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return ("gpu-handle", index)

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:  # noqa: N802
        return int(self._gpu(handle)["temperature_c"])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle) -> int:  # noqa: N802
        return int(self._gpu(handle)["throttle"])

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type: int, counter_type: int) -> int:  # noqa: N802
        g = self._gpu(handle)
        if not g.get("ecc_supported", True):
            raise NVMLError_NotSupported()
        return int(g["ecc"])

    def nvmlDeviceGetUtilizationRates(self, handle) -> _Util:  # noqa: N802
        return _Util(int(self._gpu(handle)["utilization"]), 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle) -> list[_Proc]:  # noqa: N802
        self._gpu(handle)
        return [_Proc(int(pid), 1 << 30) for pid, p in self.host.d["processes"].items() if p.get("gpu")]

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:  # noqa: N802
        self._check()
        p = self.host.d["processes"].get(str(pid))
        if p is None:
            raise NVMLError(6)  # NVML_ERROR_NOT_FOUND
        return p["name"].encode()

    def nvmlEventSetCreate(self):  # noqa: N802
        self._check()
        return ["event-set"]

    def nvmlEventSetFree(self, event_set) -> None:  # noqa: N802
        self._check()
        del event_set[1:]

    def nvmlDeviceRegisterEvents(self, handle, event_types: int, event_set) -> None:  # noqa: N802
        self._gpu(handle)
        event_set.append(handle)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms: int) -> _Event:  # noqa: N802
        self._check()
        d = self.state.data
        for handle in event_set[1:]:
            pending = d["gpus"][handle[1]]["xids"]
            if pending:
                xid = pending.pop(0)
                self.state.save()
                return _Event(handle, 0x8, xid)
        raise NVMLError_Timeout()


class FakeMetadata:
    """Attributes with an ETag that changes with them; a wait for change returns when they
    change or after its timeout (on the injected clock); guest attributes in a dict."""

    def __init__(self, clock: Clock, attributes: dict[str, str] | None = None, writes_per_minute: int = 10):
        self.clock = clock
        self._attributes = dict(attributes or {})
        self._version = 1
        self._changed = asyncio.Event()
        self.guest: dict[str, str] = {}
        self.writes: list[tuple[str, str]] = []  # every PUT, in order
        self.reads = 0  # of the attributes
        self.value_reads = 0  # of single values (maintenance-event, preempted)
        # As Compute Engine: guest attribute writes beyond about 10 a minute may be dropped.
        self.writes_per_minute = writes_per_minute
        self.written_at: list[float] = []  # every PUT and DELETE that landed
        self.dropped: list[tuple[str, str | None]] = []
        self.values = {"instance/maintenance-event": "NONE", "instance/preempted": "FALSE"}

    def etag(self) -> str:
        return f"etag-{self._version}"

    def set(self, key: str, value: str) -> None:
        self._attributes[key] = value
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def _change_or(self, timeout_s: float) -> None:
        """Until anything changes, or `timeout_s` on the clock."""
        changed = self._changed
        timer = asyncio.ensure_future(self.clock.sleep(timeout_s))
        waiter = asyncio.ensure_future(changed.wait())
        await asyncio.wait({timer, waiter}, return_when=asyncio.FIRST_COMPLETED)
        timer.cancel()
        waiter.cancel()

    async def attributes(self, last_etag: str, timeout_s: float) -> tuple[dict[str, str], str]:
        self.reads += 1
        if last_etag == self.etag():
            await self._change_or(timeout_s)
        return dict(self._attributes), self.etag()

    def set_value(self, path: str, value: str) -> None:
        """What Compute tells the VM: host maintenance ahead, a Spot preemption."""
        self.values[path] = value
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def value(self, path: str, last_etag: str, timeout_s: float) -> tuple[str, str]:
        self.value_reads += 1
        if last_etag == f"{path}={self.values[path]}":
            await self._change_or(timeout_s)
        return self.values[path], f"{path}={self.values[path]}"

    def _lands(self, key: str, value: str | None) -> bool:
        now = self.clock.now()
        if len([t for t in self.written_at if t > now - 60.0]) >= self.writes_per_minute:
            self.dropped.append((key, value))
            return False
        self.written_at.append(now)
        return True

    async def put_guest(self, key: str, value: str) -> None:
        self.writes.append((key, value))
        if self._lands(key, value):
            self.guest[key] = value

    async def delete_guest(self, key: str) -> None:
        if self._lands(key, None):
            self.guest.pop(key, None)

    async def access_token(self) -> str:
        return "fake-access-token"
