"""What the core's scenario tests (tests/test_core*.py) share: a quiet pool's driver and ways of
reading its VMs."""

from __future__ import annotations

from core_driver import Driver, fleet, make_core
from provisioner.model.records import Vm
from provisioner.model.states import VmState as V

CATALOG = fleet().catalog
LATEST = CATALOG.latest  # gpu:v160
ZONE_C, ZONE_F = "us-central1-c", "us-central1-f"  # the us-central1 gpu-p100 zones


def driver(**pool) -> Driver:
    """A quiet pool by default: no minimum, no headroom, so only the test's requests move it."""
    return Driver(make_core(**{"min_vms": 0, "headroom_fraction": 0.0, **pool}))


def states(vm: Vm) -> list[str]:
    return [h.state for h in vm.history]


def active(d: Driver) -> list[Vm]:
    return [vm for vm in d.core.vms.values() if vm.state in (V.CREATING, V.BOOTING, V.WARM, V.ASSIGNED, V.RECYCLING)]


def no_more_than(d: Driver, n: int) -> None:
    assert len(active(d)) <= n


def idle_with(d: Driver, image: str) -> list[Vm]:
    return [vm for vm in d.core.vms.values() if vm.state is V.WARM and vm.cache.has_image(image, CATALOG)]


def bandwidth(d: Driver) -> float:
    return d.core.config.sim.pull_bytes_per_s
