"""The GPUs, through NVML: the `nvidia-ml-py` module (imported lazily, so the agent starts on a
machine without it) or any object with the same functions, such as `fakes.FakeNvml`."""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable

# Clock-throttle reason bits (nvmlClocksThrottleReason*), named as operators read them.
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    temperature_c: float
    throttle_reasons: tuple[str, ...]
    ecc_uncorrected: int
    xids: tuple[int, ...]  # XID errors seen since the last sample
    utilization_pct: int
    processes: tuple[str, ...] = field(default=())  # names of the processes using it


def real_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def nvidia_smi_reset(indices: list[int]) -> None:
    """Resets the GPUs. The driver refuses while any client holds one ("In use by another
    client"): the caller has released its own NVML handle, and nvidia-persistenced, which holds
    every GPU open, is stopped for the reset and started again after (where it runs at all)."""
    persistenced = subprocess.run(["systemctl", "is-active", "--quiet", "nvidia-persistenced"],
                                  capture_output=True).returncode == 0
    if persistenced:
        subprocess.run(["systemctl", "stop", "nvidia-persistenced"], check=True, capture_output=True, timeout=60)
    try:
        for i in indices:
            subprocess.run(["nvidia-smi", "--gpu-reset", "-i", str(i)], check=True, capture_output=True, timeout=120)
    finally:
        if persistenced:
            subprocess.run(["systemctl", "start", "nvidia-persistenced"], capture_output=True, timeout=60)


class Gpus:
    def __init__(self, nvml: Any = None, reset: Callable[[list[int]], None] = nvidia_smi_reset):
        self._nvml = nvml
        self._reset = reset
        self._events = None

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            self._nvml = real_nvml()
        return self._nvml

    def start(self) -> None:
        nv = self.nvml
        nv.nvmlInit()
        self._events = nv.nvmlEventSetCreate()
        for h in self._handles():
            try:
                nv.nvmlDeviceRegisterEvents(h, XID_CRITICAL_ERROR, self._events)
            except nv.NVMLError:
                pass  # this GPU cannot report XIDs as events

    def _handles(self) -> list:
        nv = self.nvml
        return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]

    def _xids(self) -> dict[int, list[int]]:
        """XID events waiting, by GPU index (drained without blocking)."""
        nv, out = self.nvml, {}
        if self._events is None:
            return out
        handles = self._handles()
        while True:
            try:
                event = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: none left
                return out
            index = next((i for i, h in enumerate(handles) if h == event.device), -1)
            out.setdefault(index, []).append(int(event.eventData))

    def sample(self) -> list[GpuSample]:
        nv = self.nvml
        xids = self._xids()
        out = []
        for i, h in enumerate(self._handles()):
            reasons = _optional(nv, lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h), 0)
            names = tuple(name for bit, name in THROTTLE_REASONS.items() if reasons & bit and bit != 0x1)
            ecc = _optional(nv, lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC), 0)
            util = _optional(nv, lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu, 0)
            procs = _optional(nv, lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), [])
            out.append(GpuSample(i, float(nv.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)), names, int(ecc),
                                 tuple(xids.get(i, ())), int(util), tuple(self._name(p.pid) for p in procs)))
        return out

    def _name(self, pid: int) -> str:
        nv = self.nvml
        name = _optional(nv, lambda: nv.nvmlSystemGetProcessName(pid), f"pid {pid}")
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def stop(self) -> None:
        """Releases the agent's NVML handle (and its event set)."""
        if self._events is not None:
            _optional(self.nvml, lambda: self.nvml.nvmlEventSetFree(self._events), None)
            self._events = None
        self.nvml.nvmlShutdown()

    async def reset(self) -> str:
        """Resets every GPU between users (clears its memory and state), only when nothing holds
        it: with a process still on one it resets none and says so (the driver would refuse).
        The agent's own NVML handle is released for the reset and taken again after."""
        if busy := self.busy():
            return f"GPU reset skipped: still used by {', '.join(busy)}"
        count = self.nvml.nvmlDeviceGetCount()
        if not count:
            return ""
        self.stop()
        try:
            await asyncio.to_thread(self._reset, list(range(count)))
        finally:
            self.start()
        return ""

    def busy(self) -> list[str]:
        """Processes still using a GPU (leaves XID events for the next sample)."""
        nv = self.nvml
        return [self._name(p.pid) for h in self._handles()
                for p in _optional(nv, lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), [])]


def _optional(nv: Any, read: Callable[[], Any], default: Any) -> Any:
    """A reading some GPUs do not support (NVML_ERROR_NOT_SUPPORTED) counts as its default."""
    try:
        return read()
    except nv.NVMLError:
        return default
