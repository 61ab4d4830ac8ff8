"""An on-demand pool's Spot tier: which VM a session takes (interactive never a Spot one), which
stopped VM it starts, how many of the pool's VMs are Spot, and the core making them so."""

from __future__ import annotations

import pytest
from core_driver import Driver, fleet, make_core

from provisioner.config import ConfigError
from provisioner.decide.commands import Launch
from provisioner.decide.spot_tier import (BatchShare, choose_in_tier, spot_launches, spot_target, split_deletions,
                                          split_warm, standby_in_tier)
from provisioner.model.images import LayerCache
from provisioner.model.records import SessionKind, StartKind, Vm
from provisioner.model.states import SessionState as S
from provisioner.model.states import VmState as V

CATALOG = fleet().catalog
IMAGE = "gpu:v160"


def vm(name: str, spot: bool, image: str, state: V = V.WARM) -> Vm:
    """A VM holding `image` (another version: the session's image is a partial pull away)."""
    cache = LayerCache(250 * 10**9)
    cache.add(image, CATALOG, 0.0)
    return Vm(id=name, cluster="c", pool="p", zone="z", cache=cache, created_at=0.0, state=state, spot=spot)


# Names: s = Spot, d = on demand; then what the VM holds: x the exact image, near one sharing most
# of its layers (v159), far one sharing fewer (v141).
HOLDS = {"x": IMAGE, "near": "gpu:v159", "far": "gpu:v141"}


def vms(*names: str, state: V = V.WARM) -> list[Vm]:
    return [vm(n, n.startswith("s"), HOLDS[n[2:]], state) for n in names]


@pytest.mark.parametrize("batch, ready, chosen, start", [
    # Interactive: on-demand VMs only, whatever a Spot VM holds.
    (False, ("s-x", "d-far"), "d-far", StartKind.PARTIAL),
    (False, ("s-x", "s-near"), "", StartKind.COLD),
    (False, ("d-near", "d-x"), "d-x", StartKind.WARM),
    # Batch: a Spot VM holding the image first...
    (True, ("d-x", "s-x"), "s-x", StartKind.WARM),
    # ...else an on-demand one holding it (no pull, so a fast start)...
    (True, ("s-near", "d-x"), "d-x", StartKind.WARM),
    # ...else the VM missing the fewest bytes, Spot on a tie.
    (True, ("d-far", "s-near"), "s-near", StartKind.PARTIAL),
    (True, ("s-far", "d-near"), "d-near", StartKind.PARTIAL),
    (True, ("d-near", "s-near"), "s-near", StartKind.PARTIAL),
    (True, ("d-far",), "d-far", StartKind.PARTIAL),
    (True, (), "", StartKind.COLD),
])
def test_which_warm_vm_a_session_takes(batch, ready, chosen, start):
    choice = choose_in_tier(IMAGE, vms(*ready), CATALOG, batch)
    assert (choice.vm_id, choice.start) == (chosen, start)


@pytest.mark.parametrize("stopped, spot, either, started", [
    (("s-x", "d-far"), False, False, "d-far"),  # an interactive session: on demand only
    (("s-x",), False, False, None),
    (("d-x", "s-far"), True, True, "s-far"),  # a batch session: Spot first, even with more to pull
    (("d-x",), True, True, "d-x"),  # ...else on demand
    (("d-far", "s-x", "d-x"), False, True, "d-x"),  # the autoscaler filling its on-demand part
])
def test_which_stopped_vm_is_started(stopped, spot, either, started):
    chosen = standby_in_tier(IMAGE, vms(*stopped, state=V.STANDBY), CATALOG, lambda v: True, spot, either)
    assert (chosen.id if chosen else None) == started


@pytest.mark.parametrize("all_arrivals, interactive, split", [
    (10, 7, (10, 3)),  # the on-demand VMs cover the interactive arrivals, Spot ones the rest
    (10, 0, (10, 10)),  # no interactive arrivals: all Spot
    (10, 10, (10, 0)),  # no batch arrivals: none
    (6, 8, (8, 0)),  # interactive arrivals alone ask more than all together (rounding): theirs
])
def test_predictive_warm_vms_split_between_the_tiers(all_arrivals, interactive, split):
    assert split_warm(all_arrivals, interactive) == split


@pytest.mark.parametrize("wanted, share, target", [(10, 0.0, 0), (10, 0.31, 3), (10, 1.0, 10), (3, 0.3, 0)])
def test_the_spot_part_is_the_batch_share_rounded_down(wanted, share, target):
    assert spot_target(wanted, share) == target


@pytest.mark.parametrize("launch, spot_idle, target, spot", [(5, 0, 3, 3), (5, 2, 3, 1), (2, 0, 3, 2), (4, 6, 3, 0)])
def test_new_vms_go_to_the_spot_part_up_to_its_shortfall(launch, spot_idle, target, spot):
    assert spot_launches(launch, spot_idle, target) == spot


@pytest.mark.parametrize("surplus, spot_idle, on_demand_idle, spot_over, split", [
    (3, 4, 4, 2, (2, 1)),  # the Spot VMs over their part first, then on demand
    (3, 4, 4, -1, (0, 3)),  # Spot short of its part: on-demand VMs go
    (3, 4, 1, 0, (2, 1)),  # too few on-demand idle: Spot ones after all
    (2, 1, 0, 5, (1, 0)),  # never more than there are
])
def test_scale_down_takes_the_tier_over_its_part_first(surplus, spot_idle, on_demand_idle, spot_over, split):
    assert split_deletions(surplus, spot_idle, on_demand_idle, spot_over) == split


def test_the_batch_share_of_arrivals_decays():
    share = BatchShare()
    assert share.share(0.0) == 0.0
    for _ in range(3):
        share.arrival(0.0, batch=True)
    share.arrival(0.0, batch=False)
    assert share.share(0.0) == pytest.approx(0.75)
    for _ in range(4):
        share.arrival(6 * 3600.0, batch=False)  # two half-lives on: the old batch arrivals weigh a quarter
    assert share.share(6 * 3600.0) == pytest.approx(0.75 / 5)


def tier_pool(headroom_fraction: float = 1.0) -> Driver:
    return Driver(make_core(min_vms=0, headroom_fraction=headroom_fraction, spot_tier=True))


def launches(d: Driver, since: float) -> list[Launch]:
    return d.commands(Launch, since=since)


def running(d: Driver, *sessions) -> None:
    """Until each runs: a cold start pulls its whole image (about ten minutes)."""
    d.run_until(lambda: all(s.state is S.RUNNING for s in sessions), 1800)


def test_a_batch_session_gets_a_spot_vm_and_an_interactive_one_never():
    d = tier_pool()
    notebook = d.allocate(user="ada")
    job = d.allocate(user="bob", kind=SessionKind.BATCH)
    running(d, notebook, job)
    assert not d.vms[notebook.vm_id].spot and d.vms[job.vm_id].spot
    made = {c.vm_id: c.spot for c in d.commands(Launch)}  # the Launch commands say so to the backend
    assert made[notebook.vm_id] is False and made[job.vm_id] is True
    d.stop(notebook), d.stop(job)
    d.run_until(lambda: d.vms[job.vm_id].state is V.WARM and d.vms[notebook.vm_id].state is V.WARM, 600)
    # Both VMs idle and holding the image: each kind gets its own tier's.
    again = d.allocate(user="cy", kind=SessionKind.BATCH)
    assert again.vm_id == job.vm_id and again.state is S.STARTING
    other = d.allocate(user="dan")
    assert other.vm_id == notebook.vm_id


def test_the_autoscaler_keeps_the_batch_share_of_its_warm_vms_on_spot():
    d = tier_pool(headroom_fraction=2.0)  # two warm VMs per VM in use
    jobs = [d.allocate(user=f"u{i}", kind=SessionKind.BATCH) for i in range(2)]
    running(d, *jobs)
    warm = [c for c in d.commands(Launch) if not c.session_id]  # those not made for a session
    assert len(warm) >= 4 and all(c.spot for c in warm)  # every arrival was batch
    t = d.now
    notebooks = [d.allocate(user=f"n{i}") for i in range(4)]
    running(d, *notebooks)
    assert all(not d.vms[s.vm_id].spot for s in notebooks)
    # Half the arrivals now interactive: warm VMs made since are on demand too.
    assert any(not c.spot for c in launches(d, t) if not c.session_id)


def test_a_pool_without_the_tier_makes_no_spot_vm():
    d = Driver(make_core(min_vms=0, headroom_fraction=1.0))
    job = d.allocate(kind=SessionKind.BATCH)
    running(d, job)
    assert not any(c.spot for c in d.commands(Launch)) and not d.vms[job.vm_id].spot


@pytest.mark.parametrize("pool, backend, why", [
    ({"spot_tier": True, "provisioning_model": "spot"}, None, "no on-demand part"),
    ({"spot_tier": True}, {"kind": "gke", "project": "p", "gke_cluster": "g"}, "never some of each"),
])
def test_a_spot_tier_needs_an_on_demand_pool_off_gke(tmp_path, pool, backend, why):
    from conftest import fleet_config

    def edit(cluster: dict) -> None:
        cluster["pools"][0].update(pool)
        if backend:
            cluster["backend"] = backend
            for p in cluster["pools"]:
                p["standby"] = False

    with pytest.raises(ConfigError, match=why):
        fleet_config(tmp_path, edit)


def test_a_vm_s_spot_flag_is_kept_in_its_record_and_an_older_record_is_on_demand():
    from provisioner.model.records import Vm as Record

    spot = vm("s-x", True, IMAGE)
    assert Record.from_dict(spot.to_dict()).spot is True
    older = {k: v for k, v in spot.to_dict().items() if k != "spot"}  # written before the tier
    assert Record.from_dict(older).spot is False


def test_operators_see_which_vms_are_spot():
    from provisioner.api.convert import vm_to_pb
    from provisioner.cli import render_admin

    spot, on_demand = vm_to_pb(vm("s-x", True, IMAGE), [IMAGE], 0.0), vm_to_pb(vm("d-x", False, IMAGE), [IMAGE], 0.0)
    assert spot.spot and not on_demand.spot
    assert render_admin.vm_to_json(spot)["spot"] is True and render_admin.vm_to_json(on_demand)["spot"] is False
    assert "spot:" in render_admin.vm_detail(spot) and "spot:" not in render_admin.vm_detail(on_demand)
