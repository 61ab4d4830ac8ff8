"""Pure: is the VM fit for a session, and if not, why (the detail the session fails with)."""

from __future__ import annotations

from pathlib import Path

from provisioner.agent.config import AgentConfig
from provisioner.agent.gpu import GpuSample
from provisioner.agent.host import Disk


def assess(gpus: list[GpuSample], disks: dict[Path, Disk | None], cfg: AgentConfig) -> list[str]:
    """Every threshold crossed, worst first; empty when healthy."""
    faults = []
    for g in gpus:
        if fatal := [x for x in g.xids if x in cfg.fatal_xids]:
            faults.append(f"GPU {g.index}: XID {', '.join(map(str, fatal))}")
        if g.ecc_uncorrected > cfg.ecc_uncorrected_max:
            faults.append(f"GPU {g.index}: {g.ecc_uncorrected} uncorrectable ECC errors")
        if g.temperature_c >= cfg.gpu_temperature_max_c:
            why = f"; throttling: {', '.join(g.throttle_reasons)}" if g.throttle_reasons else ""
            faults.append(f"GPU {g.index} at {g.temperature_c:.0f} C (limit {cfg.gpu_temperature_max_c:.0f} C){why}")
    for path, disk in disks.items():
        if disk is None:
            continue
        if disk.read_only:
            faults.append(f"the file system of {path} is read-only")
        elif disk.free_fraction < cfg.disk_free_min_fraction:
            faults.append(f"the disk of {path} is full ({disk.free_fraction:.1%} free)")
    return faults

