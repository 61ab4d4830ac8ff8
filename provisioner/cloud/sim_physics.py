"""The simulated cloud's physics: how long things take and whether a launch gets its GPUs. Pure
and seeded: the trace-driven simulator (provisioner/sim/engine.py) uses it directly, without
asyncio, and SimCloud (provisioner/cloud/sim.py) over a clock.
"""

from __future__ import annotations

import math
import random
import zlib
from typing import Protocol

from provisioner.cloud.base import CloudFailure


class SimConfigLike(Protocol):
    """What the sim needs from its config (config.SimCloudConfig has these fields)."""

    boot_s: float
    boot_jitter_s: float
    pull_bytes_per_s: float
    wipe_s: float
    delete_s: float
    stop_s: float
    notebook_start_s: float
    notebook_stop_s: float
    start_median_s: float
    start_sigma: float
    pool_start_median_s: dict[str, float]
    stocked_out_zones: list[str]
    launch_failure_rate: float
    seed: int


class SimPhysics:
    """Durations and launch outcomes; deterministic for a given seed and call sequence."""

    CREATE_S = 3.0  # the insert operation, before the VM starts booting
    CREATE_JITTER_S = 1.0

    def __init__(self, config: SimConfigLike):
        self.config = config
        self.rng = random.Random(config.seed)
        # Mutable: stockouts come and go during a run.
        self.stocked_out: set[str] = set(config.stocked_out_zones)

    def create_s(self) -> float:
        return self.CREATE_S + self.rng.uniform(-self.CREATE_JITTER_S, self.CREATE_JITTER_S)

    def boot_s(self) -> float:
        j = self.config.boot_jitter_s
        return max(0.0, self.config.boot_s + (self.rng.uniform(-j, j) if j else 0.0))

    def pull_s(self, nbytes: int) -> float:
        return nbytes / self.config.pull_bytes_per_s if nbytes > 0 else 0.0

    def wipe_s(self) -> float:
        return self.config.wipe_s

    def delete_s(self) -> float:
        return self.config.delete_s

    def stop_s(self) -> float:
        return self.config.stop_s

    def notebook_start_s(self) -> float:
        return self.config.notebook_start_s

    def notebook_stop_s(self) -> float:
        return self.config.notebook_stop_s

    def start_s(self, pool: str) -> float:
        """A stopped VM of `pool` started, until its agent answers: lognormal, a long tail."""
        c = self.config
        median = c.pool_start_median_s.get(pool, c.start_median_s)
        return self.rng.lognormvariate(math.log(median), c.start_sigma) if c.start_sigma else median

    def launch_outcome(self, zone: str) -> CloudFailure | None:
        """Whether a create, or a start (a stopped VM holds no GPU), gets its GPUs in `zone`."""
        if zone in self.stocked_out:
            return CloudFailure("stockout", f"zone {zone} has no GPUs of this shape (ZONE_RESOURCE_POOL_EXHAUSTED)", zone)
        rate = self.config.launch_failure_rate
        # Draw only when failures are on, so turning them off does not shift other durations.
        if rate > 0 and self.rng.random() < rate:
            return CloudFailure("unavailable", f"simulated launch failure in {zone}", zone)
        return None

    # Only launches fail in the simulated cloud; the tests' driver fails the others on demand.
    def pull_outcome(self, zone: str) -> CloudFailure | None:
        return None

    def wipe_outcome(self, zone: str) -> CloudFailure | None:
        return None

    def notebook_outcome(self, zone: str) -> CloudFailure | None:
        return None

    @staticmethod
    def gpu_temperature_c(vm_id: str) -> float:
        # Stable per VM and independent of the rng, so health checks do not shift durations.
        return 45.0 + (zlib.crc32(vm_id.encode()) % 2500) / 100.0
