"""The warm pool's image mix follows demand: with users pinned to many image versions, almost
every session still starts on a warm VM that already holds its exact image.

Deterministic, in virtual time: the real core, with the cloud played by the test driver.
"""

from __future__ import annotations

import random

import pytest

from core_driver import Driver, make_core
from provisioner.decide.commands import Pull
from provisioner.decide.events import PrewarmRequested
from provisioner.model.records import SessionKind, StartKind

HOUR = 3600.0


def zipf_workload(seed: int, hours: float, per_hour: float, versions: list[str]) -> list[tuple]:
    """(arrival_s, user, image, duration_s): 45% follow latest, the rest are pinned to a version
    drawn Zipf-like over the last 40 releases, as notebooks stay on the version they were made with."""
    rng = random.Random(seed)
    recent = versions[-40:][::-1]  # newest first: rank 1 is the newest release
    weights = [1 / rank ** 1.1 for rank in range(1, len(recent) + 1)]
    out, t = [], 0.0
    while (t := t + rng.expovariate(per_hour / HOUR)) < hours * HOUR:
        image = "gpu:latest" if rng.random() < 0.45 else rng.choices(recent, weights)[0]
        out.append((t, f"user-{rng.randrange(400)}", image, rng.uniform(10 * 60, 90 * 60)))
    return out


def replay(workload, **pool) -> list[tuple[float, object]]:
    """Runs the workload through a core; returns (arrival, session) pairs."""
    core = make_core(**pool)
    d = Driver(core)
    ends: list[tuple[float, object]] = []
    started = []
    for arrival, user, image, duration in workload:
        for end, s in sorted((e for e in ends if e[0] <= arrival), key=lambda e: e[0]):
            d.advance(end - d.now)
            d.stop(s)
        ends = [e for e in ends if e[0] > arrival]
        d.advance(arrival - d.now)
        s = d.allocate(user, image, SessionKind.BATCH)
        started.append((arrival, s))
        ends.append((arrival + duration, s))
    d.advance(2 * HOUR)
    return started


WARMUP_S = 3 * HOUR  # the pool fills and caches the recent releases


@pytest.fixture(scope="module")
def zipf_runs():
    """Five 14-hour days of ~20 sessions an hour on the shipped gpu-p100 pool (room for the load).

    One run has ~230 sessions after warm-up, so a 95% rate has about 1.4 points of noise per run:
    the rate is measured over all five."""
    versions = list(make_core().catalog.versions())
    runs = []
    for seed in range(1, 6):
        started = replay(zipf_workload(seed, hours=14, per_hour=20, versions=versions), max_vms=60)
        runs.append([s for t, s in started if t >= WARMUP_S])
    return runs


def test_zipf_mix_of_pinned_images_never_waits_for_a_new_vm(zipf_runs):
    for run in zipf_runs:
        assert len(run) > 180
        assert len({s.image for s in run}) >= 20  # the mix really is wide
        # Every session after warm-up finds a warm VM (holding its image or pulling the rest).
        assert {s.start for s in run} <= {StartKind.WARM, StartKind.PARTIAL}
        assert all(s.history[0].state in ("starting", "pulling_image") for s in run)


def test_zipf_mix_of_pinned_images_starts_warm_with_the_exact_image(zipf_runs):
    sessions = [s for run in zipf_runs for s in run]
    exact = sum(1 for s in sessions if s.start is StartKind.WARM)
    assert exact / len(sessions) >= 0.95, f"{exact}/{len(sessions)} exact-image warm starts"


def test_a_session_waits_for_a_prewarm_of_its_own_image_instead_of_pulling_twice():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0), ticking=False)
    vm = d.add_warm("gpu:v150")
    d.send(PrewarmRequested(d.now, "gpu-p100", "gpu:v158", 1))
    assert vm.pulling == "gpu:v158"
    pulls_before = len(d.commands(Pull))
    s = d.allocate(image="gpu:v158")
    assert s.vm_id == vm.id and s.state.value == "pulling_image"
    assert len(d.commands(Pull)) == pulls_before  # no second pull of the same layers
    d.run_until(lambda: s.state.value == "running", limit_s=3600)
    assert s.start is StartKind.PARTIAL


def test_a_session_for_another_image_supersedes_the_prewarm():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0), ticking=False)
    vm = d.add_warm("gpu:v150")
    d.send(PrewarmRequested(d.now, "gpu-p100", "gpu:v158", 1))
    s = d.allocate(image="gpu:v151")
    assert s.vm_id == vm.id and vm.pulling == "gpu:v151"
    assert d.commands(Pull)[-1].image == "gpu:v151"
    d.run_until(lambda: s.state.value == "running", limit_s=3600)
    # The superseded prewarm finished too; its layers are on disk and did not disturb the session.
    d.advance(3600)
    assert vm.cache.has_image("gpu:v158", d.core.catalog) and s.state.value == "running"


if __name__ == "__main__":
    # Prints the exact-image warm-start rate per seed and pooled: python tests/test_warm_mix.py
    catalog_versions = list(make_core().catalog.versions())
    total = exact_total = 0
    for seed in range(1, 6):
        run = [s for t, s in replay(zipf_workload(seed, 14, 20, catalog_versions), max_vms=60) if t >= WARMUP_S]
        exact = sum(1 for s in run if s.start is StartKind.WARM)
        partial = sum(1 for s in run if s.start is StartKind.PARTIAL)
        print(f"seed {seed}: {exact}/{len(run)} exact ({exact / len(run):.1%}), {partial} partial, "
              f"{len(run) - exact - partial} cold", flush=True)
        total, exact_total = total + len(run), exact_total + exact
    print(f"all: {exact_total}/{total} exact-image warm starts ({exact_total / total:.1%})")
