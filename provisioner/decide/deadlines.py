"""How long each kind of cloud work may take before the core stops waiting for it. Pure.

A command whose answer has not come by its deadline is treated as failed (see ClusterCore): a
launch's VM fails and is deleted, its session placed again; a pull's VM is deleted, its session
placed again; a wipe's or a stop's VM is deleted; a start's VM is deleted, its session placed
again; a delete's VM fails and the reconciler retries. So no VM or session stays in creating,
booting, pulling, recycling, deleting, stopping or starting for ever because an answer was lost
or its executor died. A notebook's start that never answers fails its session (its VM is
wiped); a notebook's stop that never answers goes on to the wipe, which ends the container too.

A limit is several times the expected duration (the simulated cloud's physics, which are also
the core's estimates), plus a floor for small ones. A real cloud backend gives up by its own
timeouts first: its limits are also at least those, so its failure, with its reason, comes first.
"""

from __future__ import annotations

from provisioner.config import ClusterConfig

# Expected durations are multiplied by this...
SLACK = 4.0
# ...and never under this, so a short wipe or delete is not failed by a moment of load.
FLOOR_S = 120.0
# A notebook's start that never answers fails its session, which a user sees: it gets longer than
# the floor, so that a moment of load (a simulated cloud at x300 answers in milliseconds of wall
# time, and 120 model seconds are 0.4 s of it) fails no one's session.
NOTEBOOK_START_FLOOR_S = 600.0
# Seconds from "create" to the cloud having the VM, as the core estimates it.
CREATE_ESTIMATE_S = 5.0
# A start's p99 over its median (the simulated cloud's lognormal start time, sigma 0.6): the
# expected duration a start's limit is taken from.
START_TAIL = 4.0


class Limits:
    def __init__(self, config: ClusterConfig):
        sim, backend = config.sim, config.backend
        self.pull_bytes_per_s = sim.pull_bytes_per_s
        self.launch_s = _limit(CREATE_ESTIMATE_S + sim.boot_s + sim.boot_jitter_s)
        self.wipe_s = _limit(sim.wipe_s)
        self.delete_s = _limit(sim.delete_s)
        self.stop_s = _limit(sim.stop_s)
        self.notebook_start_s = max(NOTEBOOK_START_FLOOR_S, _limit(sim.notebook_start_s))
        self.notebook_stop_s = _limit(sim.notebook_stop_s)
        # A start's time has a long tail: the limit covers the slowest pool's median many times.
        self.start_s = _limit(max([sim.start_median_s, *sim.pool_start_median_s.values()]) * START_TAIL)
        self.pull_floor_s = FLOOR_S
        if backend.kind != "sim":
            calls = backend.retry_total_s + backend.call_timeout_s
            self.launch_s = max(self.launch_s, calls + backend.operation_timeout_s + backend.boot_timeout_s)
            self.wipe_s = max(self.wipe_s, calls + backend.command_timeout_s)
            self.delete_s = max(self.delete_s, calls + backend.operation_timeout_s)
            self.stop_s = max(self.stop_s, calls + backend.operation_timeout_s)
            self.notebook_start_s = max(self.notebook_start_s, calls + backend.command_timeout_s)
            self.notebook_stop_s = max(self.notebook_stop_s, calls + backend.command_timeout_s)
            self.start_s = max(self.start_s, calls + backend.operation_timeout_s + backend.boot_timeout_s)
            self.pull_floor_s = max(self.pull_floor_s, calls + backend.command_timeout_s)

    def pull_s(self, nbytes: int) -> float:
        return max(self.pull_floor_s, _limit(nbytes / self.pull_bytes_per_s))


def _limit(expected_s: float) -> float:
    return max(FLOOR_S, SLACK * expected_s)
